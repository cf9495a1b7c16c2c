// CapturePool, CapturedGraph, and the capture calls.
#include "capture_binding.hpp"
#include "capture_gate.hpp"
#include "capture_guard.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace streampool {
namespace {

// Releases that graphs handed over: a CUDA user object's destructor runs on a thread of CUDA's
// and must not call CUDA, but dropping a CapturePool drops buffers (fences) and may free device
// memory. So the destructor only queues its reference here, and the queued references are dropped
// at a safe point. Each reference keeps its CapturePool, and so its pool's core, alive: a release
// always runs against its own pool.
//
// Graph handles whose destruction CUDA refused wait here too, to be destroyed again at the next
// safe point: a graph (or executable graph) left alive keeps the user object that keeps its
// CapturePool, and the CapturePool's private memory, for good. Each keeps its pool's core, and so
// its device, alive (PoolCore::keep) until it is destroyed.
struct Undestroyed {
  detail::PoolCore* core;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaUserObject_t object = nullptr;  // a reference of ours to release
};
struct Deferred {
  std::mutex mutex;
  std::vector<std::shared_ptr<CapturePool>*> queue;
  std::vector<Undestroyed> undestroyed;
  std::atomic<bool> pending{false};
};
Deferred& deferred() {
  static Deferred* instance = new Deferred;  // never destroyed: CUDA may call in at exit
  return *instance;
}

void CUDART_CB release_from_graph(void* ref) {
  Deferred& d = deferred();
  std::lock_guard<std::mutex> lock(d.mutex);
  try {
    d.queue.push_back(static_cast<std::shared_ptr<CapturePool>*>(ref));
  } catch (const std::bad_alloc&) {
    return;  // the pool leaks rather than being destroyed here
  }
  d.pending.store(true, std::memory_order_release);
}

// Destroys the handle `u` names (one of them); when CUDA refuses, queues it to be destroyed
// again at the next safe point (complete_graph_releases_of).
void destroy_or_defer(const Undestroyed& u) noexcept {
  Device& device = u.core->device();
  cudaError_t status = cudaSuccess;
  if (u.graph != nullptr) status = device.graph_destroy(u.graph);
  if (u.exec != nullptr) status = device.graph_exec_destroy(u.exec);
  if (u.object != nullptr) status = device.user_object_release(u.object);
  if (status == cudaSuccess) return;
  Deferred& d = deferred();
  std::lock_guard<std::mutex> lock(d.mutex);
  try {
    d.undestroyed.push_back(u);
  } catch (const std::bad_alloc&) {
    return;  // leaked: nothing else can destroy it
  }
  u.core->keep();  // its device must outlive the handle
  d.pending.store(true, std::memory_order_release);
}
void destroy_graph(detail::PoolCore& core, cudaGraph_t graph) noexcept {
  if (graph != nullptr) destroy_or_defer({&core, graph, nullptr, nullptr});
}

// How many ends a capture that must end gets: a failed end may leave the stream capturing (CUDA
// documents none that does, but the fake's faults do), and another end may end it.
constexpr int end_attempts = 4;

// Ends the capture on `stream` until CUDA reports the stream out of capture, discarding what it
// captured; at most `attempts` ends. False when the stream may still be capturing (every end
// failed, or its status could not be asked after any of them).
bool leave_capture(detail::PoolCore& core, cudaStream_t stream, int attempts) noexcept {
  Device& device = core.device();
  for (int attempt = 0; attempt < attempts; ++attempt) {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = device.end_capture(stream, &graph);
    if (graph != nullptr) destroy_graph(core, graph);
    const detail::GateStatus now = detail::capture_now(device, stream);
    // Ended, or the end succeeded though the status cannot be asked.
    if (now.ordinary() || (now.error != cudaSuccess && ended == cudaSuccess)) return true;
  }
  return false;
}

// Unbinds the binding's capture from its stream and from the gate. `over`: the capture is over
// (ended, or its stream let go); else it is left under way (note_capture_left): a per-thread
// stream's to its thread, an explicit stream's to whichever thread sees it end.
void unbind(detail::CaptureBinding& binding, bool over = true) noexcept {
  const detail::CaptureBinding::Capture capture = binding.capture();
  if (!capture.active) return;
  detail::PoolCore& core = binding.core();
  capture.origin->attention.fetch_and(~detail::gated, std::memory_order_release);
  detail::CaptureGate::of(core).unbind(
      detail::CaptureGate::key_of(capture.stream, capture.origin), capture.id);
  if (over) {
    detail::note_capture_end(capture.mode, capture.thread, capture.note);
  } else {
    detail::note_capture_left(capture.mode, capture.thread, capture.token, core.shared_device(),
                              capture.stream, capture.id, capture.note);
  }
  binding.end_capture();
  binding.unref();  // the capture's reference
  detail::bury_dead_pools();  // pools whose destruction the capture deferred
}

// A safe point of the capture layer: no lock held, no capture of ours restricting this thread.
void safe_point() noexcept {
  detail::settle_left_captures();
  complete_graph_releases();
  detail::bury_dead_pools();
}

}  // namespace

namespace detail {

void queue_release(std::shared_ptr<CapturePool>* reference) noexcept {
  release_from_graph(reference);
}

void complete_graph_releases_of(const PoolCore* core) noexcept {
  Deferred& d = deferred();
  // A release may queue others (a CapturePool's binding lets go of the pools it kept): until a
  // round finds none of them.
  while (d.pending.load(std::memory_order_acquire)) {
    // A release drops buffers and runs the owners' destructors given to record_buffer, which may
    // make any call: none while a capture of ours is under way. Checked, not under a permit (a
    // permit never spans the caller's code, gate.hpp): a capture begun on another thread while
    // a release is under way may be refused an owner's call.
    if (!calls_allowed(Restricted::free)) return;
    // First the handles CUDA refused to destroy: destroying one may release a graph's user
    // object, whose reference is queued then (no lock held: the release takes the mutex).
    std::vector<Undestroyed> undestroyed;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      undestroyed.swap(d.undestroyed);
    }
    for (const Undestroyed& u : undestroyed) {
      destroy_or_defer(u);  // queued again, with a reference of its own, if refused again
      u.core->let_go();
    }
    std::vector<std::shared_ptr<CapturePool>*> queue;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      if (core == nullptr) {
        queue.swap(d.queue);
      } else {
        std::erase_if(d.queue, [&](std::shared_ptr<CapturePool>* ref) {
          if (&(*ref)->binding().core() != core) return false;
          try {
            queue.push_back(ref);
            return true;
          } catch (const std::bad_alloc&) {
            return false;
          }
        });
      }
      d.pending.store(!d.queue.empty() || !d.undestroyed.empty(), std::memory_order_release);
    }
    if (queue.empty()) return;  // handles refused again wait for a later safe point
    for (auto* ref : queue) delete ref;
  }
}

}  // namespace detail

void complete_graph_releases() noexcept { detail::complete_graph_releases_of(nullptr); }

// --- CapturePool ----------------------------------------------------------------------------

namespace {

// Gives up a capture prepared and not attached: the stream, the claim and the note go.
void unprepare(detail::CaptureBinding& binding) noexcept {
  const detail::CaptureBinding::Capture capture = binding.capture();
  // Nothing prepared: asked of the state, as the legacy stream's handle is null.
  if (capture.active || capture.origin == nullptr) return;
  detail::CaptureGate::of(binding.core())
      .unbind(detail::CaptureGate::key_of(capture.stream, capture.origin), 0);
  // A framework may have begun the capture since (attach_capture_with_pool not yet called): a
  // per-thread stream's, given up on another thread, is left to its thread as in ~CapturePool;
  // one CUDA says is capturing, to whichever thread sees it end (as in detach).
  // The capture's id, as CUDA gives it: a later capture of a stream that reuses the handle is not
  // this one (found in review, 2026-12-07).
  // Where CUDA cannot tell (the status query fails), it may still capture: left too, with id 0.
  const bool askable = capture.named_here();
  const detail::GateStatus now =
      askable ? detail::capture_now(binding.core().device(), capture.stream) : detail::GateStatus{};
  if (!askable || now.restricting()) {
    detail::note_capture_left(capture.mode, capture.thread, capture.token,
                              binding.core().shared_device(), capture.stream, now.id,
                              capture.note);
  } else {
    detail::note_capture_end(capture.mode, capture.thread, capture.note);
  }
  binding.end_capture();  // nothing was dropped in it: only the claim and the record go
}

// The gate first: a binding holds the core (keep) from its construction, and a constructor that
// throws after it never runs the destructor that lets the core go (the pool and its memory would
// never be freed).
detail::CaptureBinding* gated_binding(detail::PoolCore& core) {
  detail::CaptureGate::of(core);
  return new detail::CaptureBinding(core);
}

}  // namespace

CapturePool::CapturePool(MemoryPool& source)
    : source_(source), binding_(gated_binding(source.core())) {
  safe_point();
}

CapturePool::~CapturePool() {
  const detail::CaptureBinding::Capture capture = binding_->capture();
  if (capture.active) {
    // Abandoned mid-capture: end it (discarding the graph) so the stream leaves capture. Only
    // this thread can: another thread's cudaStreamPerThread names a stream of its own, perhaps
    // capturing for another pool (found in review, 2026-12-05; the thread is told by its token,
    // since glibc gives an exited thread's std::thread::id to the next). And only this capture,
    // so the stream's is asked first (up to end_attempts times): ours while active with its id;
    // where the stream captures nothing, or another active capture (the caller ended ours, never
    // detached, and began another, for another pool), ours is over and nothing is ended. A
    // capture bound with no id (attached already invalidated: CUDA gives none) cannot be active
    // again, so any active capture is another's; an invalidated one cannot be told apart (no id)
    // and is ended, ours being the likelier (docs/design.md). A capture not ended here (another
    // thread's, every end refused, or CUDA never tells) is left under way, still counted
    // (capture_guard.hpp), until a thread sees it over. (Found in review, 2026-12-07: counted
    // over, a capture let another thread's trim synchronize the device; and the drop ended
    // another pool's capture, also after one refused query.)
    bool over = false;
    if (capture.named_here()) {
      Device& device = binding_->core().device();
      detail::GateStatus now = detail::capture_now(device, capture.stream);
      for (int asked = 1; asked < end_attempts && now.error != cudaSuccess; ++asked) {
        now = detail::capture_now(device, capture.stream);
      }
      const bool ours_active = capture.id != 0 && now.active(capture.id);
      const bool ours_gone = now.ordinary() || (now.active() && !ours_active);
      if (now.error == cudaSuccess) {
        over = ours_gone || leave_capture(binding_->core(), capture.stream, end_attempts) ||
               !detail::capture_now(device, capture.stream).restricting(capture.id);
      }
    }
    unbind(*binding_, over);
  } else {
    unprepare(*binding_);  // prepared and never attached (or nothing prepared: nothing to do)
  }
  clear_buffers();
  binding_->unhold();  // no graph made with it is left (the binding may outlive it)
  binding_->unref();
}

void CapturePool::seal() noexcept { binding_->sealed.store(true, std::memory_order_release); }
void CapturePool::unseal() noexcept { binding_->sealed.store(false, std::memory_order_release); }
bool CapturePool::is_capture_pool_sealed() const noexcept {
  return binding_->sealed.load(std::memory_order_acquire);
}

void CapturePool::reserve(std::size_t bytes) {
  if (bytes == 0) return;
  detail::Failure error;
  binding_->reserve(bytes, error);
  if (error == Errc::out_of_memory) {
    throw detail::error_of(
        error, "CapturePool::reserve: " + binding_->core().out_of_memory_message(bytes, nullptr));
  }
  if (error) {
    throw detail::error_of(error, "CapturePool::reserve of " + std::to_string(bytes) + " bytes");
  }
}

std::size_t CapturePool::reserved_bytes() const { return binding_->reserved_bytes(); }
std::size_t CapturePool::free_bytes() const { return binding_->free_bytes(); }

std::size_t CapturePool::buffer_count() const {
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  return buffers_.size();
}

void CapturePool::clear_buffers() noexcept {
  std::vector<std::unique_ptr<HolderBase>> buffers;
  {
    std::lock_guard<std::mutex> lock(buffers_mutex_);
    buffers.swap(buffers_);
  }
  for (auto& buffer : buffers) buffer.reset();  // in registration order
}

// --- capture ------------------------------------------------------------------------------

CaptureNotice::CaptureNotice(CaptureMode mode, std::thread::id thread)
    : mode_(mode), thread_(thread) {
  detail::note_capture_begin(mode_, thread_);
}

CaptureNotice::~CaptureNotice() { detail::note_capture_end(mode_, thread_); }

namespace {

// prepare_capture_with_pool's work, and attach_capture_with_pool's; each error names `entry`, the
// function the caller called (begin_capture_with_pool calls both).
void prepare(const std::shared_ptr<CapturePool>& pool, cudaStream_t stream, CaptureMode mode,
             const char* entry) {
  if (pool == nullptr) throw Error(Errc::invalid_value, std::string(entry) + ": no pool");
  safe_point();
  detail::CaptureBinding& binding = pool->binding();
  detail::PoolCore& core = binding.core();
  detail::CaptureGate& gate = detail::CaptureGate::of(core);
  Device& device = core.device();
  // Refuse a stream already capturing before asking its id: CUDA would refuse that and
  // invalidate the capture under way.
  CaptureStatus current = CaptureStatus::none;
  throw_on_cuda_error(device.capture_info(stream, &current, nullptr),
                      std::string(entry) + ": cudaStreamGetCaptureInfo");
  if (current != CaptureStatus::none) {
    throw Error(Errc::capture_mismatch,
                std::string(entry) + ": the stream is already captured (with or without a pool)");
  }
  detail::Failure error;
  detail::GateStatus gate_status;
  const detail::StreamRegistry::Found found = core.registry().find(stream, gate_status, error);
  if (found.state == nullptr) {
    throw detail::error_of(error ? error : detail::Failure(Errc::capture_mismatch),
                           std::string(entry) + ": the stream's identity");
  }
  // Before anything is claimed: it may throw (out of memory).
  if (stream == cudaStreamPerThread) detail::watch_capturing_thread();
  if (!binding.claim()) {
    throw Error(Errc::capture_mismatch, std::string(entry) + ": the pool is already capturing");
  }
  const void* key = detail::CaptureGate::key_of(stream, found.state);
  bool bound = false;
  try {
    bound = gate.bind_stream(key, &binding);
  } catch (...) {
    binding.unclaim();
    throw;
  }
  if (!bound) {
    binding.unclaim();
    throw Error(Errc::capture_mismatch,
                std::string(entry) + ": the stream is already captured with a pool");
  }
  // What the stream did before the capture is fenced now: blocks the capture adopts wait for it.
  binding.learn();
  const detail::Need before = core.fence_now(*found.state, found.generation);
  // Known to every thread before CUDA begins it, so that none makes a call it would refuse.
  const std::thread::id thread = std::this_thread::get_id();
  const std::uint64_t token = detail::this_thread_token();
  std::uint64_t note = 0;
  try {
    note = detail::note_capture_begin(mode, thread, stream == cudaStreamPerThread ? token : 0);
  } catch (...) {
    gate.unbind(key, 0);  // as unprepare() would, had the capture been set
    binding.unclaim();
    throw;
  }
  binding.set_capture({false, 0, mode, stream, found.state, thread, before, token, note});
}

bool attach(const std::shared_ptr<CapturePool>& pool, const char* entry) {
  if (pool == nullptr) throw Error(Errc::invalid_value, std::string(entry) + ": no pool");
  detail::CaptureBinding& binding = pool->binding();
  detail::CaptureBinding::Capture capture = binding.capture();
  if (capture.active) return true;
  if (capture.origin == nullptr) {  // the legacy stream is a null handle: the state tells
    throw Error(Errc::capture_mismatch, std::string(entry) + ": no capture prepared");
  }
  // On another thread, cudaStreamPerThread names that thread's own stream: only the preparing
  // thread can tell whether the prepared one began (found in review, 2026-12-07: attached from
  // another thread whose own per-thread stream was capturing, the pool bound that capture).
  if (!capture.named_here()) return false;
  detail::PoolCore& core = binding.core();
  CaptureStatus state = CaptureStatus::none;
  CaptureId id = 0;
  throw_on_cuda_error(core.device().capture_info(capture.stream, &state, &id),
                      std::string(entry) + ": cudaStreamGetCaptureInfo");
  if (state == CaptureStatus::none) return false;  // not begun yet
  if (!detail::CaptureGate::of(core).bind_capture(id, &binding)) {
    // The stream joined a capture that another CapturePool of this pool has: that capture's
    // drops and allocations stay the other's (the preparation stays: detach gives it up).
    throw Error(Errc::capture_mismatch,
                std::string(entry) +
                    ": the stream is part of a capture that another CapturePool of the same "
                    "MemoryPool is bound to");
  }
  binding.ref();  // the capture's reference
  capture.active = true;
  capture.id = id;
  binding.set_capture(capture);
  capture.origin->attention.fetch_or(detail::gated, std::memory_order_release);
  return true;
}

}  // namespace

void prepare_capture_with_pool(const std::shared_ptr<CapturePool>& pool, cudaStream_t stream,
                               CaptureMode mode) {
  prepare(pool, stream, mode, "prepare_capture_with_pool");
}

bool attach_capture_with_pool(const std::shared_ptr<CapturePool>& pool) {
  return attach(pool, "attach_capture_with_pool");
}

void detach_capture_with_pool(const std::shared_ptr<CapturePool>& pool) noexcept {
  if (pool == nullptr) return;
  detail::CaptureBinding& binding = pool->binding();
  const detail::CaptureBinding::Capture capture = binding.capture();
  if (!capture.active) {
    unprepare(binding);
    return;
  }
  // Before the caller's end (a framework giving up on its error path) CUDA still captures: the
  // capture stays counted until it is seen ended (noticed in review, 2026-12-07: counted over at
  // once, it let another thread's trim synchronize the device and invalidate it). Another
  // thread's per-thread stream cannot be asked from here: taken as ended, as the caller's order
  // (end, then detach) has it. Where CUDA cannot tell (the status query fails), it may still
  // capture: left too (found in review, 2026-12-07: taken as ended, the detach's own safe point
  // freed a destroyed pool's memory and invalidated the caller's global capture).
  const bool over =
      !capture.named_here() ||
      !detail::capture_now(binding.core().device(), capture.stream).restricting(capture.id);
  unbind(binding, over);
  safe_point();
}

void begin_capture_with_pool(const std::shared_ptr<CapturePool>& pool, cudaStream_t stream,
                             CaptureMode mode) {
  prepare(pool, stream, mode, "begin_capture_with_pool");
  detail::CaptureBinding& binding = pool->binding();
  detail::PoolCore& core = binding.core();
  cudaError_t status = core.device().begin_capture(stream, mode);
  if (status != cudaSuccess) {
    unprepare(binding);
    throw Error(status, "begin_capture_with_pool: cudaStreamBeginCapture");
  }
  try {
    if (!attach(pool, "begin_capture_with_pool")) {
      throw Error(Errc::capture_mismatch,
                  "begin_capture_with_pool: the stream is not capturing after "
                  "cudaStreamBeginCapture");
    }
  } catch (...) {
    if (leave_capture(core, stream, end_attempts)) {
      unprepare(binding);
      throw;
    }
    // CUDA refused every end: the stream is still capturing. It stays prepared with the pool,
    // counted, so that nothing makes a call the capture forbids (found in review, 2026-12-07),
    // as the framework route's prepare leaves it, until detach_capture_with_pool.
    try {
      throw;
    } catch (const Error& e) {
      throw Error(e.errc(), e.cuda_error(),
                  std::string(e.what()) + "; then CUDA refused to end the capture " +
                      std::to_string(end_attempts) +
                      " times: the stream is still capturing, prepared with the pool; end it "
                      "(cudaStreamEndCapture), then call detach_capture_with_pool");
    }  // anything else (out of memory) as it is
  }
}

CapturedGraph end_capture_with_pool(cudaStream_t stream, std::shared_ptr<CapturePool> pool) {
  if (pool == nullptr) throw Error(Errc::invalid_value, "end_capture_with_pool: no pool");
  detail::CaptureBinding& binding = pool->binding();
  const detail::CaptureBinding::Capture capture = binding.capture();
  // The per-thread default stream is another stream in every other thread: only the thread
  // that began the capture names its stream.
  if (!capture.active || capture.stream != stream || !capture.named_here()) {
    throw Error(Errc::capture_mismatch,
                "end_capture_with_pool: the stream is not being captured with this pool");
  }
  detail::PoolCore& core = binding.core();
  Device& device = core.device();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = device.end_capture(stream, &graph);
  if (ended != cudaSuccess) {
    destroy_graph(core, std::exchange(graph, nullptr));
    // The stream leaves capture whatever CUDA answered: a failed end is followed by others.
    if (!leave_capture(core, stream, end_attempts - 1)) {
      // CUDA refused every one: the stream is still capturing. It stays bound to the pool, so
      // that nothing makes a call the capture forbids, for a later end to end it.
      throw Error(ended,
                  "end_capture_with_pool: cudaStreamEndCapture (refused " +
                      std::to_string(end_attempts) +
                      " times: the stream is still capturing, bound to the pool; end it again)");
    }
  }
  unbind(binding);
  safe_point();
  if (ended != cudaSuccess) throw Error(ended, "end_capture_with_pool: cudaStreamEndCapture");

  // The graph keeps the pool alive by itself, through a user object it retains.
  std::shared_ptr<CapturePool>* ref = nullptr;
  try {
    ref = new std::shared_ptr<CapturePool>(pool);
  } catch (const std::bad_alloc&) {
    destroy_graph(core, graph);
    throw;
  }
  cudaUserObject_t object = nullptr;
  cudaError_t status = device.user_object_create(&object, ref, release_from_graph);
  if (status != cudaSuccess) {
    delete ref;
    destroy_graph(core, graph);
    throw Error(status, "end_capture_with_pool: cudaUserObjectCreate");
  }
  status = device.graph_retain_user_object(graph, object);
  if (status != cudaSuccess) {
    destroy_or_defer({&core, nullptr, nullptr, object});  // queues the reference
    destroy_graph(core, graph);
    complete_graph_releases();
    throw Error(status, "end_capture_with_pool: cudaGraphRetainUserObject");
  }
  cudaGraphExec_t exec = nullptr;
  status = device.graph_instantiate(&exec, graph);
  destroy_graph(core, graph);  // the executable graph holds its own reference to the object
  if (status != cudaSuccess) {
    complete_graph_releases();
    throw Error(status, "end_capture_with_pool: cudaGraphInstantiate");
  }
  return CapturedGraph(&device, exec, std::move(pool));
}

// --- CapturedGraph ------------------------------------------------------------------------

CapturedGraph::CapturedGraph(CapturedGraph&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      exec_(std::exchange(other.exec_, nullptr)),
      pool_(std::move(other.pool_)),
      replays_(std::exchange(other.replays_, 0)) {}

CapturedGraph& CapturedGraph::operator=(CapturedGraph&& other) noexcept {
  if (this != &other) {
    destroy();
    device_ = std::exchange(other.device_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
    pool_ = std::move(other.pool_);
    replays_ = std::exchange(other.replays_, 0);
  }
  return *this;
}

CapturedGraph::~CapturedGraph() { destroy(); }

void CapturedGraph::destroy() noexcept {
  if (exec_ != nullptr) {
    // Refused, it is destroyed again at the next safe point: it holds the pool's memory.
    if (pool_ != nullptr) {
      destroy_or_defer({&pool_->binding().core(), nullptr, std::exchange(exec_, nullptr), nullptr});
    } else {
      device_->graph_exec_destroy(std::exchange(exec_, nullptr));
    }
  }
  pool_.reset();
  safe_point();
}

void CapturedGraph::launch(cudaStream_t stream) {
  if (exec_ == nullptr) throw Error(Errc::invalid_value, "CapturedGraph::launch: no graph");
  safe_point();
  // Launched into a capture, the graph's work (and its memory) becomes part of the graph being
  // captured, which CUDA does not make hold this graph's user objects: the CapturePool bound to
  // that capture keeps this graph's pool alive instead.
  if (pool_ != nullptr) {
    CaptureStatus status = CaptureStatus::none;
    CaptureId id = 0;
    throw_on_cuda_error(device_->capture_info(stream, &status, &id),
                        "CapturedGraph::launch: cudaStreamGetCaptureInfo");
    if (status == CaptureStatus::active) {
      detail::CaptureBinding* outer =
          detail::CaptureGate::of(pool_->binding().core()).binding_of(id);
      if (outer == nullptr) {
        throw Error(Errc::capture_without_pool,
                    "CapturedGraph::launch: into a capture no CapturePool of its MemoryPool is "
                    "bound to; nothing would keep its memory for the graph being captured");
      }
      const struct Unref {
        detail::CaptureBinding* binding;
        ~Unref() { binding->unref(); }
      } referenced{outer};
      // Not into a capture of its own CapturePool: that capture hands out the memory this
      // graph's own buffers freed in its capture (graphs of one pool run one after another), so
      // a buffer live across the launch could be the memory the replay writes (found in review,
      // 2026-12-07).
      if (outer == &pool_->binding()) {
        throw Error(Errc::capture_mismatch,
                    "CapturedGraph::launch: into a capture of its own CapturePool, whose buffers "
                    "may lie in this graph's memory; capture with another CapturePool");
      }
      outer->keep_alive(pool_);
    }
  }
  throw_on_cuda_error(device_->graph_launch(exec_, stream),
                      "CapturedGraph::launch: cudaGraphLaunch");
  ++replays_;
}

void CapturedGraph::upload(cudaStream_t stream) {
  if (exec_ == nullptr) throw Error(Errc::invalid_value, "CapturedGraph::upload: no graph");
  safe_point();
  throw_on_cuda_error(device_->graph_upload(exec_, stream),
                      "CapturedGraph::upload: cudaGraphUpload");
}

cudaGraphExec_t CapturedGraph::release() noexcept {
  pool_.reset();
  return std::exchange(exec_, nullptr);
}

}  // namespace streampool
