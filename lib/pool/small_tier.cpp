#include "small_tier.hpp"

#include "pool_core.hpp"

#include <streampool/error.hpp>

#include <unordered_map>

namespace streampool::detail {
namespace {
constexpr std::size_t batch = 16;  // blocks moved to a stream's list per depot visit or steal
}

SmallTier::SmallTier(PoolCore& pool, const PoolOptions& options, std::size_t classes)
    : pool_(pool), options_(options), depot_(classes) {}

Block* SmallTier::take(StreamState& s, std::uint32_t size_class, Failure& error) noexcept {
  s.lock.lock();
  if (Block* b = s.free[size_class].pop_front()) {  // the fast path left it for a slow reason
    s.set_free_blocks(s.free_blocks.load(std::memory_order_relaxed) - 1);
    PoolCore::reused_here(s, b->need, b->size);
    ++s.counters.hits;
    s.lock.unlock();
    return b;
  }
  ++s.counters.misses;
  s.lock.unlock();
  const auto attempt = [&]() -> Block* {
    if (Block* b = from_depot(s, size_class)) return b;
    if (Block* b = steal(s, size_class)) return b;
    pool_.drain_parked();
    if (Block* b = from_depot(s, size_class)) return b;
    return carve(s, size_class, error);
  };
  return pool_.with_reclaim(attempt, error);
}

Block* SmallTier::from_depot(StreamState& s, std::uint32_t size_class) noexcept {
  Block* taken[batch];
  std::size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(depot_mutex_);
    BlockList& list = depot_[size_class];
    while (n < batch && !list.empty()) {
      Block* b = list.pop_front();
      --b->slab->in_depot;
      taken[n++] = b;
    }
  }
  if (n == 0) return nullptr;
  s.lock.lock();
  const bool keeps = (s.attention.load(std::memory_order_relaxed) & retired) == 0;
  if (keeps) {
    // Clean: they stay clean on s's list, so that other streams may still take them.
    for (std::size_t i = 1; i < n; ++i) s.free[size_class].push_back(taken[i]);
    s.set_free_blocks(s.free_blocks.load(std::memory_order_relaxed) + (n - 1));
  }
  s.lock.unlock();
  if (!keeps) {
    std::lock_guard<std::mutex> lock(depot_mutex_);
    for (std::size_t i = 1; i < n; ++i) {
      depot_[size_class].push_front(taken[i]);
      ++taken[i]->slab->in_depot;
    }
  }
  return taken[0];
}

Block* SmallTier::steal(StreamState& s, std::uint32_t size_class) noexcept {
  Block* taken[batch];
  std::size_t n = 0;
  bool waited = false;  // s waits on the other stream's fence: the blocks are safe on s only
  for (StreamState* other = pool_.registry().first(); other != nullptr && n == 0;
       other = other->next_state) {
    if (other == &s || other->free_blocks.load(std::memory_order_relaxed) == 0) continue;
    other->lock.lock();
    BlockList& list = other->free[size_class];
    if (list.empty()) {
      other->lock.unlock();
      continue;
    }
    if (!covered(list.tail->need)) pool_.refresh(*other);
    // Oldest first: their fences are the likeliest to have completed.
    while (n < batch && !list.empty() && covered(list.tail->need)) {
      Block* b = list.tail;
      list.remove(b);
      taken[n++] = b;
    }
    const Need oldest = list.empty() ? Need{} : list.tail->need;
    if (n == 0 && pool_.options().cross_stream_wait && s.addressable() &&
        oldest.index < other->timeline.recorded.load(std::memory_order_relaxed)) {
      // The fence is recorded but still pending: wait on it on the GPU rather than grow.
      const Fence* fence = pool_.fence_at(*other, oldest.index);
      const LegacyPermit wait(s.handle);
      if (fence != nullptr && wait &&
          pool_.device().stream_wait_event(s.handle, fence->event) == cudaSuccess) {
        while (n < batch && !list.empty() && list.tail->need.index <= fence->index) {
          Block* b = list.tail;
          list.remove(b);
          taken[n++] = b;
        }
        waited = true;
      }
    }
    if (n == 0 && (other->attention.load(std::memory_order_relaxed) & retired) == 0 &&
        oldest.index >= other->timeline.recorded.load(std::memory_order_relaxed)) {
      // Unfenced: only the stream's own next call may record its fence. Ask for one.
      other->attention.fetch_or(wants_fence, std::memory_order_relaxed);
    }
    other->set_free_blocks(other->free_blocks.load(std::memory_order_relaxed) - n);
    other->lock.unlock();
  }
  if (n == 0) return nullptr;
  s.lock.lock();
  s.counters.cross_stream += n;
  const bool keeps = (s.attention.load(std::memory_order_relaxed) & retired) == 0;
  if (keeps) {
    for (std::size_t i = 1; i < n; ++i) {
      Block* b = taken[i];
      // Covered blocks are clean; waited-for ones are safe on s, and on others after s's next
      // fence (which follows the wait).
      b->need = waited ? s.need_now() : Need{};
      if (waited) PoolCore::waited_here(s, b->size);
      s.free[size_class].push_back(b);
    }
    s.set_free_blocks(s.free_blocks.load(std::memory_order_relaxed) + (n - 1));
  }
  s.lock.unlock();
  if (!keeps) {
    for (std::size_t i = 1; i < n; ++i) {
      try {
        pool_.settle(taken[i], {taken[i]->need});
      } catch (const std::bad_alloc&) {
        pool_.strand(taken[i]);  // back at a device synchronize, never early
      }
    }
  }
  return taken[0];
}

Block* SmallTier::carve(StreamState& s, std::uint32_t size_class, Failure& error) noexcept {
  // No sum here overflows: validate() bounds the slab to 1 GiB and a block, like the rounding,
  // to 1 TiB, so per_slab * block <= max(slab, block) and the rounded range < 2^42. (Unbounded,
  // slab=SIZE_MAX rounded to an empty range and handed out a block of no slab.)
  const std::size_t block = pool_.classes().block_size(size_class);
  const std::size_t per_slab = options_.slab_bytes > block ? options_.slab_bytes / block : 1;
  const std::size_t rounding = options_.large_rounding;
  const std::size_t range_bytes = (per_slab * block + rounding - 1) / rounding * rounding;
  STREAMPOOL_ASSERT(range_bytes >= block && range_bytes / block >= per_slab);
  std::unique_ptr<Slab> slab;
  try {
    slab = std::make_unique<Slab>();
    slab->size_class = size_class;
    slab->blocks.resize(range_bytes / block);
  } catch (const std::bad_alloc&) {
    error = Errc::out_of_memory;
    return nullptr;
  }
  // A clean range, a new segment, or, when the device has no room, one of s's own free ranges
  // (its blocks are then s's, safe on s at once and elsewhere once the range's need is covered,
  // like any block dropped on s). A stream's own ranges are kept for its large requests while
  // the device has room: cutting them into slabs took the two-stream trace from 1.06 to 1.48
  // reserved per requested byte.
  LargeTier& large = pool_.large();
  Need had;
  Block* range = large.find(nullptr, range_bytes, &had);
  if (range == nullptr) {
    // Before growing, as every growth of the arena: the shelves go back, and neighbours kept
    // apart may be covered now.
    pool_.unshelve_all(&s);
    large.coalesce_covered();
    range = large.find(nullptr, range_bytes, &had);
  }
  if (range == nullptr) range = large.grow(nullptr, range_bytes, &had, nullptr, error);
  if (range == nullptr && error == Errc::out_of_memory) {
    range = large.find(&s, range_bytes, &had);
    if (range != nullptr) error.clear();
  }
  if (range == nullptr) return nullptr;
  // The range was clean (or covered), s's own, or (cross_stream_wait) another stream's that s now
  // waits for: then its blocks are safe on s only, and on others once s's next fence completes.
  const Need found = had;
  const bool waited = had.timeline != nullptr && had.timeline != &s.timeline && !covered(had);
  if (had.timeline != nullptr && had.timeline != &s.timeline) had = {};
  range->is_slab = true;
  slab->range = range;
  std::byte* ptr = range->ptr;
  for (Block& b : slab->blocks) {
    b.ptr = ptr;
    b.size = block;
    b.size_class = size_class;
    b.slab = slab.get();
    b.need = had;
    ptr += block;
  }
  Slab* raw = slab.get();
  {
    std::lock_guard<std::mutex> lock(depot_mutex_);
    try {
      slabs_.push_back(std::move(slab));
    } catch (const std::bad_alloc&) {
      range->is_slab = false;
      large.put(range, found);
      error = Errc::out_of_memory;
      return nullptr;
    }
    if (had.timeline == nullptr && !waited) {
      // The first block is the caller's: other threads may empty the depot before it looks.
      for (std::size_t i = 1; i < raw->blocks.size(); ++i) depot_[size_class].push_back(&raw->blocks[i]);
      raw->in_depot = raw->blocks.size() - 1;
    }
  }
  if (had.timeline != nullptr || waited) {
    s.lock.lock();
    if (waited) had = s.need_now();
    if ((s.attention.load(std::memory_order_relaxed) & retired) == 0) {
      for (std::size_t i = 1; i < raw->blocks.size(); ++i) {
        raw->blocks[i].need = had;
        if (waited) PoolCore::waited_here(s, block);
        s.free[size_class].push_back(&raw->blocks[i]);
      }
      s.set_free_blocks(s.free_blocks.load(std::memory_order_relaxed) + raw->blocks.size() - 1);
      s.lock.unlock();
    } else {
      s.lock.unlock();
      // s retired meanwhile: what guards the blocks is the range's own need (s's last fence may
      // precede its wait on that need).
      const Need guard = waited ? found : had;
      for (std::size_t i = 1; i < raw->blocks.size(); ++i) {
        try {
          pool_.park(&raw->blocks[i], {guard});
        } catch (const std::bad_alloc&) {
          pool_.strand(&raw->blocks[i]);
        }
      }
    }
  }
  return &raw->blocks[0];
}

void SmallTier::put_clean(const std::vector<Block*>& blocks) noexcept {
  std::lock_guard<std::mutex> lock(depot_mutex_);
  for (Block* b : blocks) {
    STREAMPOOL_ASSERT(!b->large);
    b->need = {};
    b->free = true;
    depot_[b->size_class].push_front(b);
    ++b->slab->in_depot;
  }
}

void SmallTier::return_free_slabs() noexcept {
  std::vector<Block*> ranges;
  {
    std::lock_guard<std::mutex> lock(depot_mutex_);
    for (std::size_t i = 0; i < slabs_.size();) {
      Slab& slab = *slabs_[i];
      if (slab.in_depot != slab.blocks.size()) {
        ++i;
        continue;
      }
      try {
        ranges.push_back(slab.range);
      } catch (const std::bad_alloc&) {
        break;
      }
      for (Block& b : slab.blocks) depot_[slab.size_class].remove(&b);
      slab.range->is_slab = false;
      slabs_[i] = std::move(slabs_.back());
      slabs_.pop_back();  // frees the blocks: none is anywhere but the depot, which we hold
    }
  }
  pool_.large().put_clean(ranges);
}

std::size_t SmallTier::depot_bytes() noexcept {
  std::lock_guard<std::mutex> lock(depot_mutex_);
  std::size_t n = 0;
  for (const BlockList& list : depot_) {
    if (!list.empty()) n += list.count * list.head->size;
  }
  return n;
}

std::size_t SmallTier::slab_bytes() noexcept {
  std::lock_guard<std::mutex> lock(depot_mutex_);
  std::size_t n = 0;
  for (const auto& slab : slabs_) n += slab->range->size;
  return n;
}

bool SmallTier::consistent() noexcept {
  std::lock_guard<std::mutex> lock(depot_mutex_);
  for (std::size_t c = 0; c < depot_.size(); ++c) {
    std::size_t n = 0;
    for (const Block* b = depot_[c].head; b != nullptr; b = b->next, ++n) {
      if (b->size_class != c || !b->free || b->need.timeline != nullptr || b->large) return false;
    }
    if (n != depot_[c].count) return false;
  }
  std::unordered_map<const Slab*, std::size_t> in_depot;
  for (const BlockList& list : depot_) {
    for (const Block* b = list.head; b != nullptr; b = b->next) ++in_depot[b->slab];
  }
  for (const auto& slab : slabs_) {
    const auto it = in_depot.find(slab.get());
    if ((it == in_depot.end() ? 0 : it->second) != slab->in_depot) return false;
    if (!slab->range->is_slab) return false;
  }
  return true;
}

}  // namespace streampool::detail
