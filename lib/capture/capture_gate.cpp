#include "capture_gate.hpp"

#include "capture_guard.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <array>
#include <new>
#include <vector>

namespace streampool::detail {

CaptureGate& CaptureGate::of(PoolCore& core) {
  if (Gate* gate = core.gate()) return static_cast<CaptureGate&>(*gate);  // only this layer installs
  return static_cast<CaptureGate&>(core.install_gate(std::make_unique<CaptureGate>(core)));
}

const void* CaptureGate::key_of(cudaStream_t stream, const StreamState* state) noexcept {
  return stream == cudaStreamPerThread ? static_cast<const void*>(state)
                                       : static_cast<const void*>(stream);
}

bool CaptureGate::bind_stream(const void* key, CaptureBinding* binding) {
  std::lock_guard<std::mutex> lock(mutex_);
  return by_stream_.emplace(key, binding).second;
}

bool CaptureGate::bind_capture(CaptureId id, CaptureBinding* binding) {
  // A capture attached while already invalidated has no id (CUDA gives none): nothing finds it
  // by one, and it makes no graph. Registered under 0, it was never taken out again (unbind
  // takes out only a real id), and the next attach to an invalidated capture by another
  // CapturePool was refused (found in review, 2026-12-07).
  if (id == 0) return true;
  bool added = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto [it, inserted] = by_capture_.emplace(id, binding);
    if (!inserted && it->second != binding) return false;
    added = inserted;
  }
  // Any stream may join the capture from now on: the pool sends every drop here (joined()).
  if (added) core_.gate_busy_begins();
  return true;
}

void CaptureGate::unbind(const void* key, CaptureId id) noexcept {
  bool removed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    by_stream_.erase(key);
    removed = id != 0 && by_capture_.erase(id) != 0;
  }
  if (removed) core_.gate_busy_ends();
}

CaptureBinding* CaptureGate::by_key(const void* key) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = by_stream_.find(key);
  if (it == by_stream_.end()) return nullptr;
  it->second->ref();  // the capture may end, and the binding go, once the mutex is let go
  return it->second;
}

CaptureBinding* CaptureGate::by_id(CaptureId id) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = by_capture_.find(id);
  if (it == by_capture_.end()) return nullptr;
  it->second->ref();
  return it->second;
}

CaptureBinding* CaptureGate::per_thread_here() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, binding] : by_stream_) {
    const CaptureBinding::Capture capture = binding->capture();
    if (capture.active && capture.stream == cudaStreamPerThread && capture.origin->addressable()) {
      binding->ref();
      return binding;
    }
  }
  return nullptr;
}

Block* CaptureGate::allocate(std::size_t bytes, cudaStream_t stream, const GateStatus& status,
                             Failure& error) noexcept {
  CaptureBinding* binding = by_id(status.id);
  if (binding == nullptr) {
    // Captured without a pool: any block handed out would be baked into a graph the pool knows
    // nothing of, and a device allocation could invalidate the capture. Refuse, touching nothing.
    error = Errc::capture_without_pool;
    return nullptr;
  }
  // The stream's state without asking its id (refused during capture): the capture's own stream,
  // or a stream joined to it, known by its handle (a state registered for the handle alone where
  // the pool has none: a side stream used only in captured work). A per-thread stream that
  // joined has none (capture_mismatch): its handle names another stream in every thread, the
  // capture's own among them when that is a per-thread stream (found in review, 2026-12-06).
  const CaptureBinding::Capture capture = binding->capture();
  const bool own = capture.stream == stream && capture.named_here();
  StreamState* s = own ? capture.origin : core_.registry().handle_state(stream, error);
  if (s == nullptr && !error) error = Errc::capture_mismatch;
  Block* b = nullptr;
  if (s != nullptr) {
    b = binding->allocate(*s, bytes, error);
    if (b != nullptr) {
      s->lock.lock();
      core_.count_allocation(*s, b, bytes);
      s->lock.unlock();
    }
  }
  binding->unref();
  return b;
}

bool CaptureGate::take_drop(Block* block, cudaStream_t stream, UseSpan uses) noexcept {
  // A private piece goes back to its own binding (drop_piece), unless another binding's capture
  // may use it: that one adopts it as it adopts a shared block, and gives it back to its own
  // binding when it goes (found in review, 2026-12-07: given back at once, the piece went to the
  // shared cache with its own binding while the other capture's graph still used it).
  auto* const keeper = static_cast<CaptureBinding*>(block->keeper);
  if (keeper != nullptr && !captures_under_way()) {
    keeper->drop_piece(block, stream, uses);
    return true;
  }
  // A per-thread stream is known by its state: the drop's first use is the buffer's own stream.
  const StreamState* state = uses.empty() ? nullptr : uses.front().state;
  CaptureBinding* binding = by_key(key_of(stream, state));
  if (binding == nullptr && stream == cudaStreamPerThread &&
      (state == nullptr || (state->handle == cudaStreamPerThread && state->addressable() &&
                            !state->current(uses.front().generation)))) {
    // This thread's per-thread stream, released since the buffer was allocated and now captured
    // under a new state: the same stream, so the same capture. Or a raw free on this thread's
    // per-thread stream whose state the pool could not find (CUDA failed to give its status:
    // the model check, seed 9691, 2026-12-06).
    binding = per_thread_here();
  }
  // Where this thread can name the stream (another thread's per-thread stream it cannot), CUDA
  // says whether it is in the capture now.
  const bool nameable =
      stream != cudaStreamPerThread || (state != nullptr && state->addressable());
  // A stream whose capture CUDA could not tell (here or below): every capture under way counts
  // (found in review, 2026-12-07).
  bool unknown = false;
  if (binding != nullptr &&
      (nameable ? !binding->captures(stream, &unknown) : !binding->capture().active)) {
    // Bound, but the stream is not in the capture now: only prepared (the framework route,
    // before its own begin; it may have joined another capture meanwhile, which the rest asks),
    // or the framework has ended the capture and not yet detached, and the drop is ordinary work
    // (found in review, 2026-12-06).
    binding->unref();
    binding = nullptr;
  }
  // Every capture that may use the block, each with the use that is its stream
  // (CaptureBinding::adopt): the one the drop's stream is bound to (above); the one it (or the
  // buffer's own stream) joined, whose work the drop is; the ones bound to the streams
  // record_stream named, whose captured work was told to use it (found in review, 2026-12-05);
  // or else one such a stream joined. All of them: given to one only, the block went back to
  // the pool when that CapturePool went while another capture's graph still used it (found by
  // the model check and in review, 2026-12-06).
  // A drop names few streams: the first eight candidates in place, any more on the heap (noticed
  // in review, 2026-12-07: past eight, the rest were left out, and the block went back to the
  // pool while their graphs still used it). Only where the host has no memory for one more is a
  // candidate left out (its graph then keeps no older adopter). Where CUDA could not tell which
  // capture a stream joined, every capture under way is one.
  struct Candidate {
    CaptureBinding* binding;
    std::size_t captured;  // which use is its capture's stream (0: the drop's own)
  };
  constexpr std::size_t in_place = 8;
  std::array<Candidate, in_place> first{};
  std::vector<Candidate> more;
  std::size_t count = 0;
  const auto found = [&](std::size_t i) -> Candidate& {
    return i < in_place ? first[i] : more[i - in_place];
  };
  const auto add = [&](CaptureBinding* candidate, std::size_t captured) {
    if (candidate == nullptr) return;
    if (candidate == keeper) {  // its own capture's use is drop_piece's to weigh
      candidate->unref();
      return;
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (found(i).binding == candidate) {
        candidate->unref();
        return;
      }
    }
    if (count < in_place) {
      first[count++] = {candidate, captured};
      return;
    }
    try {
      more.push_back({candidate, captured});
      ++count;
    } catch (const std::bad_alloc&) {
      candidate->unref();
    }
  };
  add(binding, 0);
  // (The drop's stream asked again only where no capture it is bound to has it now.)
  add(joined(stream, uses.first(uses.empty() ? 0 : 1), /*ask_stream=*/binding == nullptr,
             &unknown),
      CaptureBinding::no_origin);
  for (std::size_t i = 1; i < uses.size(); ++i) {
    const StreamState* use = uses[i].state;
    if (use == nullptr || !use->current(uses[i].generation)) continue;
    CaptureBinding* bound_use = by_key(key_of(use->handle, use));
    // Bound, but the stream no longer in the capture (the framework ended it and has not
    // detached): ordinary work, as for the drop's stream above (found in review, 2026-12-07).
    if (bound_use != nullptr && use->addressable() &&
        !bound_use->captures(use->handle, &unknown)) {
      bound_use->unref();
      bound_use = nullptr;
    }
    add(bound_use, i);
  }
  // The capture each use's stream joined, every one (joined() stops at the first it finds): asked
  // where other captures were found too (found in review, 2026-12-07: a buffer dropped in one
  // capture, that record_stream named a stream joined to another for, was kept for the first).
  if (captures_under_way()) {
    const bool named_here = names_home(stream, uses);
    for (const RecordedStream& use : uses) {
      add(joined_use(stream, named_here, use, &unknown), CaptureBinding::no_origin);
    }
  }
  if (unknown) {
    // Each binding under way, referenced under the gate's mutex (add may take the host's memory:
    // not under it).
    std::vector<CaptureBinding*> every;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      try {
        every.reserve(by_capture_.size());
        for (const auto& [id, under_way] : by_capture_) {
          under_way->ref();
          every.push_back(under_way);
        }
      } catch (const std::bad_alloc&) {
        // No room for the list (reserve threw before any reference): none of them is added, as
        // a candidate is left out past the host's memory.
      }
    }
    for (CaptureBinding* under_way : every) add(under_way, CaptureBinding::no_origin);
  }
  // The oldest binding under way adopts it; each other one keeps that one until it goes itself
  // (only ever an older one: no two keep each other).
  Candidate* adopter = nullptr;
  CaptureBinding::Capture under_way;  // the adopter's capture, as seen when it was chosen
  for (std::size_t i = 0; i < count; ++i) {
    const CaptureBinding::Capture capture = found(i).binding->capture();
    if (!capture.active) continue;
    if (adopter == nullptr || found(i).binding->serial() < adopter->binding->serial()) {
      adopter = &found(i);
      under_way = capture;
    }
  }
  if (adopter != nullptr) {
    // The others keep the adopter before it adopts: its CapturePool may go on another thread
    // meanwhile, and give its adopted blocks up at once (found in review, 2026-12-07).
    for (std::size_t i = 0; i < count; ++i) {
      if (&found(i) != adopter && found(i).binding->capture().active) {
        // Not kept (host out of memory): the block goes back when the adopter goes, as before.
        static_cast<void>(found(i).binding->keep_binding(adopter->binding));
      }
    }
    adopter->binding->adopt(block, uses, under_way, adopter->captured);
  }
  for (std::size_t i = 0; i < count; ++i) found(i).binding->unref();
  if (adopter == nullptr && keeper != nullptr) keeper->drop_piece(block, stream, uses);
  return adopter != nullptr || keeper != nullptr;
}

CaptureBinding* CaptureGate::capture_of(cudaStream_t handle, bool* unknown) noexcept {
  const GateStatus status = gate_status(core_.device(), handle);
  if (status.error != cudaSuccess) {
    // CUDA cannot tell whether the stream joined a capture: taken as joined to one under way
    // (the model check, 2026-12-06: given back, the block was written by the graph's replay
    // after another stream got it); a drop weighs every one (found in review, 2026-12-07: with
    // one only, the block went back when that one's CapturePool went, while the graph of the
    // capture the stream had joined still read it).
    if (unknown != nullptr) *unknown = true;
    std::lock_guard<std::mutex> lock(mutex_);
    if (by_capture_.empty()) return nullptr;
    CaptureBinding* any = by_capture_.begin()->second;
    any->ref();
    return any;
  }
  return status.status == CaptureStatus::active ? by_id(status.id) : nullptr;
}

bool CaptureGate::names_home(cudaStream_t stream, UseSpan uses) noexcept {
  const StreamState* home = uses.empty() ? nullptr : uses.front().state;
  return stream != cudaStreamPerThread ||
         (home != nullptr && home->handle == cudaStreamPerThread && home->addressable());
}

CaptureBinding* CaptureGate::joined_use(cudaStream_t stream, bool named_here,
                                        const RecordedStream& use, bool* unknown) noexcept {
  const StreamState* state = use.state;
  if (state == nullptr || !state->current(use.generation) || !state->addressable() ||
      (state->handle == stream && named_here)) {
    return nullptr;
  }
  return capture_of(state->handle, unknown);
}

CaptureBinding* CaptureGate::joined(cudaStream_t stream, UseSpan uses, bool ask_stream,
                                    bool* unknown) noexcept {
  if (!captures_under_way()) return nullptr;
  // A stream that waited on an event recorded in a capture is part of it until the capture ends,
  // with no binding of its own: its capture status names the capture. Asked of the drop's
  // stream and of the block's uses, each only where this thread can name it: a per-thread
  // stream's handle names another stream in every other thread, so such a stream is asked only
  // from its own (another thread's per-thread stream that joined a capture is not seen here:
  // docs/design.md, "CapturePool"). Asking the status is allowed during every capture.
  const bool named_here = names_home(stream, uses);
  if (named_here && ask_stream) {
    if (CaptureBinding* binding = capture_of(stream, unknown)) return binding;
  }
  for (const RecordedStream& use : uses) {
    if (CaptureBinding* binding = joined_use(stream, named_here, use, unknown)) return binding;
  }
  return nullptr;
}

StreamState* CaptureGate::bound_state(cudaStream_t stream) noexcept {
  if (CaptureBinding* binding =
          stream == cudaStreamPerThread ? per_thread_here() : by_key(key_of(stream, nullptr))) {
    const CaptureBinding::Capture capture = binding->capture();
    binding->unref();
    if (capture.active && capture.stream == stream) return capture.origin;
  }
  // A stream that joined a capture with a pool: the state registered for its handle, as
  // CaptureGate::allocate finds it (one registered by the handle alone where the pool has none:
  // counted as the capture's own stream, the use was fenced there and not on this stream, whose
  // later work the fence then did not cover; found in review, 2026-12-06).
  if (stream == cudaStreamPerThread) return nullptr;
  CaptureBinding* binding = joined(stream, {});
  if (binding == nullptr) return nullptr;
  const CaptureBinding::Capture capture = binding->capture();
  binding->unref();
  if (!capture.active) return nullptr;
  Failure error;
  return core_.registry().handle_state(stream, error);
}

void CaptureGate::safe_point() noexcept {
  settle_left_captures();
  complete_graph_releases();
  bury_dead_pools();
}

void CaptureGate::closing() noexcept {
  complete_graph_releases_of(&core_);
  bury_dead_pools();
}

}  // namespace streampool::detail
