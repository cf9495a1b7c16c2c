// CaptureGate: the capture layer's side of the pool's gate (lib/pool/gate.hpp), one per pool.
//
// It knows which captures and streams are bound to which CapturePool (through its binding):
// an allocation during a capture looks the capture id up, a drop on a bound stream finds the
// binding by the stream's handle (a handle being captured is alive, so it names one stream).
#pragma once

#include "capture_binding.hpp"

#include "../pool/gate.hpp"
#include "../pool/pool_core.hpp"

#include <mutex>
#include <unordered_map>

namespace streampool::detail {

class CaptureGate final : public Gate {
 public:
  explicit CaptureGate(PoolCore& core) noexcept : core_(core) {}

  // The pool's gate, installed on first use.
  static CaptureGate& of(PoolCore& core);

  // What a bound stream is known by: its handle, or for cudaStreamPerThread (one handle naming a
  // different stream in every thread) its state.
  static const void* key_of(cudaStream_t stream, const StreamState* state) noexcept;

  // Binds the stream (false: another binding has it) and, once the capture has begun, its id
  // (false: another binding has the capture, which the stream joined; id 0, an invalidated
  // capture's, is not bound).
  bool bind_stream(const void* key, CaptureBinding* binding);
  bool bind_capture(CaptureId id, CaptureBinding* binding);
  void unbind(const void* key, CaptureId id) noexcept;
  // The binding of a capture under way (referenced: the caller unrefs), or null.
  CaptureBinding* binding_of(CaptureId id) noexcept { return by_id(id); }

  Block* allocate(std::size_t bytes, cudaStream_t stream, const GateStatus& status,
                  Failure& error) noexcept override;
  bool take_drop(Block* block, cudaStream_t stream,
                 UseSpan uses) noexcept override;
  StreamState* bound_state(cudaStream_t stream) noexcept override;
  void safe_point() noexcept override;
  void closing() noexcept override;

 private:
  // The binding for a key or a capture id, with a reference the caller drops (unref), or null.
  CaptureBinding* by_key(const void* key) noexcept;
  CaptureBinding* by_id(CaptureId id) noexcept;
  // This thread's per-thread stream's binding (referenced), or null.
  CaptureBinding* per_thread_here() noexcept;
  // Whether any capture is bound now (a binding's capture under way).
  bool captures_under_way() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return !by_capture_.empty();
  }
  // The binding of a capture that the drop's stream (unless !ask_stream: asked already), or a
  // stream of `uses`, joined (referenced), or null. `unknown` (if given) is set where CUDA could
  // not tell of a stream asked (capture_of).
  CaptureBinding* joined(cudaStream_t stream, UseSpan uses, bool ask_stream = true,
                         bool* unknown = nullptr) noexcept;
  // The binding of the capture `handle`'s stream is in now, asked of CUDA (referenced), or null.
  // Where CUDA cannot tell: one under way (the first of the map's order), and `unknown` (if given)
  // set, for a caller that must weigh every capture under way (take_drop).
  CaptureBinding* capture_of(cudaStream_t handle, bool* unknown = nullptr) noexcept;
  // Whether this thread names the block's own stream (uses' first) by `stream`, the drop's.
  static bool names_home(cudaStream_t stream, UseSpan uses) noexcept;
  // The capture `use`'s stream joined (referenced), where this thread can name that stream and
  // it is not the drop's own as named here (`named_here`: names_home), or null.
  CaptureBinding* joined_use(cudaStream_t stream, bool named_here, const RecordedStream& use,
                             bool* unknown) noexcept;

  PoolCore& core_;
  std::mutex mutex_;
  std::unordered_map<CaptureId, CaptureBinding*> by_capture_;
  std::unordered_map<const void*, CaptureBinding*> by_stream_;
};

// Graph releases queued by CUDA user objects (see capture_pool.cpp), completed for one pool's
// CapturePools only, or for all.
void complete_graph_releases_of(const PoolCore* core) noexcept;
// Queues a reference to a CapturePool (heap-allocated, taken over) to be dropped at the next
// safe point, as a graph's release is.
void queue_release(std::shared_ptr<CapturePool>* reference) noexcept;

}  // namespace streampool::detail
