#include "capture_gate.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

namespace streampool::detail {

CaptureGate& CaptureGate::of(PoolCore& core) {
  if (Gate* gate = core.gate()) return static_cast<CaptureGate&>(*gate);  // only this layer installs
  return static_cast<CaptureGate&>(core.install_gate(std::make_unique<CaptureGate>(core)));
}

bool CaptureGate::bind_stream(cudaStream_t stream, CaptureBinding* binding) {
  std::lock_guard<std::mutex> lock(mutex_);
  return by_stream_.emplace(stream, binding).second;
}

void CaptureGate::bind_capture(CaptureId id, CaptureBinding* binding) {
  std::lock_guard<std::mutex> lock(mutex_);
  by_capture_[id] = binding;
}

void CaptureGate::unbind(cudaStream_t stream, CaptureId id) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  by_stream_.erase(stream);
  if (id != 0) by_capture_.erase(id);
}

CaptureBinding* CaptureGate::by_stream(cudaStream_t stream) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = by_stream_.find(stream);
  return it != by_stream_.end() ? it->second : nullptr;
}

Block* CaptureGate::allocate(std::size_t bytes, cudaStream_t stream, const GateStatus& status,
                             std::error_code& error) noexcept {
  CaptureBinding* binding = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = by_capture_.find(status.id);
    if (it != by_capture_.end()) binding = it->second;
  }
  if (binding == nullptr) {
    // Captured without a pool: any block handed out would be baked into a graph the pool knows
    // nothing of, and a device allocation could invalidate the capture. Refuse, touching nothing.
    error = make_error_code(Errc::capture_without_pool);
    return nullptr;
  }
  // The stream's state without asking its id (refused during capture): the capture's own stream,
  // or a stream joined to it that the pool has seen before.
  const CaptureBinding::Capture capture = binding->capture();
  StreamState* s = capture.stream == stream ? capture.origin : core_.registry().by_handle(stream);
  if (s == nullptr) {
    error = make_error_code(Errc::capture_mismatch);
    return nullptr;
  }
  Block* b = binding->allocate(*s, bytes, error);
  if (b == nullptr) return nullptr;
  s->lock.lock();
  core_.count_allocation(*s, b, bytes);
  s->lock.unlock();
  return b;
}

bool CaptureGate::take_drop(Block* block, cudaStream_t stream,
                            UseSpan uses) noexcept {
  if (block->keeper != nullptr) {
    static_cast<CaptureBinding*>(block->keeper)->drop_piece(block, stream, uses);
    return true;
  }
  CaptureBinding* binding = by_stream(stream);
  if (binding == nullptr || !binding->capture().active) return false;
  binding->adopt(block, uses);
  return true;
}

StreamState* CaptureGate::bound_state(cudaStream_t stream) noexcept {
  CaptureBinding* binding = by_stream(stream);
  if (binding == nullptr) return nullptr;
  const CaptureBinding::Capture capture = binding->capture();
  return capture.active && capture.stream == stream ? capture.origin : nullptr;
}

void CaptureGate::safe_point() noexcept {
  complete_graph_releases();
  bury_dead_pools();
}

void CaptureGate::closing() noexcept {
  complete_graph_releases_of(&core_);
  bury_dead_pools();
}

}  // namespace streampool::detail
