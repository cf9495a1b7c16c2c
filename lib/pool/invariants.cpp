// The expensive invariant checks (STREAMPOOL_EXPENSIVE_ASSERT): each walks what it checks.
#include "pool_core.hpp"

#include <algorithm>

namespace streampool::detail {

bool PoolCore::consistent_state(StreamState& s) noexcept {
  const std::uint64_t recorded = s.timeline.recorded.load(std::memory_order_relaxed);
  if (s.timeline.completed.load(std::memory_order_relaxed) > recorded) return false;
  std::size_t blocks = 0;
  for (std::size_t c = 0; c < classes_.count(); ++c) {
    std::size_t n = 0;
    for (const Block* b = s.free[c].head; b != nullptr; b = b->next, ++n) {
      if (b->size_class != c || !b->free || b->large || b->requested != 0) return false;
      if (b->need.timeline != nullptr &&
          (b->need.timeline != &s.timeline || b->need.index > recorded)) {
        return false;
      }
    }
    if (n != s.free[c].count) return false;
    blocks += n;
  }
  if (blocks != s.free_blocks.load(std::memory_order_relaxed)) return false;
  std::size_t shelved = 0;
  for (const Block* b = s.shelf.head; b != nullptr; b = b->next, ++shelved) {
    if (!b->large || b->free || b->is_slab || b->requested != 0) return false;
    if (b->need.timeline != nullptr &&
        (b->need.timeline != &s.timeline || b->need.index > recorded)) {
      return false;
    }
  }
  if (shelved != s.shelf.count || shelved != s.shelved.load(std::memory_order_relaxed) ||
      shelved > options_.large_shelf) {
    return false;
  }
  if ((s.attention.load(std::memory_order_relaxed) & retired) != 0 && blocks + shelved != 0) {
    return false;
  }
  std::uint64_t previous = 0;
  bool first = true;
  for (const Fence& fence : s.fences) {
    if (fence.index >= recorded || (!first && fence.index <= previous)) return false;
    previous = fence.index;
    first = false;
  }
  return true;
}

bool PoolCore::consistent() noexcept {
  {
    BiasedLock::Sweep sweep;
    registry_.mark_every(sweep);
    for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
      sweep.lock(s->lock);
      const bool ok = consistent_state(*s);
      s->lock.unlock();
      if (!ok) return false;
    }
  }
  {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    const auto large = std::count_if(parked_.begin(), parked_.end(),
                                     [](const Parked& p) { return p.block->large; });
    if (static_cast<std::size_t>(large) != parked_large_.load(std::memory_order_relaxed)) {
      return false;
    }
  }
  return small_.consistent() && large_.consistent();
}

}  // namespace streampool::detail
