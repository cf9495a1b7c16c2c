// The shelf: large ranges a stream dropped and keeps for itself (StreamState::shelf).
//
// A same-stream allocate + drop of a large buffer is a pop and a push under the stream's own
// lock, as for a small block: no arena mutex, no best-fit search. A shelved range is in use as
// far as the arena knows (it merges with nothing and no other stream finds it), so a stream's
// shelf goes back to the arena when a request of its own misses it (the arena then decides as if
// there were no shelf: best fit, a cut, the stream's own range extended), every shelf goes back
// before the arena grows (allocate_large, take_range, a slab's carve), at the first step
// of the out-of-memory ladder, when a device synchronize reclaims (trim), and when its stream
// retires; and one shelf holds at most PoolOptions::large_shelf ranges, the oldest going back
// when a drop finds it full. A shelved range keeps the need of its drop: on its stream it is
// reused at once, as a range the stream owns in the arena would be, and it reaches another
// stream only through the arena, by the one rule (covered()).
#include "pool_core.hpp"

namespace streampool::detail {

Block* PoolCore::shelf_overflow(StreamState& s) noexcept {
  Block* oldest = nullptr;
  if (s.shelf.count > options_.large_shelf) {
    oldest = s.shelf.tail;
    s.shelf.remove(oldest);
    s.shelved.store(static_cast<std::uint32_t>(s.shelf.count), std::memory_order_relaxed);
  }
  return oldest;
}

void PoolCore::to_arena(StreamState& s, std::uint32_t generation, Block* range,
                        bool named) noexcept {
  const Need need = range->need;
  if (const std::size_t tainted = large_.put(range, need); tainted != 0) {
    // Clean neighbours merged into the range now wait for its fence too: they count against the
    // bound like the range itself (while no fence was recorded on s since the range's need).
    s.lock.lock();
    if (need.timeline == &s.timeline && s.current(generation) &&
        s.timeline.recorded.load(std::memory_order_relaxed) == need.index &&
        dropped_here(s, tainted)) {
      if (named) fence_or_ask(s);
      else s.attention.fetch_or(wants_fence, std::memory_order_relaxed);
    }
    s.lock.unlock();
  }
}

bool PoolCore::unshelve(StreamState& s, bool named) noexcept {
  if (s.shelved.load(std::memory_order_relaxed) == 0) return false;
  s.lock.lock();
  const std::uint32_t generation = s.generation.load(std::memory_order_relaxed);
  Block* shelf = s.shelf.head;  // the list, taken whole; its links are read once unlocked
  s.shelf = BlockList{};
  s.shelved.store(0, std::memory_order_relaxed);
  s.lock.unlock();
  for (Block* range = shelf; range != nullptr;) {
    Block* next = range->next;
    range->next = range->prev = nullptr;
    to_arena(s, generation, range, named);
    range = next;
  }
  return shelf != nullptr;
}

bool PoolCore::unshelve_all(const StreamState* caller) noexcept {
  bool moved = false;
  for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
    moved = unshelve(*s, s == caller) || moved;
  }
  return moved;
}

void PoolCore::take_shelf(StreamState& s, BlockList& out) noexcept {
  while (Block* range = s.shelf.pop_front()) out.push_back(range);  // needs no host memory
  s.shelved.store(0, std::memory_order_relaxed);
}

}  // namespace streampool::detail
