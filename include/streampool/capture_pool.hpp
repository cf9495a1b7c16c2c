// CapturePool and CapturedGraph: buffers that live exactly as long as the CUDA graphs that use
// them.
//
// A captured graph bakes device addresses into its nodes: every replay reads and writes the same
// memory, which must stay allocated, and out of everyone else's hands, for as long as any graph
// that uses it can still be launched. The lifetime rules:
//
//   - A CapturePool is shared (std::shared_ptr). Its owners: the caller's handles, each
//     CapturedGraph made with it, and each CUDA graph made with it (through a user object the
//     graph retains, so that a cudaGraphExec_t that outlives its CapturedGraph wrapper can never
//     replay into freed memory).
//   - During a capture begun with begin_capture_with_pool, allocations (through the MemoryPool the
//     CapturePool was made from) on the captured stream, or on streams joined to the capture,
//     come from the CapturePool's private memory and stay pinned to it: never recycled to the
//     shared cache while the pool lives. A drop during the capture returns the memory to the
//     pool's private lists, reusable later in the same capture on the same stream (stream order
//     makes that safe). A buffer of the shared cache dropped during the capture on the captured
//     stream or on a stream joined to it (one that waited on an event recorded in the capture),
//     or on another stream after record_stream named one of those, is adopted by the pool: the
//     graph may use it. Not seen: another thread's per-thread stream joined to the capture; and
//     a per-thread stream joined to it cannot allocate from the CapturePool (capture_mismatch).
//     So is a buffer of another CapturePool's private memory dropped there: it goes back to that
//     CapturePool once this one has gone. A buffer that the captures of several CapturePools may
//     use is kept until all of them have gone. Only the CapturePool's own MemoryPool adopts: a
//     buffer of another MemoryPool that a graph uses goes back to its pool when dropped, so hand
//     it to record_buffer instead.
//   - No call that CUDA refuses during the capture's mode is made by the pool, on any thread: a
//     begin waits for such calls that other threads decided on before it (docs/design.md,
//     "CapturePool"). Not the calls of owners' destructors given to record_buffer, which a
//     graph's release runs: they are not begun while a capture is under way, but one already
//     running when another thread begins a capture is not waited for.
//     The pool grows during the capture as needed where the MemoryPool can: in
//     every mode by mapping into the addresses its expandable segments hold reserved (from the
//     first growth until a trim gives an empty reservation back; the mapping calls are allowed
//     in every mode), and by cudaMalloc where CUDA allows it (relaxed mode). Otherwise (fixed
//     segments, or no reservation when the capture begins) reserve(bytes) sets memory aside
//     before; past what it can get, an allocation during capture fails with
//     Errc::capture_pool_exhausted.
//   - When the last reference goes, every registered buffer is dropped in registration order, then
//     the private memory goes back to the MemoryPool. CUDA forbids CUDA calls in a user object's
//     destructor, so a release that comes from a graph is only queued there; the library
//     completes it at its next safe point: any capture or graph call, MemoryPool::trim, the
//     MemoryPool's destruction (for its own CapturePools), or complete_graph_releases() - never
//     inside an allocation, and not while a capture is under way. A release that arrives after
//     its MemoryPool is gone (the graph's last replay completed later) waits for the next safe
//     point anywhere in the program; the pool's memory stays reserved until then.
//   - Graphs that share a CapturePool share its private memory: replay them in stream order
//     (one after another on one stream, or ordered by events), never concurrently.
//
//     auto pool = std::make_shared<streampool::CapturePool>(memory_pool);
//     auto a = streampool::PooledBuffer<float>::alloc_async(memory_pool, 1024, stream);
//     auto b = streampool::PooledBuffer<float>::alloc_async(memory_pool, 1024, stream);
//     float* pa = a.data();
//     float* pb = b.data();
//     pool->record_buffer(std::move(a));  // the pool now keeps both alive
//     pool->record_buffer(std::move(b));
//     pool->seal();
//     streampool::begin_capture_with_pool(pool, stream);
//     my_kernel<<<grid, block, 0, stream>>>(pa, pb);  // captured, not run
//     auto graph = streampool::end_capture_with_pool(stream, pool);
//     pool.reset();  // safe: the graph holds its own reference
//     graph.launch(stream);
//
// (examples/capture_pool.cu compiles and runs this.)
#pragma once

#include <streampool/device.hpp>
#include <streampool/export.hpp>
#include <streampool/memory_pool.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace streampool {

namespace detail {
class CaptureBinding;
}

class STREAMPOOL_API CapturePool {
 public:
  explicit CapturePool(MemoryPool& source);
  // Drops the registered buffers in registration order, then returns the private memory. If a
  // capture with this pool is still under way, ends it and discards what it captured (should CUDA
  // refuse every end, or be unable to tell, the capture stays counted as under way until CUDA
  // reports it ended); where its stream no longer has that capture (the caller ended it and never
  // detached), nothing is ended, not even a later active capture of the stream (an invalidated
  // one carries no id, and is ended: docs/design.md); one only
  // prepared (prepare_capture_with_pool, not attached) is given up, as detach does. A capture of
  // cudaStreamPerThread ends only on its own thread: where the last reference goes on another,
  // the capture is left under way, with no pool bound to it (its allocations through the
  // MemoryPool fail with Errc::capture_without_pool), for its thread to end with
  // cudaStreamEndCapture and discard: the graph would use memory this pool no longer holds.
  // Until that thread, at a safe point of the capture layer (a trim of a pool that has had a
  // CapturePool, a CapturePool made, a capture begun or ended with a pool, a graph call), sees it
  // ended, or exits (CUDA then ends it), the library still counts it as a capture under way and
  // makes no call it would refuse (no device synchronize or free; in global or thread-local mode
  // no cudaMalloc).
  ~CapturePool();
  CapturePool(const CapturePool&) = delete;
  CapturePool& operator=(const CapturePool&) = delete;

  // A sealed pool satisfies no new allocation during capture (Errc::capture_pool_sealed).
  void seal() noexcept;
  void unseal() noexcept;
  bool is_capture_pool_sealed() const noexcept;

  // Sets `bytes` of private memory aside, so that a capture in global or thread-local mode can
  // allocate up to that much. Call it outside capture. Throws Error (out_of_memory, ...).
  void reserve(std::size_t bytes);
  // Private memory held, and how much of it is free.
  std::size_t reserved_bytes() const;
  std::size_t free_bytes() const;

  // Keeps any movable owner of GPU memory (a PooledBuffer, a shared_ptr to one, a user's own
  // type) alive for the pool's lifetime. Returns its registration index.
  template <class B>
  std::size_t record_buffer(B&& buffer) {
    using Held = std::remove_cvref_t<B>;
    static_assert(std::is_move_constructible_v<Held>, "record_buffer needs a movable owner");
    auto holder = std::make_unique<Holder<Held>>(std::forward<B>(buffer));
    std::lock_guard<std::mutex> lock(buffers_mutex_);
    buffers_.push_back(std::move(holder));
    return buffers_.size() - 1;
  }
  std::size_t buffer_count() const;
  // Drops every registered buffer now, in registration order. The pool stays usable.
  void clear_buffers() noexcept;

  MemoryPool& source() const noexcept { return source_; }
  detail::CaptureBinding& binding() const noexcept { return *binding_; }

 private:
  struct HolderBase {
    virtual ~HolderBase() = default;
  };
  template <class B>
  struct Holder final : HolderBase {
    explicit Holder(B&& b) : held(std::move(b)) {}
    explicit Holder(const B& b) : held(b) {}
    B held;
  };

  MemoryPool& source_;
  detail::CaptureBinding* binding_;  // reference-counted: live private blocks hold it too
  mutable std::mutex buffers_mutex_;
  std::vector<std::unique_ptr<HolderBase>> buffers_;
};

// An instantiated graph captured with a CapturePool. Holds its own reference to the pool.
class STREAMPOOL_API CapturedGraph {
 public:
  CapturedGraph() = default;
  CapturedGraph(CapturedGraph&& other) noexcept;
  CapturedGraph& operator=(CapturedGraph&& other) noexcept;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  // Destroys the executable graph (CUDA finishes replays in flight first).
  ~CapturedGraph();

  // Enqueues one replay on `stream`. Throws Error on failure (naming cudaGraphLaunch, CUDA's
  // error kept); the graph stays valid. Into a capture (the replay becomes part of the graph
  // being captured), the capture must be bound to a CapturePool of the same MemoryPool
  // (begin_capture_with_pool or attach_capture_with_pool): that CapturePool keeps this graph's
  // pool alive for as long as it lives itself. Otherwise throws Error(capture_without_pool) and
  // launches nothing. The graph then shares its CapturePool's memory with the graph being
  // captured: replay that one in stream order with the graphs of this graph's CapturePool too.
  // Into a capture of its own CapturePool, which would hand this graph's memory to buffers live
  // across the launch, throws Error(capture_mismatch) and launches nothing. (Two pools each
  // launched into the other's capture keep each other, and their MemoryPool's memory, for good:
  // don't.)
  void launch(cudaStream_t stream);
  // Prepares the graph for launch on `stream` ahead of time. Throws Error as launch does
  // (naming cudaGraphUpload).
  void upload(cudaStream_t stream);
  std::uint64_t replay_count() const noexcept { return replays_; }
  bool valid() const noexcept { return exec_ != nullptr; }
  cudaGraphExec_t exec() const noexcept { return exec_; }
  // Gives up the executable graph without destroying it: the caller destroys it
  // (cudaGraphExecDestroy). The graph itself still keeps the pool alive, but not a graph it is
  // launched into (cudaGraphLaunch into a capture): nothing then keeps the pool for that one, as
  // launch() does: launch it into captures through a CapturedGraph.
  cudaGraphExec_t release() noexcept;
  const std::shared_ptr<CapturePool>& pool() const noexcept { return pool_; }

 private:
  friend CapturedGraph end_capture_with_pool(cudaStream_t, std::shared_ptr<CapturePool>);
  CapturedGraph(Device* device, cudaGraphExec_t exec, std::shared_ptr<CapturePool> pool) noexcept
      : device_(device), exec_(exec), pool_(std::move(pool)) {}
  void destroy() noexcept;

  Device* device_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::shared_ptr<CapturePool> pool_;
  std::uint64_t replays_ = 0;
};

// Starts capturing `stream` with `pool` bound to it. Throws Error: invalid_value for a null pool,
// capture_mismatch if the stream is already bound to a capture, capture_forbids_call when called
// from inside a device call of a pool's (a Device's method), and CUDA's error if the capture
// cannot begin; a capture that began but could not be bound is ended again, as
// end_capture_with_pool ends one that fails. Should CUDA refuse all four ends, the stream stays
// capturing and prepared with `pool` (the error says so): end it, then call
// detach_capture_with_pool(pool).
STREAMPOOL_API void begin_capture_with_pool(const std::shared_ptr<CapturePool>& pool,
                                            cudaStream_t stream,
                                            CaptureMode mode = CaptureMode::global);
// Ends the capture and instantiates the graph. The stream leaves capture whatever CUDA answers
// the end: a failed end is followed by others (discarding what was captured) until CUDA reports
// the stream out of capture. Only if CUDA refuses all of them (four) does the stream stay
// capturing, and then it stays bound to `pool`, as before the call: end it again.
// Throws Error: capture_mismatch when `stream` is not being captured with `pool`,
// capture_invalidated when the capture was invalidated, CUDA's error otherwise.
STREAMPOOL_API CapturedGraph end_capture_with_pool(cudaStream_t stream,
                                                  std::shared_ptr<CapturePool> pool);

// For a framework that begins and ends captures itself (PyTorch's CUDAGraph tells its allocator
// before cudaStreamBeginCapture and after cudaStreamEndCapture, and makes both calls itself):
// begin_capture_with_pool in two halves around the caller's cudaStreamBeginCapture, and the
// unbinding that end_capture_with_pool does after cudaStreamEndCapture.
//
//     streampool::prepare_capture_with_pool(pool, stream, mode);  // before the capture begins
//     cudaStreamBeginCapture(stream, mode);                        // the framework's own call
//     streampool::attach_capture_with_pool(pool);  // before the capture's first allocation or drop
//     ...                                          // allocations on `stream` come from `pool`
//     cudaStreamEndCapture(stream, &graph);        // the framework's own call
//     streampool::detach_capture_with_pool(pool);
//
// prepare throws as begin_capture_with_pool does before it begins the capture, and waits, as it
// does, for the calls other threads decided on before it; from then on, no thread makes a call
// that a capture of `mode` refuses. attach binds the capture's id: true once it is bound, false while `stream` is not capturing yet (and,
// for cudaStreamPerThread, on any thread but the one that prepared it, where that handle names
// another stream); it throws capture_mismatch when nothing was prepared or when `stream` has joined
// a capture that another CapturePool of the same MemoryPool is bound to (the preparation stays
// until detach), and CUDA's error when the status cannot be asked. `stream` must be the stream the
// framework began the capture on: one that only joined a capture (begun without a pool, or by
// another MemoryPool's CapturePool) is taken as capturing, and ending or abandoning the capture
// through it makes CUDA invalidate the capture (an end on a joined stream is refused). An
// allocation or drop during the capture before attach is not the pool's (it fails with
// capture_without_pool, or goes to the shared cache). detach unbinds the stream (after the end, or
// to give up a prepared capture) and never throws; called while the stream still captures (a caller
// giving up before its own end), it unbinds too, and no thread makes a call the capture would
// refuse until CUDA reports it ended (the caller still ends it). Of cudaStreamPerThread only its
// own thread can ask CUDA: detached there before the end, the capture stays counted until that
// thread, at a safe point of the capture layer (as for ~CapturePool) or at a call the count
// refuses, sees it ended (or exits); detached on another thread, an attached capture is taken as
// ended (the order end, then detach, is the caller's: a detach there before the end lets other
// threads synchronize during the capture, which CUDA then invalidates), and one only prepared is
// left to the preparing thread likewise. An invalidated capture counts as under way until it ends
// (CUDA refuses the same calls until then). Any thread may ask CUDA the status of an explicit
// stream whose capture is counted this way, at its safe points (CUDA's status query of a destroyed
// stream's handle crashed the process on an H100): before destroying a stream on which a capture
// with a pool was given up before its end (a detach or a drop of the CapturePool before the
// caller's end, or a begin whose capture could not be bound), end the capture and call
// release_stream(stream) on the MemoryPool. It returns once the capture is seen ended and no thread
// is still asking about the stream, and throws capture_forbids_call while CUDA has not said it
// ended. Likewise, detach (or drop the CapturePool) before destroying the stream of a capture it
// was prepared or bound to. The graph is the caller's: nothing ties the pool's lifetime to it, so
// the caller keeps the CapturePool until the graph's last replay has completed.
STREAMPOOL_API void prepare_capture_with_pool(const std::shared_ptr<CapturePool>& pool,
                                              cudaStream_t stream,
                                              CaptureMode mode = CaptureMode::global);
STREAMPOOL_API bool attach_capture_with_pool(const std::shared_ptr<CapturePool>& pool);
STREAMPOOL_API void detach_capture_with_pool(const std::shared_ptr<CapturePool>& pool) noexcept;

// A capture the library did not begin and is not bound to, for as long as this object lives: no
// thread makes a call that a capture of `mode` would refuse, as during one begun with
// begin_capture_with_pool (the pool then does without those calls: an allocation that would need
// one fails with Errc::capture_forbids_call, or its reclaim skips that step). For a framework that
// begins captures itself and lets the pool allocate for them on a stream that is not captured
// (streampool_torch's route 2 does, while PyTorch's cache asks it for a segment during a capture);
// `thread` is the thread whose calls a thread-local capture restricts. The constructor, as a
// begin, waits for the calls of the pool's that other threads decided on before it and that the
// mode refuses (a device synchronize of a trim among them; of a thread-local capture, only those
// every capture refuses: its own thread's calls end before it begins): made before the
// framework's cudaStreamBeginCapture, no such call is made during the capture; made after it,
// calls already decided may still be. It throws std::bad_alloc where host memory has run out, and
// Error(capture_forbids_call) when made inside a device call of a pool's (nothing is then
// counted).
class STREAMPOOL_API CaptureNotice {
 public:
  explicit CaptureNotice(CaptureMode mode, std::thread::id thread = std::this_thread::get_id());
  ~CaptureNotice();
  CaptureNotice(const CaptureNotice&) = delete;
  CaptureNotice& operator=(const CaptureNotice&) = delete;

 private:
  CaptureMode mode_;
  std::thread::id thread_;
};

// Completes releases that graphs handed to the library (see the lifetime rules above). The
// library calls it at its own safe points; call it to have them sooner, or after the last
// MemoryPool of the program is gone while graphs of it were still replaying.
STREAMPOOL_API void complete_graph_releases() noexcept;

}  // namespace streampool
