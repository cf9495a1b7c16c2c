// The raw-pointer API: MemoryPool::allocate and deallocate, as cudaMallocAsync and cudaFreeAsync.
#include "pool_core.hpp"

#include <fmt/format.h>

namespace streampool::detail {

void* PoolCore::allocate_raw(std::size_t bytes, cudaStream_t stream,
                             Failure& error) noexcept {
  Block* b = allocate(bytes, stream, error);
  if (b == nullptr) return nullptr;
  RawShard& shard = raw_[(reinterpret_cast<std::uintptr_t>(b->ptr) >> 8) % raw_shards];
  try {
    shard.lock.lock();
    shard.blocks.emplace(b->ptr, b);
    shard.lock.unlock();
  } catch (const std::bad_alloc&) {
    shard.lock.unlock();
    drop(b, stream);
    error = Errc::out_of_memory;
    return nullptr;
  }
  return b->ptr;
}

void PoolCore::deallocate_raw(void* ptr, [[maybe_unused]] std::size_t bytes,
                              cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  RawShard& shard = raw_[(reinterpret_cast<std::uintptr_t>(ptr) >> 8) % raw_shards];
  shard.lock.lock();
  const auto found = shard.blocks.find(ptr);
  Block* b = found != shard.blocks.end() ? found->second : nullptr;
  if (b != nullptr) {
#if STREAMPOOL_DEBUG_CHECKS >= 1
    if (b->requested != bytes) {
      shard.lock.unlock();
      misuse(fmt::format("deallocate({}, {} bytes, stream {}): allocated with {} bytes", ptr,
                         bytes, static_cast<const void*>(stream), b->requested));
    }
#endif
    shard.blocks.erase(found);
  }
  shard.lock.unlock();
  if (b == nullptr) {
    // Not ours, or ours no longer: nothing safe to do (memory_pool.hpp).
#if STREAMPOOL_DEBUG_CHECKS >= 1
    misuse(fmt::format("deallocate({}, {} bytes, stream {}): not allocated by this pool's "
                       "allocate, or already deallocated",
                       ptr, bytes, static_cast<const void*>(stream)));
#endif
    return;
  }
  // The stream the free is ordered on. One behind the gate is known to the gate without asking
  // its id; one that cannot be identified is a use nothing but a device synchronize covers.
  Failure error;
  GateStatus status;
  StreamRegistry::Found on = registry_.find(stream, status, error);
  if (on.state == nullptr && !error) {
    Gate* gate = gate_.load(std::memory_order_acquire);
    on.state = gate != nullptr ? gate->bound_state(stream) : nullptr;
    if (on.state != nullptr) on.generation = on.state->generation.load(std::memory_order_acquire);
  }
  if (on.state == b->home && on.generation == b->home_generation) {
    drop(b, stream);
    return;
  }
  // Freed on another stream than it was allocated on (as cudaFreeAsync allows): its last use is
  // ordered before the work enqueued on `stream` so far.
  forget_recorded(b);
  if (b->keeper == nullptr) announce_dropped(b, stream);
  const Uses uses(RecordedStream{on.state, on.generation});
  drop_slow(b, stream, uses.view());
}

}  // namespace streampool::detail
