// MemoryPool: a stream-ordered caching allocator for one GPU.
//
// The data model, and who may touch what:
//
//   MemoryPool ──owns──► PoolCore: lives until the MemoryPool object and the last buffer are gone
//    │
//    ├─ StreamState, one per CUDA stream id          guarded by the state's own spin lock, which
//    │   ├─ free[class]: blocks dropped on it         only two threads on one stream, or a steal,
//    │   │   (newest first: reused on this stream     ever contend for
//    │   │    at once; oldest last: stolen first)
//    │   ├─ fences: events recorded on this stream, oldest first
//    │   └─ counters, summed by stats()
//    ├─ registry: stream id → StreamState             registry mutex (first sight of a stream)
//    ├─ depot[class]: clean blocks, safe anywhere     depot mutex (cache misses only)
//    ├─ arena: device segments → ranges in address    arena mutex (large requests, new slabs,
//    │   order; free ranges indexed by size            reclaim)
//    └─ event pool: idle fence events                 event mutex
//
//   block: a range of device memory. Small requests (up to options.size_classes.largest) get a
//   block of their size class, carved from a slab the arena hands out; large requests get a range
//   of the arena, best-fit, split from a free range and coalesced back with its free neighbours.
//
// The stream contract (the semantics of cudaMallocAsync / cudaFreeAsync):
//   - memory allocated on stream S may be used by work on S at once; other streams must be
//     ordered after S by the caller (events), or named with PooledBuffer::record_stream;
//   - a drop (or deallocate on S) returns the memory "after the work enqueued on S so far": the
//     next allocation on S may get it at once, stream order makes that safe, and that path takes
//     no pool-wide lock and makes no device call;
//   - another stream gets it only after a fence (an event recorded on S after the drop) has
//     completed, or by waiting on that fence (options.cross_stream_wait), or after a device
//     synchronize. Fences are recorded only inside a call that names their stream (an allocation
//     on it, the drop of one of its buffers, release_stream), and by default only when another
//     stream wants that stream's blocks: one fence covers every block dropped before it.
//
// What the caller must do: drop every buffer used on a stream (its own, and those record_stream
// named it for) before destroying that stream: the drop records fences on the buffer's streams,
// and a destroyed stream's handle may already name another stream. Under StreamChecks::none, also
// call release_stream before destroying a stream. Raw allocations (allocate) must be deallocated
// before the pool is destroyed; PooledBuffers may outlive it.
//
// Thread-safe. Destroying a MemoryPool while buffers are alive is safe: their memory goes back to
// the device when the last of them is dropped.
#pragma once

#include <streampool/device.hpp>
#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>

#include <cstddef>
#include <memory>
#include <system_error>

namespace streampool {

namespace detail {
class PoolCore;
struct Block;
}  // namespace detail

class MemoryPool {
 public:
  // Throws Error(Errc::invalid_value) for bad options (or a bad STREAMPOOL_CONF).
  explicit MemoryPool(std::shared_ptr<Device> device, PoolOptions options = {});
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Stream-ordered allocation, as cudaMallocAsync: the memory may be used by work on `stream` at
  // once. Throws Error: invalid_value for 0 bytes, out_of_memory when the device (or
  // max_reserved_bytes) refuses after every reclaim step, capture_without_pool on a stream
  // captured without begin_capture_with_pool, capture_* codes for captures with a pool.
  void* allocate(std::size_t bytes, cudaStream_t stream);
  // The same, reporting failure through `error` and returning nullptr.
  void* try_allocate(std::size_t bytes, cudaStream_t stream, std::error_code& error) noexcept;
  // Stream-ordered free, as cudaFreeAsync: the memory is reusable after the work enqueued on
  // `stream` so far. `ptr` must come from allocate on this pool; `bytes` is the size asked for.
  void deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) noexcept;

  // Forget `stream`: its cached blocks become usable anywhere (after waiting for its work), and
  // a later stream that gets its handle starts afresh. Call it before destroying a stream under
  // StreamChecks::none. Buffers of the stream may still be alive.
  void release_stream(cudaStream_t stream);
  // Return cached memory to the device until at most `bytes_to_keep` stay reserved (as far as
  // wholly free segments allow). Synchronizes the device first.
  void trim(std::size_t bytes_to_keep = 0);

  PoolStats stats() const;
  const PoolOptions& options() const noexcept;
  Device& device() const noexcept;

  // The library's internals (PooledBuffer, CapturePool) reach the pool through this.
  detail::PoolCore& core() const noexcept { return *core_; }

 private:
  detail::PoolCore* core_;  // owned; outlived by it while buffers are alive (see ~MemoryPool)
};

}  // namespace streampool
