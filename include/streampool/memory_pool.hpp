// MemoryPool: a stream-ordered caching allocator for one GPU.
//
// How it works: free blocks are cached per stream (reused on their stream at once, elsewhere once
// a fence recorded after their drop has completed), in size classes up to
// options.size_classes.largest and in a best-fit arena above. The data model, with who may touch
// what under which lock, is drawn once, at the top of lib/pool/pool_core.hpp; docs/design.md says
// why.
//
// The stream contract (the semantics of cudaMallocAsync / cudaFreeAsync):
//   - memory allocated on stream S may be used by work on S at once; other streams must be
//     ordered after S by the caller (events), or named with PooledBuffer::record_stream;
//   - a drop (or deallocate on S) returns the memory "after the work enqueued on S so far": the
//     next allocation on S may get it at once, stream order makes that safe, and that path takes
//     no pool-wide lock and makes no device call beyond the lookup's questions that
//     options.stream_checks asks (none with StreamChecks::none; the default asks the stream's
//     capture status and its id);
//   - another stream gets it only after a fence (an event recorded on S after the drop) has
//     completed, or by waiting on that fence (options.cross_stream_wait), or after a device
//     synchronize. Fences are recorded only inside a call that names their stream (an allocation
//     on it, the drop of one of its buffers, release_stream), when another stream wants that
//     stream's blocks, its unfenced bytes pass their bounds (PoolOptions::unfenced_bytes,
//     unfenced_us), or a growth waits for the stream's own freed memory (below): one fence
//     covers every block dropped before it.
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
#include <streampool/export.hpp>
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

// What every allocation of a pool is aligned to: CUDA aligns its allocations to 256 B, and the
// pool's block sizes and offsets are multiples of its alignment option (at least 256 B). A larger
// alignment option makes block sizes coarser but aligns blocks no further than the segment they
// are cut from.
inline constexpr std::size_t block_alignment = 256;

class STREAMPOOL_API MemoryPool {
 public:
  // Throws Error(Errc::invalid_value) for bad options (or a bad STREAMPOOL_CONF).
  explicit MemoryPool(std::shared_ptr<Device> device, PoolOptions options = {});
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Stream-ordered allocation, as cudaMallocAsync: the memory may be used by work on `stream` at
  // once. Throws Error: invalid_value for 0 bytes, out_of_memory when the device (or
  // max_reserved_bytes) refuses after every reclaim step (or the error of the reclaim's
  // cudaDeviceSynchronize, when that failed), capture_without_pool on a stream captured without
  // begin_capture_with_pool, capture_* codes for captures with a pool; an error a device call
  // caused names the call and keeps CUDA's value (Error::cuda_error()). With expandable segments,
  // an allocation that grows the pool may first wait on the CPU for the work queued on `stream`,
  // where only that work keeps memory the stream freed from being mapped again for it
  // (PoolStats::growth_waits; docs/design.md, "Waiting for one's own"). Aligned to
  // block_alignment.
  void* allocate(std::size_t bytes, cudaStream_t stream);
  // The same, reporting failure through `error` and returning nullptr.
  void* try_allocate(std::size_t bytes, cudaStream_t stream, std::error_code& error) noexcept;
  // Stream-ordered free, as cudaFreeAsync: the memory is reusable after the work enqueued on
  // `stream` so far. `ptr` must come from allocate on this pool and not be deallocated yet;
  // `bytes` is the size asked for. A null `ptr` does nothing. Misuse the pool can see: a debug
  // build (STREAMPOOL_DEBUG_CHECKS >= 1) prints it and aborts, for a `ptr` the pool does not
  // hold (never from its allocate, a PooledBuffer's, or deallocated already) and for another
  // `bytes` than allocated; a release build ignores the first (nothing is freed) and frees the
  // whole allocation for the second. A double free of a pointer allocate has handed out again
  // since frees the new allocation, in every build, as with cudaFreeAsync.
  void deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) noexcept;

  // Forget `stream`: its cached blocks become usable anywhere (after waiting for its work), and
  // a later stream that gets its handle starts afresh. Call it before destroying a stream under
  // StreamChecks::none, and before destroying one whose capture was given up before its end
  // (capture_pool.hpp): a capture counted as under way there is seen ended here, or it throws
  // Error (capture_forbids_call) while CUDA has not said so. Buffers of the stream may still be
  // alive.
  void release_stream(cudaStream_t stream);
  // Return cached memory to the device until at most `bytes_to_keep` stay reserved (as far as
  // wholly free segments, or with expandable segments whole free mappings, allow). Synchronizes
  // the device first.
  void trim(std::size_t bytes_to_keep = 0);
  // Kernels of GPU `device` may read and write this pool's memory from now on, every block
  // already handed out and every later one (as cudaMemPoolSetAccess gives a peer a
  // cudaMallocAsync pool's memory; cudaDeviceEnablePeerAccess alone does not reach memory the
  // pool maps with expandable segments). It enables `device`'s peer access to the pool's device
  // (cudaDeviceEnablePeerAccess, made with `device` current and the caller's current device
  // restored after: for memory from cudaMalloc, all of the device's) and gives each of the
  // pool's mappings read and write access for `device`. The pool's own device: nothing to do.
  // Throws Error: invalid_value for an ordinal below 0 or above 63, CUDA's error where it
  // refuses (a device that does not exist, or cannot reach the pool's: cudaDeviceCanAccessPeer
  // says no), capture_forbids_call during a capture that forbids cudaMalloc. Granting twice is
  // granting once; nothing takes it back. Order a peer's use of a buffer before the buffer's
  // drop with an event the buffer's stream waits on (record_stream names streams of the pool's
  // device).
  void grant_access(int device);

  PoolStats stats() const;
  // Where the reserved memory is now (see PoolBreakdown): takes every lock of the pool in turn.
  PoolBreakdown breakdown() const;
  const PoolOptions& options() const noexcept;
  // The device the pool calls: the one it was given, or a decorator over it (ReservedLimit for
  // max_reserved_bytes, the NVTX layer for nvtx_memory). Keep your own reference to a device
  // whose type you need.
  Device& device() const noexcept;

  // The library's internals (PooledBuffer, CapturePool) reach the pool through this.
  detail::PoolCore& core() const noexcept { return *core_; }

 private:
  detail::PoolCore* core_;  // owned; outlived by it while buffers are alive (see ~MemoryPool)
};

}  // namespace streampool
