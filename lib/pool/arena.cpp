// The arena: device segments, each an address-ordered list of ranges, and the large tier.
//
// A large request is rounded up to options.large_rounding and served best-fit from the free
// ranges (indexed by size), splitting off the rest; a free range merges with free neighbours that
// belong to the same stream or to none (see arena_free). A free range owned by a stream is usable on that
// stream at once and elsewhere once its fence completed, like a small block. When nothing fits,
// the arena grows by a device allocation of at least options.segment_bytes.
//
// Invariant: a segment's ranges tile it exactly, in address order; every free range is in
// free_ranges_ exactly once; two adjacent free ranges, as last merged, had different owners.
#include "capture_guard.hpp"
#include "pool_core.hpp"

#include <streampool/error.hpp>

#include <algorithm>

namespace streampool::detail {
namespace {
constexpr int best_fit_scan = 64;  // candidates examined before growing
}

Block* PoolCore::new_block() {
  if (!spare_blocks_.empty()) {
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    *b = Block{};
    return b;
  }
  return new Block{};
}

void PoolCore::delete_block(Block* b) noexcept {
  try {
    spare_blocks_.push_back(b);
  } catch (const std::bad_alloc&) {
    delete b;
  }
}

bool PoolCore::range_clean(Block* range) noexcept {
  if (range->state == nullptr) return true;
  if (range->tag < range->state->completed.load(std::memory_order_acquire)) {
    range->state = nullptr;
    return true;
  }
  return false;
}

void PoolCore::arena_insert_free(Block* range) noexcept {
  range->free = true;
  try {
    free_ranges_.insert(range);
  } catch (const std::bad_alloc&) {
    // Unindexed, the range is lost to reuse until its segment is freed; nothing breaks.
  }
}

void PoolCore::arena_erase_free(Block* range) noexcept { free_ranges_.erase(range); }

Block* PoolCore::arena_find(StreamState* s, std::size_t bytes) noexcept {
  Block probe;
  probe.size = bytes;
  // Best fit among the ranges this stream may use, preferring its own (they need no fence for
  // anyone, and clean ranges stay free for every stream).
  int scanned = 0;
  Block* clean = nullptr;
  for (auto it = free_ranges_.lower_bound(&probe);
       it != free_ranges_.end() && scanned < best_fit_scan; ++it, ++scanned) {
    Block* range = *it;
    if (s != nullptr && range->state == s) return range;
    if (clean == nullptr && range_clean(range)) clean = range;
  }
  return clean;
}

Block* PoolCore::arena_grow(std::size_t bytes, std::error_code& error) noexcept {
  if (!unsafe_calls_allowed()) {
    error = make_error_code(Errc::capture_forbids_call);
    return nullptr;
  }
  const std::size_t limit = options_.max_reserved_bytes;
  std::size_t size = std::max(bytes, options_.segment_bytes);
  const auto reserved = static_cast<std::size_t>(reserved_.load());
  if (limit != 0 && reserved + size > limit) size = bytes;
  if (limit != 0 && reserved + size > limit) {
    error = make_error_code(Errc::out_of_memory);
    return nullptr;
  }
  void* ptr = nullptr;
  cudaError_t status = device_->malloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation && size > bytes) {
    size = bytes;  // a whole segment does not fit: the request alone may
    status = device_->malloc(&ptr, size);
  }
  if (status != cudaSuccess) {
    error = make_error_code(status == cudaErrorMemoryAllocation ? Errc::out_of_memory
                                                                : errc_from_cuda(status));
    return nullptr;
  }
  try {
    auto segment = std::make_unique<Segment>();
    Block* range = new_block();
    range->ptr = static_cast<std::byte*>(ptr);
    range->size = size;
    range->large = true;
    range->segment = segment.get();
    segment->base = range->ptr;
    segment->size = size;
    segment->first = range;
    segments_.push_back(std::move(segment));
    count_device_allocation(size);
    return range;
  } catch (const std::bad_alloc&) {
    device_->free(ptr);
    error = make_error_code(Errc::out_of_memory);
    return nullptr;
  }
}

Block* PoolCore::arena_take(StreamState* s, std::size_t bytes, std::error_code& error) noexcept {
  if (Block* range = arena_find(s, bytes)) return arena_split(range, bytes);
  Block* range = arena_grow(bytes, error);
  return range == nullptr ? nullptr : arena_cut(range, bytes);
}

Block* PoolCore::arena_split(Block* range, std::size_t bytes) noexcept {
  arena_erase_free(range);
  return arena_cut(range, bytes);
}

Block* PoolCore::arena_cut(Block* range, std::size_t bytes) noexcept {
  if (range->size - bytes >= options_.large_rounding) {
    Block* rest = nullptr;
    try {
      rest = new_block();
    } catch (const std::bad_alloc&) {
    }
    if (rest != nullptr) {
      rest->ptr = range->ptr + bytes;
      rest->size = range->size - bytes;
      rest->large = true;
      rest->segment = range->segment;
      rest->state = range->state;
      rest->tag = range->tag;
      rest->before = range;
      rest->after = range->after;
      if (range->after != nullptr) range->after->before = rest;
      range->after = rest;
      range->size = bytes;
      arena_insert_free(rest);
    }
  }
  range->free = false;
  return range;
}

void PoolCore::arena_free(Block* range) noexcept {
  // Merge with free neighbours (after learning which owners' fences completed). A clean range
  // merges with any free neighbour: the merged range takes the neighbour's owner and tag, safe on
  // that stream at once and elsewhere after its fence, as the neighbour was. Two ranges owned by
  // different streams stay apart until one of them is clean.
  range_clean(range);
  const auto mergeable = [&](Block* neighbour) {
    if (neighbour == nullptr || !neighbour->free || neighbour->is_slab) return false;
    range_clean(neighbour);
    return neighbour->state == nullptr || range->state == nullptr ||
           neighbour->state == range->state;
  };
  // `keep` absorbs its right neighbour `gone`.
  const auto absorb = [&](Block* keep, Block* gone) {
    keep->size += gone->size;
    keep->after = gone->after;
    if (gone->after != nullptr) gone->after->before = keep;
    if (keep->state == nullptr) {
      keep->state = gone->state;
      keep->tag = gone->tag;
    } else if (gone->state != nullptr) {
      keep->tag = std::max(keep->tag, gone->tag);
    }
    delete_block(gone);
  };
  while (mergeable(range->before)) {
    Block* left = range->before;
    arena_erase_free(left);
    absorb(left, range);
    range = left;
  }
  while (mergeable(range->after)) {
    Block* right = range->after;
    arena_erase_free(right);
    absorb(range, right);
  }
  range->is_slab = false;
  arena_insert_free(range);
}

std::size_t PoolCore::arena_size(std::size_t bytes, std::error_code& error) const noexcept {
  if (bytes > (std::size_t{1} << 50)) {  // no device has a PiB; also keeps the rounding exact
    error = make_error_code(Errc::out_of_memory);
    return 0;
  }
  const std::size_t rounding = options_.large_rounding;
  return (bytes + rounding - 1) / rounding * rounding;
}

Block* PoolCore::allocate_large(StreamState& s, std::size_t bytes, std::error_code& error) noexcept {
  const std::size_t rounded = arena_size(bytes, error);
  if (rounded == 0) return nullptr;
  bool grew = false;
  const auto attempt = [&]() -> Block* {
    {
      std::lock_guard<std::mutex> arena(arena_mutex_);
      if (Block* range = arena_find(&s, rounded)) return arena_split(range, rounded);
    }
    // Before growing: blocks parked after use on several streams may be free by now, and other
    // streams' ranges may be covered by fences that completed, or could be by a fence they are
    // asked for now.
    drain_parked();
    ask_owners_of_free_ranges(s);
    std::lock_guard<std::mutex> arena(arena_mutex_);
    const std::size_t segments = segments_.size();
    Block* range = arena_take(&s, rounded, error);
    grew = segments_.size() != segments;
    return range;
  };
  Block* range = with_reclaim(attempt, error);
  if (range == nullptr) return nullptr;
  s.lock.lock();
  if (grew) ++s.counters.misses;
  else ++s.counters.hits;
  s.lock.unlock();
  return range;
}

void PoolCore::release_large(Block* b) noexcept {
  StreamState& s = *b->state;
  s.lock.lock();
  const bool orphaned = count_release(s, b);
  const std::uint64_t tag = s.fence_seq.load(std::memory_order_relaxed);  // before the fence
  fence_if_asked(s);
  s.lock.unlock();
  {
    std::lock_guard<std::mutex> arena(arena_mutex_);
    b->state = &s;
    b->tag = tag;
    arena_free(b);
  }
  if (orphaned) orphan_release();
}

void PoolCore::coalesce_clean() noexcept {
  // Neighbours with different owners stay apart when freed; once their owners' fences completed
  // (or the device synchronized) they are all clean and may merge.
  const auto free_clean = [&](Block* r) {
    return r != nullptr && r->free && !r->is_slab && range_clean(r);
  };
  for (const auto& segment : segments_) {
    for (Block* r = segment->first; r != nullptr; r = r->after) {
      if (!free_clean(r) || !free_clean(r->after)) continue;
      arena_erase_free(r);
      while (free_clean(r->after)) {
        Block* right = r->after;
        arena_erase_free(right);
        r->size += right->size;
        r->after = right->after;
        if (right->after != nullptr) right->after->before = r;
        delete_block(right);
      }
      arena_insert_free(r);
    }
  }
}

void PoolCore::ask_owners_of_free_ranges(StreamState& s) noexcept {
  // Streams that own free ranges (other than s), and whether each has ranges no fence covers yet.
  std::vector<std::pair<StreamState*, bool>> owners;
  try {
    std::lock_guard<std::mutex> arena(arena_mutex_);
    for (Block* range : free_ranges_) {
      StreamState* owner = range->state;
      if (owner == nullptr || owner == &s || range_clean(range)) continue;
      const bool unfenced = range->tag >= owner->fence_seq.load(std::memory_order_acquire);
      auto it = std::find_if(owners.begin(), owners.end(),
                             [owner](const auto& o) { return o.first == owner; });
      if (it == owners.end()) owners.emplace_back(owner, unfenced);
      else it->second = it->second || unfenced;
    }
  } catch (const std::bad_alloc&) {
    return;
  }
  for (auto [owner, unfenced] : owners) {
    owner->lock.lock();
    refresh_fences(*owner);
    // Only the owner's own next call may record its fence.
    if (unfenced && (owner->attention.load(std::memory_order_relaxed) & retired) == 0) {
      owner->attention.fetch_or(wants_fence, std::memory_order_relaxed);
    }
    owner->lock.unlock();
  }
}

std::size_t PoolCore::release_free_segments(std::size_t bytes_to_keep) noexcept {
  coalesce_clean();
  std::size_t released = 0;
  for (std::size_t i = 0; i < segments_.size();) {
    if (static_cast<std::size_t>(reserved_.load()) <= bytes_to_keep) break;
    Segment& segment = *segments_[i];
    Block* range = segment.first;
    const bool whole = range->free && !range->is_slab && range->size == segment.size &&
                       range_clean(range);
    if (!whole || !unsafe_calls_allowed() || device_->free(segment.base) != cudaSuccess) {
      ++i;
      continue;
    }
    arena_erase_free(range);
    delete_block(range);
    count_device_free(segment.size);
    released += segment.size;
    segments_[i] = std::move(segments_.back());
    segments_.pop_back();
  }
  return released;
}

}  // namespace streampool::detail
