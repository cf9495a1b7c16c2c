/* streampool_torch: streampool as PyTorch's CUDA allocator, through C entry points.
 *
 * One MemoryPool per device, made on the first call that names the device (CudaDevice(device):
 * the caller's current device is left alone). The allocator functions are the two that
 * torch.cuda.memory.CUDAPluggableAllocator loads; the rest are for the hooks PyTorch offers a
 * pluggable allocator (set from C++ by libstreampool_torch_hooks, torch_hooks.cpp), and for the
 * Python module (tools/streampool_torch.py): stats and trim. docs/pytorch.md says how the two
 * routes use them.
 *
 * Functions returning int return 0 on success and -1 on failure, with the reason in
 * streampool_torch_last_error() (this thread's last failure). None of them throws, except
 * streampool_torch_alloc_or_throw, which is meant to be called from C++ only. */
#ifndef STREAMPOOL_TORCH_H
#define STREAMPOOL_TORCH_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <sys/types.h>

#if defined(__GNUC__) || defined(__clang__)
#define STREAMPOOL_TORCH_API __attribute__((visibility("default")))
#else
#define STREAMPOOL_TORCH_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Stream-ordered allocation on `device`'s pool, usable by work on `stream` at once. Null for
 * size 0, and on failure (the reason in streampool_torch_last_error; a negative size is one).
 * The null-on-failure form is the one torch.cuda.MemPool needs: PyTorch's own cache takes null
 * as out of memory, empties its cache and retries. */
STREAMPOOL_TORCH_API void* streampool_torch_alloc(ssize_t size, int device, cudaStream_t stream);
/* The same (null for size 0), but a failure throws std::runtime_error with the reason: for
 * torch.cuda.memory.change_current_allocator, where PyTorch uses the pointer it gets unchecked
 * and a C++ exception becomes a Python RuntimeError. */
STREAMPOOL_TORCH_API void* streampool_torch_alloc_or_throw(ssize_t size, int device,
                                                           cudaStream_t stream);
/* Stream-ordered free: reusable after the work enqueued on `stream` so far (and on every stream
 * named by record_stream). `ptr` must come from the allocation functions; an unknown pointer and
 * null do nothing. `size` and `device` are PyTorch's bookkeeping and are not needed. */
STREAMPOOL_TORCH_API void streampool_torch_free(void* ptr, ssize_t size, int device,
                                                cudaStream_t stream);

/* Route 2 (torch.cuda.MemPool): PyTorch's cache asks for whole segments, keeps them until it
 * empties its cache, and begins and ends graph captures without telling the allocator.
 * segment_alloc is streampool_torch_alloc, except on a capturing stream: there the segment is
 * allocated on a stream of the pool's own that no work is enqueued on (so that nothing the
 * capture refuses is called on the captured stream, and the segment is clean), with the capture
 * noticed (CaptureNotice), and is no stream's to reuse until it is freed (refused with
 * cross_stream_wait). segment_free synchronizes the device before the segment goes back, as the
 * cudaFree PyTorch's cache counts on would wait (for a graph's replays among others); during a
 * capture of route 1 the segment waits for the next streampool_torch_trim instead. */
STREAMPOOL_TORCH_API void* streampool_torch_segment_alloc(ssize_t size, int device,
                                                          cudaStream_t stream);
STREAMPOOL_TORCH_API void streampool_torch_segment_free(void* ptr, ssize_t size, int device,
                                                        cudaStream_t stream);

/* Tensor.record_stream: the memory at `ptr` is also used by work on `stream`, and is recycled
 * only after that work too. Null (an empty tensor) does nothing; -1 for a pointer these
 * functions did not hand out (or freed). */
STREAMPOOL_TORCH_API int streampool_torch_record_stream(void* ptr, cudaStream_t stream);

/* streampool's PoolStats of one device, flattened; plus the failed allocations of this layer. */
typedef struct streampool_torch_stats {
  int64_t requested_bytes_current, requested_bytes_peak, requested_bytes_total;
  int64_t reserved_bytes_current, reserved_bytes_peak, reserved_bytes_total;
  int64_t live_allocations_current, live_allocations_peak, live_allocations_total;
  int64_t segments; /* device allocations held now */
  uint64_t cache_hits, cache_misses, device_allocations, device_frees, fences_recorded,
      cross_stream_reuses, blocking_fallbacks, oom_retries, growth_waits;
  uint64_t failed_allocations; /* allocations this layer could not serve */
  uint64_t out_of_memory;      /* of those, the ones that failed for lack of memory */
  uint64_t reserved_limit;     /* bytes, from the memory fraction; 0: none */
} streampool_torch_stats;

/* sizeof(streampool_torch_stats), for a binding to check its own layout against. */
STREAMPOOL_TORCH_API size_t streampool_torch_stats_size(void);
/* 0 with `out` filled; 1 (and `out` zeroed) when no pool of `device` exists yet; -1 on failure. */
STREAMPOOL_TORCH_API int streampool_torch_get_stats(int device, streampool_torch_stats* out);

/* torch.cuda.empty_cache: returns the cached memory of `device`'s pool (-1: of every pool made)
 * to the device, after a device synchronize; private pools PyTorch has released (graphs reset)
 * go first. Skipped while a capture is under way (its synchronize would invalidate it). */
STREAMPOOL_TORCH_API int streampool_torch_trim(int device);

/* MemoryPool::grant_access: kernels of GPU `peer` may read and write `device`'s pool's memory,
 * every block handed out and every later one (PyTorch's own enablePeerAccess reaches memory from
 * cudaMalloc only, not the pool's mappings). 0, or -1 on failure (a peer that cannot reach
 * `device`, or no such device). */
STREAMPOOL_TORCH_API int streampool_torch_grant_access(int device, int peer);

/* torch.cuda.set_per_process_memory_fraction: `device`'s pool reserves at most
 * fraction x the device's total memory (0 < fraction <= 1; 1 is the whole device). */
STREAMPOOL_TORCH_API int streampool_torch_set_memory_fraction(double fraction, int device);

/* The CUDA graph hooks, as PyTorch's CUDAGraph calls them: begin before cudaStreamBeginCapture
 * on `stream`, end after cudaStreamEndCapture, release when the graph is reset. The private pool
 * is named by PyTorch's MempoolId_t (first, second); captures that name the same id share it, one
 * after another. -1 (and nothing bound) on failure. */
STREAMPOOL_TORCH_API int streampool_torch_begin_allocate_to_pool(int device, uint64_t id_first,
                                                                 uint64_t id_second,
                                                                 cudaStream_t stream);
STREAMPOOL_TORCH_API int streampool_torch_end_allocate_to_pool(int device, uint64_t id_first,
                                                               uint64_t id_second);
STREAMPOOL_TORCH_API int streampool_torch_release_pool(int device, uint64_t id_first,
                                                       uint64_t id_second);

/* This thread's last failure, or "" (valid until this thread's next call). */
STREAMPOOL_TORCH_API const char* streampool_torch_last_error(void);
/* 1 when this thread's last failure was an allocation refused for lack of memory (after the
 * pool reclaimed what it could), 0 otherwise. */
STREAMPOOL_TORCH_API int streampool_torch_last_error_was_out_of_memory(void);

#ifdef __cplusplus
}
#endif

#endif /* STREAMPOOL_TORCH_H */
