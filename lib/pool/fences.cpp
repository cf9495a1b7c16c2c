// Fences: events recorded on a stream after blocks were dropped on it. A fence is what lets a
// block go to another stream; one fence covers every block dropped on its stream before it, so
// by default a fence is recorded only when another stream asks for that stream's blocks.
//
// Indices: a stream's fence_seq counts its fences; a block dropped on it takes the current value
// as its tag and is covered by the fence of that index. `completed` is the number of leading
// fences known complete. A "virtual" fence (a stream or device synchronize) advances both at once.
#include "capture_guard.hpp"
#include "pool_core.hpp"

namespace streampool::detail {

bool PoolCore::unsafe_calls_allowed() const noexcept { return unsafe_calls_allowed_here(); }

cudaEvent_t PoolCore::take_event() noexcept {
  {
    std::lock_guard<std::mutex> lock(event_mutex_);
    if (!idle_events_.empty()) {
      cudaEvent_t event = idle_events_.back();
      idle_events_.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  return device_->event_create(&event) == cudaSuccess ? event : nullptr;
}

void PoolCore::return_event(cudaEvent_t event) noexcept {
  try {
    std::lock_guard<std::mutex> lock(event_mutex_);
    idle_events_.push_back(event);
  } catch (const std::bad_alloc&) {
    device_->event_destroy(event);
  }
}

FenceResult PoolCore::record_fence(StreamState& s) noexcept {
  CaptureStatus status = CaptureStatus::none;
  CaptureId capture = 0;
  if (device_->capture_info(s.handle, &status, &capture) != cudaSuccess ||
      status != CaptureStatus::none) {
    return FenceResult::failed;
  }
  const std::uint64_t index = s.fence_seq.load(std::memory_order_relaxed);
  if (cudaEvent_t event = take_event(); event != nullptr) {
    if (device_->event_record(event, s.handle) == cudaSuccess) {
      try {
        s.fences.push_back({index, event});
        s.fence_seq.store(index + 1, std::memory_order_release);
        ++s.counters.fences;
        return FenceResult::recorded;
      } catch (const std::bad_alloc&) {
        // fall through to the synchronize: the event is recorded but cannot be remembered
      }
    }
    return_event(event);
  }
  // No fence: wait for the stream on the CPU instead. Correct, only slower; counted.
  if (!unsafe_calls_allowed() || device_->stream_synchronize(s.handle) != cudaSuccess) {
    return FenceResult::failed;
  }
  s.fence_seq.store(index + 1, std::memory_order_release);
  s.completed.store(index + 1, std::memory_order_release);
  for (const Fence& fence : s.fences) return_event(fence.event);
  s.fences.clear();
  ++s.counters.blocking;
  return FenceResult::synchronized;
}

void PoolCore::refresh_fences(StreamState& s) noexcept {
  if (!unsafe_calls_allowed()) return;  // an event query would invalidate a capture under way
  while (!s.fences.empty()) {
    const Fence fence = s.fences.front();
    if (device_->event_query(fence.event) != cudaSuccess) return;
    s.completed.store(fence.index + 1, std::memory_order_release);
    return_event(fence.event);
    s.fences.pop_front();
  }
}

cudaEvent_t PoolCore::fence_event(const StreamState& s, std::uint64_t tag) const noexcept {
  for (const Fence& fence : s.fences) {
    if (fence.index >= tag) return fence.event;
  }
  return nullptr;
}

void PoolCore::drain_parked() noexcept {
  std::vector<Block*> clean;
  {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    for (std::size_t i = 0; i < parked_.size();) {
      Parked& p = parked_[i];
      bool done = true;
      for (auto& [stream, tag] : p.needs) {
        if (stream == nullptr) {
          done = false;
          break;
        }
        if (tag < stream->completed.load(std::memory_order_acquire)) continue;
        stream->lock.lock();
        refresh_fences(*stream);
        stream->lock.unlock();
        if (tag >= stream->completed.load(std::memory_order_acquire)) {
          done = false;
          break;
        }
      }
      if (!done) {
        ++i;
        continue;
      }
      try {
        clean.push_back(p.block);
      } catch (const std::bad_alloc&) {
        return;
      }
      parked_[i] = std::move(parked_.back());
      parked_.pop_back();
    }
  }
  make_clean(clean);
}

}  // namespace streampool::detail
