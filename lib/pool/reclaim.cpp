// Getting memory back: the out-of-memory ladder, the device-synchronize reclaim, trim and
// release_stream.
#include "capture_guard.hpp"
#include "pool_core.hpp"

#include <fmt/format.h>

#include <unordered_map>

namespace streampool::detail {

std::vector<StreamState*> PoolCore::all_states() const {
  std::lock_guard<std::mutex> registry(registry_mutex_);
  std::vector<StreamState*> states;
  states.reserve(states_.size());
  for (const auto& state : states_) states.push_back(state.get());
  return states;
}

bool PoolCore::reclaim(int step) noexcept {
  try {
    switch (step) {
      case 0: {
        for (StreamState* s : all_states()) {
          s->lock.lock();
          refresh_fences(*s);
          s->lock.unlock();
        }
        drain_parked();
        return true;
      }
      case 1: {
        std::lock_guard<std::mutex> arena(arena_mutex_);
        return release_free_segments(0) != 0;
      }
      case 2:
        return synchronize_and_reclaim();
      case 3: {
        std::lock_guard<std::mutex> arena(arena_mutex_);
        return release_free_segments(0) != 0;
      }
    }
  } catch (const std::bad_alloc&) {
  }
  return false;
}

bool PoolCore::synchronize_and_reclaim() noexcept {
  if (!unsafe_calls_allowed()) return false;
  std::vector<StreamState*> states;
  std::vector<std::uint64_t> boundary;
  std::vector<Block*> clean;
  try {
    states = all_states();
    boundary.resize(states.size());
  } catch (const std::bad_alloc&) {
    return false;
  }
  // A virtual fence on every stream: blocks dropped before it are covered by the synchronize
  // below; blocks dropped after it (by other threads meanwhile) are not, and keep a later tag.
  // A retired stream with no live buffer at its boundary can have no drop after it: once the
  // synchronize is done, nothing of it is pending.
  std::vector<char> idle(states.size(), 0);
  for (std::size_t i = 0; i < states.size(); ++i) {
    StreamState& s = *states[i];
    s.lock.lock();
    boundary[i] = s.fence_seq.load(std::memory_order_relaxed);
    s.fence_seq.store(boundary[i] + 1, std::memory_order_release);
    idle[i] = (s.attention.load(std::memory_order_relaxed) & retired) != 0 && s.counters.live == 0;
    s.lock.unlock();
  }
  if (device_->device_synchronize() != cudaSuccess) return false;
  for (std::size_t i = 0; i < states.size(); ++i) {
    StreamState& s = *states[i];
    s.lock.lock();
    if (s.completed.load(std::memory_order_relaxed) < boundary[i] + 1) {
      s.completed.store(boundary[i] + 1, std::memory_order_release);
    }
    while (!s.fences.empty() && s.fences.front().index <= boundary[i]) {
      return_event(s.fences.front().event);
      s.fences.pop_front();
    }
    if (idle[i] != 0) s.recyclable = true;
    // Everything on the stream's lists is clean now: move it to the depot, where every stream
    // (and the slab return below) can see it.
    try {
      for (BlockList& list : s.free) {
        for (Block* b = list.head; b != nullptr;) {
          Block* next = b->next;
          if (b->tag <= boundary[i]) {
            list.remove(b);
            clean.push_back(b);
          }
          b = next;
        }
      }
    } catch (const std::bad_alloc&) {
    }
    s.lock.unlock();
  }
  {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    for (Parked& p : parked_) {
      try {
        clean.push_back(p.block);
      } catch (const std::bad_alloc&) {
      }
    }
    parked_.clear();
  }
  make_clean(clean);
  return_free_slabs();
  {
    std::lock_guard<std::mutex> arena(arena_mutex_);
    coalesce_clean();
  }
  recycle_retired();
  return true;
}

void PoolCore::make_clean(const std::vector<Block*>& blocks) noexcept {
  {
    std::lock_guard<std::mutex> lock(depot_mutex_);
    for (Block* b : blocks) {
      if (b->large) continue;
      b->state = nullptr;
      depot_[b->size_class].push_front(b);
    }
  }
  std::lock_guard<std::mutex> arena(arena_mutex_);
  for (Block* b : blocks) {
    if (!b->large) continue;
    b->state = nullptr;
    arena_free(b);
  }
}

void PoolCore::return_free_slabs() noexcept {
  // A slab goes back to the arena when every block of it is in the depot. Lock order: depot,
  // then arena.
  std::lock_guard<std::mutex> depot(depot_mutex_);
  std::unordered_map<Slab*, std::size_t> in_depot;
  try {
    for (BlockList& list : depot_) {
      for (Block* b = list.head; b != nullptr; b = b->next) ++in_depot[b->slab];
    }
  } catch (const std::bad_alloc&) {
    return;
  }
  std::lock_guard<std::mutex> arena(arena_mutex_);
  for (std::size_t i = 0; i < slabs_.size();) {
    Slab& slab = *slabs_[i];
    const auto found = in_depot.find(&slab);
    if (found == in_depot.end() || found->second != slab.blocks.size()) {
      ++i;
      continue;
    }
    for (Block& b : slab.blocks) depot_[slab.size_class].remove(&b);
    slab.range->state = nullptr;
    arena_free(slab.range);
    slabs_[i] = std::move(slabs_.back());
    slabs_.pop_back();
  }
}

void PoolCore::recycle_retired() noexcept {
  std::lock_guard<std::mutex> registry(registry_mutex_);
  for (const auto& state : states_) {
    StreamState& s = *state;
    if ((s.attention.load(std::memory_order_relaxed) & retired) == 0) continue;
    s.lock.lock();
    bool empty = s.recyclable && s.counters.live == 0 && s.fences.empty();
    for (const BlockList& list : s.free) empty = empty && list.empty();
    if (empty) {
      // Not yet recycled (a recycled state is registered again, which clears `retired`).
      bool listed = false;
      for (StreamState* r : recycled_) listed = listed || r == &s;
      if (!listed) {
        try {
          recycled_.push_back(&s);
        } catch (const std::bad_alloc&) {
        }
      }
    }
    s.lock.unlock();
  }
}

void PoolCore::release_stream(cudaStream_t stream) {
  StreamId id = 0;
  throw_on_cuda_error(device_->stream_id(stream, &id), "release_stream: cudaStreamGetId");
  StreamState* s = nullptr;
  {
    std::lock_guard<std::mutex> registry(registry_mutex_);
    const auto found = by_id_.find(id);
    if (found == by_id_.end()) return;  // never seen, or already released
    s = found->second;
    by_id_.erase(found);
    const auto handle = by_handle_.find(stream);
    if (handle != by_handle_.end() && handle->second == s) by_handle_.erase(handle);
    s->lock.lock();
    s->attention.fetch_or(retired, std::memory_order_relaxed);
    s->generation.fetch_add(1, std::memory_order_release);
    s->lock.unlock();
  }
  // A last fence covers everything dropped on the stream; wait for it, and its blocks are clean.
  s->lock.lock();
  const std::uint64_t last = s->fence_seq.load(std::memory_order_relaxed);
  // With no live buffer now, no drop can come after this fence (the stream is retired).
  const bool idle = s->counters.live == 0;
  const FenceResult fenced = s->addressable() ? record_fence(*s) : FenceResult::failed;
  cudaEvent_t event = fenced == FenceResult::recorded ? fence_event(*s, last) : nullptr;
  s->lock.unlock();
  if (event != nullptr && device_->event_synchronize(event) != cudaSuccess) event = nullptr;
  if (fenced == FenceResult::failed || (fenced == FenceResult::recorded && event == nullptr)) {
    return;  // its blocks stay until a device synchronize (trim, out of memory)
  }
  std::vector<Block*> clean;
  s->lock.lock();
  s->completed.store(last + 1, std::memory_order_release);
  while (!s->fences.empty() && s->fences.front().index <= last) {
    return_event(s->fences.front().event);
    s->fences.pop_front();
  }
  // Only what the fence covers: a buffer still alive at the fence may have been dropped since
  // (another thread), after work the fence does not cover.
  for (BlockList& list : s->free) {
    for (Block* b = list.head; b != nullptr;) {
      Block* next = b->next;
      if (b->tag <= last) {
        list.remove(b);
        clean.push_back(b);
      }
      b = next;
    }
  }
  if (idle) s->recyclable = true;
  s->lock.unlock();
  make_clean(clean);
  recycle_retired();
}

void PoolCore::trim(std::size_t bytes_to_keep) {
  synchronize_and_reclaim();
  std::lock_guard<std::mutex> arena(arena_mutex_);
  release_free_segments(bytes_to_keep);
}

std::string PoolCore::out_of_memory_message(std::size_t bytes, cudaStream_t stream) {
  std::size_t device_free = 0;
  std::size_t device_total = 0;
  const bool known = unsafe_calls_allowed() &&
                     device_->mem_get_info(&device_free, &device_total) == cudaSuccess;
  const PoolStats now = stats();
  const std::int64_t cached = now.reserved_bytes.current - now.requested_bytes.current;
  return fmt::format(
      "out of memory allocating {} bytes on stream {}: the pool reserves {} bytes ({} requested "
      "by live allocations, {} cached or rounding{}), the device has {}",
      bytes, static_cast<const void*>(stream), now.reserved_bytes.current,
      now.requested_bytes.current, cached,
      options_.max_reserved_bytes != 0
          ? fmt::format(", limit {}", options_.max_reserved_bytes)
          : std::string(),
      known ? fmt::format("{} bytes free of {}", device_free, device_total)
            : std::string("an unknown number of bytes free"));
}

}  // namespace streampool::detail
