// Recording fences and learning which completed.
#include "fences.hpp"

#include "pool_core.hpp"

#include <chrono>
#include <limits>
#include <utility>

namespace streampool::detail {

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

FencePolicy FencePolicy::from(const PoolOptions& options) noexcept {
  FencePolicy p;
  p.every_free = options.fence_every_free;
  p.unfenced_bytes = options.unfenced_bytes;
  p.unfenced_ns = static_cast<std::int64_t>(options.unfenced_us) * 1000;
  return p;
}

std::size_t FencePolicy::limit(bool several_streams) const noexcept {
  if (every_free) return 1;
  if (!several_streams) return unbounded;
  return unfenced_bytes != 0 ? unfenced_bytes : no_byte_bound;
}

EventPool::~EventPool() {
  for (cudaEvent_t event : idle_) device_.event_destroy(event);
}

cudaEvent_t EventPool::take() noexcept {
  {
    std::lock_guard<CountedMutex> lock(mutex_);
    if (!idle_.empty()) {
      cudaEvent_t event = idle_.back();
      idle_.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  return device_.event_create(&event) == cudaSuccess ? event : nullptr;
}

std::vector<cudaEvent_t> EventPool::drain() noexcept {
  std::lock_guard<CountedMutex> lock(mutex_);
  return std::exchange(idle_, {});
}

void EventPool::give(cudaEvent_t event) noexcept {
  try {
    std::lock_guard<CountedMutex> lock(mutex_);
    idle_.push_back(event);
  } catch (const std::bad_alloc&) {
    device_.event_destroy(event);
  }
}

FenceResult PoolCore::record_fence(StreamState& s, bool may_block) noexcept {
  STREAMPOOL_ASSERT(s.addressable());
  STREAMPOOL_ASSERT((s.attention.load(std::memory_order_relaxed) & retired) == 0);
  // A fence recorded on a capturing stream would belong to the graph (and never complete here).
  const GateStatus status = gate_status(*device_, s.handle);
  if (status.error != cudaSuccess || status.capturing()) return FenceResult::failed;
  // Nobody may ask for this stream's blocks for a long while: learn here too which of its fences
  // completed, so that its fences (and their events) do not pile up.
  if (s.fences.size() >= 8) refresh(s);
  // The gate refuses the legacy stream's record at times (gate.hpp, Restricted::legacy_stream):
  // under a permit (LegacyPermit) whose own look decides, taken after the refresh so that the
  // gate's waiter does not wait for its queries.
  const LegacyPermit enqueue(s.handle);
  if (!enqueue) return FenceResult::failed;
  const std::uint64_t index = s.timeline.recorded.load(std::memory_order_relaxed);
  FenceResult result = FenceResult::failed;
  if (cudaEvent_t event = events_.take(); event != nullptr) {
    if (device_->event_record(event, s.handle) == cudaSuccess) {
      try {
        s.fences.push_back({index, event, 0});
        result = FenceResult::recorded;
      } catch (const std::bad_alloc&) {
        // recorded but cannot be remembered: fall through to the synchronize
      }
    }
    if (result != FenceResult::recorded) events_.give(event);
  }
  if (result == FenceResult::recorded) {
    s.timeline.recorded.store(index + 1, std::memory_order_release);
    ++s.counters.fences;
  } else {
    // No fence: wait for the stream on the CPU instead. Correct, only slower; counted.
    if (!may_block) return FenceResult::failed;
    const SyncPermit permit(s.handle);
    if (!permit || device_->stream_synchronize(s.handle) != cudaSuccess) {
      return FenceResult::failed;
    }
    s.timeline.recorded.store(index + 1, std::memory_order_release);
    complete_through(s, index);
    ++s.counters.blocking;
    result = FenceResult::synchronized;
  }
  s.unfenced_bytes = 0;
  s.unfenced_since_ns = 0;
  s.attention.fetch_and(~wants_fence, std::memory_order_relaxed);
  return result;
}

void PoolCore::refresh(StreamState& s) noexcept {
  const std::uint64_t device_done = device_timeline_.completed.load(std::memory_order_acquire);
  // A permit for up to 16 queries (gate.hpp: the gate forbids queries at times): most refreshes
  // ask one or two, and a permit a query cost the paced stress about 2% of its rate on an H100
  // (bench/results/h100-ab-permits.md); one for the whole loop held up the gate's waiter for as
  // long as a stream's many fences took to learn (gate.hpp, CallPermit).
  CallPermit query;
  unsigned asked = 0;
  while (!s.fences.empty()) {
    const Fence fence = s.fences.front();
    if (fence.event == nullptr) {
      if (fence.device_index >= device_done) return;
    } else {
      if (asked++ % 16 == 0) {
        query.release();  // first: a begin that waits for this thread's slot sees it empty
        query = CallPermit(Restricted::event_wait);
      }
      if (!query || device_->event_query(fence.event) != cudaSuccess) return;
      events_.give(fence.event);
    }
    s.timeline.completed.store(fence.index + 1, std::memory_order_release);
    s.fences.pop_front();
  }
}

bool PoolCore::wait_for_stream(StreamState& s) noexcept {
  cudaEvent_t event = nullptr;
  bool unmarked = false;  // recorded a fence, but no event of ours after it
  bool done = false;
  s.lock.lock();
  const cudaStream_t handle = s.handle;  // the caller allocates on s: it still names s
  if (s.addressable() && (s.attention.load(std::memory_order_relaxed) & retired) == 0) {
    switch (record_fence(s)) {
      case FenceResult::recorded: {
        const LegacyPermit enqueue(handle);  // the mark's record: as record_fence's
        event = enqueue ? events_.take() : nullptr;
        if (event != nullptr && device_->event_record(event, handle) != cudaSuccess) {
          events_.give(event);
          event = nullptr;
        }
        unmarked = event == nullptr;
        break;
      }
      case FenceResult::synchronized:
        done = true;  // waited for already, under the lock
        break;
      case FenceResult::failed:
        break;
    }
  }
  s.lock.unlock();
  bool blocking = false;
  if (event != nullptr) {
    const CallPermit permit(Restricted::event_wait);
    done = permit && device_->event_synchronize(event) == cudaSuccess;
    events_.give(event);
  } else if (unmarked) {
    // As a fence that cannot be made: wait for the whole stream instead, counted (of the legacy
    // stream, a null handle, too: found in review, 2026-12-08).
    const SyncPermit permit(handle);
    done = blocking = permit && device_->stream_synchronize(handle) == cudaSuccess;
  }
  if (done) {
    s.lock.lock();
    if (blocking) ++s.counters.blocking;
    refresh(s);
    s.lock.unlock();
  }
  return done;
}

void PoolCore::complete_through(StreamState& s, std::uint64_t index) noexcept {
  STREAMPOOL_ASSERT(index < s.timeline.recorded.load(std::memory_order_relaxed));
  while (!s.fences.empty() && s.fences.front().index <= index) {
    if (s.fences.front().event != nullptr) events_.give(s.fences.front().event);
    s.fences.pop_front();
  }
  if (s.timeline.completed.load(std::memory_order_relaxed) <= index) {
    s.timeline.completed.store(index + 1, std::memory_order_release);
  }
}

const Fence* PoolCore::fence_at(const StreamState& s, std::uint64_t index) const noexcept {
  for (const Fence& fence : s.fences) {
    if (fence.index >= index && fence.event != nullptr) return &fence;
  }
  return nullptr;
}

void PoolCore::fence_if_asked(StreamState& s) noexcept {
  if ((s.attention.load(std::memory_order_relaxed) & wants_fence) != 0 && s.addressable()) {
    record_fence(s);
  }
}

void PoolCore::fence_or_ask(StreamState& s) noexcept {
  if (s.addressable()) {
    record_fence(s);
  } else {
    s.attention.fetch_or(wants_fence, std::memory_order_relaxed);
  }
}

bool PoolCore::learn_covered(const Need& need) noexcept {
  if (covered(need)) return true;
  if (StreamState* s = need.timeline->stream) {
    s->lock.lock();
    refresh(*s);
    s->lock.unlock();
  }
  return covered(need);
}

}  // namespace streampool::detail
