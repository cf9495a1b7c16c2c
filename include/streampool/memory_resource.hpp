// PoolResource: a MemoryPool as a CCCL memory resource (`cuda::mr`), for code written against
// `cuda::mr::resource_ref` / `async_resource_ref` and the containers that take one.
//
//   streampool::PoolResource resource(pool);
//   void* p = resource.allocate(stream, bytes, 256);   // CCCL >= 3.1: stream first
//   resource.deallocate(stream, p, bytes, 256);
//   cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref(resource);  // CCCL 3.0
//
// CCCL renamed the members in 3.1, and both spellings are here, so that one type satisfies the
// concepts of either version (their arities differ, so the overloads never compete):
//
//   CCCL 3.0 (CUDA 13.0)                          CCCL >= 3.1
//   allocate(bytes, alignment)                    allocate_sync(bytes, alignment)
//   deallocate(ptr, bytes, alignment)             deallocate_sync(ptr, bytes, alignment)
//   allocate_async(bytes, alignment, stream)      allocate(stream, bytes, alignment)
//   deallocate_async(ptr, bytes, alignment, stream)  deallocate(stream, ptr, bytes, alignment)
//
// With CCCL 3.0 the concepts exist only under LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
// (and with 3.1 resource_ref still does): this header defines it when it is not defined, and with
// CCCL 3.0 stops with an #error naming the macro when a CCCL memory-resource header was included
// before without it.
//
// Semantics, member by member:
//   - the stream-ordered pair is MemoryPool::allocate / deallocate on that stream, with the
//     pool's stream contract (include/streampool/memory_pool.hpp);
//   - allocate_sync (3.0: allocate) allocates on the resource's synchronous stream (the legacy
//     default stream unless the constructor names another) and synchronizes that stream, so the
//     memory is idle when it returns and any stream, or the host, may use it at once;
//   - deallocate_sync (3.0: deallocate) requires, as CCCL does, that no work pending on any
//     stream still uses the memory; it drops it on the synchronous stream.
//   - alignment: the pool's blocks are multiples of its alignment (at least 256 B) carved from
//     device allocations that CUDA aligns to 256 B, so any power of two up to
//     PoolResource::guaranteed_alignment is honoured; a larger one, or one that is not a power of
//     two, is refused: Error(Errc::invalid_value) naming it. Deallocation ignores the alignment.
//   - 0 bytes: allocation returns nullptr and deallocating nullptr does nothing (the pool itself
//     refuses 0 bytes; generic code asks for empty buffers).
//   - errors: as MemoryPool::allocate, streampool::Error (out_of_memory, capture codes, ...).
//   - equality: two PoolResources are equal when they use the same pool: memory from one may be
//     deallocated through the other.
//   - properties: cuda::mr::device_accessible (device memory; not host accessible).
//
// A PoolResource holds a reference to its pool, which must outlive it and every allocation made
// through it (as for MemoryPool::allocate). It is cheap to copy.
//
// Needs CCCL's headers on the include path: nvcc has them; a host compiler needs the toolkit's
// include/cccl (or a CCCL package). Not included by <streampool/streampool.hpp> for that reason.
#pragma once

#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>

#include <cuda/version>

#if CCCL_MAJOR_VERSION < 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION < 1)
#  define STREAMPOOL_CCCL_EXPERIMENTAL_MR 1
#else
#  define STREAMPOOL_CCCL_EXPERIMENTAL_MR 0
#endif
// CCCL 3.0 keeps the concepts behind the macro, and 3.1 still keeps resource_ref there.
#if !defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
#  if STREAMPOOL_CCCL_EXPERIMENTAL_MR && \
      (defined(_CUDA__MEMORY_RESOURCE_PROPERTIES_H) || defined(_CUDA__MEMORY_RESOURCE_RESOURCE_H))
#    error "<streampool/memory_resource.hpp>: a CCCL memory-resource header was included " \
           "without LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE; define it for the whole " \
           "build (-DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)"
#  endif
#  define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>
#include <string>

namespace streampool {

class PoolResource {
 public:
  // What allocations through the pool are aligned to, whatever its options: CUDA aligns device
  // allocations to 256 B and the pool carves blocks at multiples of its alignment (>= 256 B).
  static constexpr std::size_t guaranteed_alignment = 256;
  static_assert(guaranteed_alignment == ::cuda::mr::default_cuda_malloc_alignment,
                "CCCL's default alignment for device memory is what the pool guarantees");

  // `sync_stream`: the stream allocate_sync and deallocate_sync use (see above). The pool must
  // outlive the resource.
  explicit PoolResource(MemoryPool& pool, cudaStream_t sync_stream = cudaStreamLegacy) noexcept
      : pool_(&pool), sync_stream_(sync_stream) {}

  // --- CCCL >= 3.1 ------------------------------------------------------------------------

  void* allocate(::cuda::stream_ref stream, std::size_t bytes,
                 std::size_t alignment = guaranteed_alignment) {
    check_alignment(alignment, bytes);
    if (bytes == 0) return nullptr;
    return pool_->allocate(bytes, stream.get());
  }
  void deallocate(::cuda::stream_ref stream, void* ptr, std::size_t bytes,
                  std::size_t /*alignment*/ = guaranteed_alignment) noexcept {
    if (ptr != nullptr) pool_->deallocate(ptr, bytes, stream.get());
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment = guaranteed_alignment) {
    check_alignment(alignment, bytes);
    if (bytes == 0) return nullptr;
    void* ptr = pool_->allocate(bytes, sync_stream_);
    // The block may have been used on this stream until now (same-stream reuse needs no fence):
    // after the synchronize no work uses it, so every stream and the host may.
    const cudaError_t status = pool_->device().stream_synchronize(sync_stream_);
    if (status != cudaSuccess) {
      pool_->deallocate(ptr, bytes, sync_stream_);
      throw_on_cuda_error(status, "PoolResource::allocate_sync: cudaStreamSynchronize");
    }
    return ptr;
  }
  void deallocate_sync(void* ptr, std::size_t bytes,
                       std::size_t /*alignment*/ = guaranteed_alignment) noexcept {
    if (ptr != nullptr) pool_->deallocate(ptr, bytes, sync_stream_);
  }

  // --- CCCL 3.0 (CUDA 13.0) ---------------------------------------------------------------

  void* allocate(std::size_t bytes, std::size_t alignment = guaranteed_alignment) {
    return allocate_sync(bytes, alignment);
  }
  void deallocate(void* ptr, std::size_t bytes,
                  std::size_t alignment = guaranteed_alignment) noexcept {
    deallocate_sync(ptr, bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    return allocate(stream, bytes, alignment);
  }
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment,
                        ::cuda::stream_ref stream) noexcept {
    deallocate(stream, ptr, bytes, alignment);
  }

  // ----------------------------------------------------------------------------------------

  MemoryPool& pool() const noexcept { return *pool_; }
  cudaStream_t sync_stream() const noexcept { return sync_stream_; }

  friend bool operator==(const PoolResource& a, const PoolResource& b) noexcept {
    return a.pool_ == b.pool_;
  }
  friend bool operator!=(const PoolResource& a, const PoolResource& b) noexcept {
    return !(a == b);
  }
  // The memory is device memory.
  friend void get_property(const PoolResource&, ::cuda::mr::device_accessible) noexcept {}

 private:
  static void check_alignment(std::size_t alignment, std::size_t bytes) {
    const bool power_of_two = alignment != 0 && (alignment & (alignment - 1)) == 0;
    if (!power_of_two || alignment > guaranteed_alignment) {
      throw Error(Errc::invalid_value,
                  "PoolResource: an alignment of " + std::to_string(alignment) + " bytes (for " +
                      std::to_string(bytes) + " bytes) is not a power of two up to " +
                      std::to_string(guaranteed_alignment) + ", what the pool guarantees");
    }
  }

  MemoryPool* pool_;
  cudaStream_t sync_stream_;
};

}  // namespace streampool
