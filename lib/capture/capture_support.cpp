// The pool's side of the capture layer: private ranges for CapturePools, and the map from
// capture ids to the CapturePool bound to each capture.
#include "capture_binding.hpp"

#include <streampool/error.hpp>

namespace streampool::detail {

Block* PoolCore::take_private(std::size_t bytes, std::error_code& error) noexcept {
  const std::size_t rounded = arena_size(bytes, error);
  if (rounded == 0) return nullptr;
  const auto attempt = [&]() -> Block* {
    std::lock_guard<std::mutex> arena(arena_mutex_);
    return arena_take(nullptr, rounded, error);
  };
  Block* range = with_reclaim(attempt, error);
  if (range == nullptr) return nullptr;
  private_state_->lock.lock();
  count_allocation(*private_state_, range, range->size);
  private_state_->lock.unlock();
  return range;
}

void PoolCore::return_private(Block* range) noexcept {
  private_state_->lock.lock();
  const bool orphaned = count_release(*private_state_, range);
  private_state_->lock.unlock();
  {
    std::lock_guard<std::mutex> arena(arena_mutex_);
    range->state = nullptr;
    arena_free(range);
  }
  if (orphaned) orphan_release();
}

void PoolCore::bind_capture(CaptureId id, CaptureBinding* binding) {
  std::lock_guard<std::mutex> lock(capture_mutex_);
  captures_[id] = binding;
}

void PoolCore::unbind_capture(CaptureId id) noexcept {
  std::lock_guard<std::mutex> lock(capture_mutex_);
  captures_.erase(id);
}

}  // namespace streampool::detail
