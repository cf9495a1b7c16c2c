// The slow path of small blocks, taken when a stream's own list of the class is empty:
//
//   1. the depot: clean blocks, safe on any stream;
//   2. other streams' lists: blocks whose fence has completed (or, with cross_stream_wait, whose
//      fence is recorded: this stream then waits on it); a stream with only unfenced blocks is
//      asked to record a fence at its next call;
//   3. a new slab from the arena: its first block for this allocation, the rest to the depot;
//   4. the out-of-memory ladder (reclaim.cpp), then 1-3 again.
//
// Blocks taken in bulk (from the depot or another stream) go to this stream's list, tagged as if
// dropped here now: safe here at once, and for others after this stream's next fence.
#include "pool_core.hpp"

#include <streampool/error.hpp>

namespace streampool::detail {
namespace {
constexpr std::size_t batch = 16;  // blocks moved to a stream's list per depot visit or steal
}

Block* PoolCore::allocate_small_slow(StreamState& s, std::uint32_t size_class,
                                     std::error_code& error) noexcept {
  s.lock.lock();
  ++s.counters.misses;
  s.lock.unlock();
  const auto attempt = [&]() -> Block* {
    if (Block* b = take_from_depot(s, size_class)) return b;
    if (Block* b = steal(s, size_class)) return b;
    drain_parked();
    if (Block* b = take_from_depot(s, size_class)) return b;
    return carve_slab(size_class, error);
  };
  return with_reclaim(attempt, error);
}

Block* PoolCore::take_from_depot(StreamState& s, std::uint32_t size_class) noexcept {
  Block* taken[batch];
  std::size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(depot_mutex_);
    BlockList& list = depot_[size_class];
    while (n < batch && !list.empty()) taken[n++] = list.pop_front();
  }
  if (n == 0) return nullptr;
  s.lock.lock();
  for (std::size_t i = 1; i < n; ++i) put_back(s, taken[i]);
  s.lock.unlock();
  return taken[0];
}

Block* PoolCore::steal(StreamState& s, std::uint32_t size_class) noexcept {
  std::vector<StreamState*> others;
  try {
    std::lock_guard<std::mutex> registry(registry_mutex_);
    others.reserve(states_.size());
    for (const auto& state : states_) {
      if (state.get() != &s) others.push_back(state.get());
    }
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  Block* taken[batch];
  std::size_t n = 0;
  for (StreamState* other : others) {
    other->lock.lock();
    BlockList& list = other->free[size_class];
    if (list.empty()) {
      other->lock.unlock();
      continue;
    }
    if (list.tail->tag >= other->completed.load(std::memory_order_relaxed)) {
      refresh_fences(*other);
    }
    // Oldest blocks first: their fences are the likeliest to have completed.
    while (n < batch && !list.empty() &&
           list.tail->tag < other->completed.load(std::memory_order_relaxed)) {
      Block* b = list.tail;
      list.remove(b);
      taken[n++] = b;
    }
    if (n == 0 && options_.cross_stream_wait && s.addressable() &&
        list.tail->tag < other->fence_seq.load(std::memory_order_relaxed)) {
      // The fence is recorded but still pending: wait on it on the GPU rather than grow.
      const std::uint64_t tag = list.tail->tag;
      cudaEvent_t event = fence_event(*other, tag);
      if (event != nullptr && device_->stream_wait_event(s.handle, event) == cudaSuccess) {
        while (n < batch && !list.empty() && list.tail->tag <= tag) {
          Block* b = list.tail;
          list.remove(b);
          taken[n++] = b;
        }
      }
    }
    if (n == 0 && (other->attention.load(std::memory_order_relaxed) & retired) == 0 &&
        list.tail->tag >= other->fence_seq.load(std::memory_order_relaxed)) {
      // Unfenced: only the stream's own next call may record its fence. Ask for one.
      other->attention.fetch_or(wants_fence, std::memory_order_relaxed);
    }
    other->lock.unlock();
    if (n != 0) break;
  }
  if (n == 0) return nullptr;
  s.lock.lock();
  s.counters.cross_stream += n;
  for (std::size_t i = 1; i < n; ++i) put_back(s, taken[i]);
  s.lock.unlock();
  return taken[0];
}

Block* PoolCore::carve_slab(std::uint32_t size_class, std::error_code& error) noexcept {
  const std::size_t block = classes_.block_size(size_class);
  const std::size_t per_slab = options_.slab_bytes > block ? options_.slab_bytes / block : 1;
  const std::size_t rounding = options_.large_rounding;
  const std::size_t range_bytes = (per_slab * block + rounding - 1) / rounding * rounding;
  std::unique_ptr<Slab> slab;
  try {
    slab = std::make_unique<Slab>();
    slab->size_class = size_class;
    slab->blocks.resize(range_bytes / block);
  } catch (const std::bad_alloc&) {
    error = make_error_code(Errc::out_of_memory);
    return nullptr;
  }
  Slab* raw = slab.get();
  {
    std::lock_guard<std::mutex> arena(arena_mutex_);
    Block* range = arena_take(nullptr, range_bytes, error);
    if (range == nullptr) return nullptr;
    range->is_slab = true;
    raw->range = range;
    try {
      slabs_.push_back(std::move(slab));
    } catch (const std::bad_alloc&) {
      range->is_slab = false;
      arena_free(range);
      error = make_error_code(Errc::out_of_memory);
      return nullptr;
    }
  }
  std::byte* ptr = raw->range->ptr;
  for (Block& b : raw->blocks) {
    b.ptr = ptr;
    b.size = block;
    b.size_class = size_class;
    b.slab = raw;
    b.state = nullptr;
    ptr += block;
  }
  // The first block is the caller's: other threads may empty the depot before it looks there.
  std::lock_guard<std::mutex> lock(depot_mutex_);
  for (std::size_t i = 1; i < raw->blocks.size(); ++i) depot_[size_class].push_back(&raw->blocks[i]);
  return &raw->blocks[0];
}

}  // namespace streampool::detail
