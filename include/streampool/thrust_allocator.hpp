// ThrustAllocator<T>: a MemoryPool as the allocator of thrust containers and of thrust
// algorithms' temporary storage, on one stream.
//
//   streampool::ThrustAllocator<float> alloc(pool, stream);
//   thrust::device_vector<float, streampool::ThrustAllocator<float>> v(n, alloc);
//
//   streampool::ThrustAllocator<char> temporaries(pool, stream);
//   thrust::sort(thrust::cuda::par_nosync(temporaries).on(stream), v.begin(), v.end());
//
// Everything happens on the allocator's stream: memory is allocated and dropped there
// (MemoryPool::allocate / deallocate, so a drop is reusable there at once and elsewhere after a
// fence), and a container's own element work (value-initialization, copies into it, the move to
// new storage when it grows) runs there too, through thrust::cuda::par.on(stream): the
// allocator's system, which thrust uses for that work. Rules that follow:
//   - an algorithm that takes the allocator for temporaries must run on the allocator's stream:
//     `.on(stream)` with the same stream (thrust frees its temporaries as soon as it has
//     enqueued the work; the pool orders the reuse after the work on that stream only);
//   - work of other streams on a container's memory must be ordered before its storage is
//     dropped (destruction, growth, shrink_to_fit): order the allocator's stream after it
//     (an event), as for any PooledBuffer;
//   - use the pool of the current device: thrust launches on the current device.
//
// Equality: two allocators are equal when they share the pool and the stream (memory one
// allocated may then be dropped by the other without breaking stream order). A container's
// allocator moves and swaps with its memory; a copy-assigned container keeps its own.
//
// Errors: as MemoryPool::allocate (streampool::Error; out_of_memory, capture codes, ...), and
// Error(Errc::invalid_value) when n * sizeof(T) overflows. Allocating 0 elements gives a null
// pointer. The pool must outlive the allocator and every allocation made through it.
//
// For nvcc only (thrust's CUDA backend); not included by <streampool/streampool.hpp>.
#pragma once

#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>

#include <thrust/device_ptr.h>
#include <thrust/device_reference.h>
#include <thrust/execution_policy.h>

#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>

namespace streampool {

template <class T>
class ThrustAllocator {
 public:
  using value_type = T;
  using pointer = thrust::device_ptr<T>;
  using const_pointer = thrust::device_ptr<const T>;
  using void_pointer = thrust::device_ptr<void>;
  using const_void_pointer = thrust::device_ptr<const void>;
  using reference = thrust::device_reference<T>;
  using const_reference = thrust::device_reference<const T>;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using propagate_on_container_copy_assignment = std::false_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;
  // What thrust runs a container's element work with (thrust::detail::allocator_system): the
  // allocator's stream, synchronized after each operation as thrust's containers are.
  using system_type = decltype(thrust::cuda::par.on(cudaStream_t{}));

  template <class U>
  struct rebind {
    using other = ThrustAllocator<U>;
  };

  // The pool must outlive the allocator; `stream` must be a stream of the pool's device.
  ThrustAllocator(MemoryPool& pool, cudaStream_t stream) noexcept
      : pool_(&pool), stream_(stream), system_(stream) {}

  template <class U>
  ThrustAllocator(const ThrustAllocator<U>& other) noexcept
      : pool_(other.pool_), stream_(other.stream_), system_(other.stream_) {}

  pointer allocate(size_type n) {
    static_assert(alignof(T) <= block_alignment,
                  "the pool's memory is aligned to block_alignment: T needs more");
    if (n == 0) return pointer();
    if (n > std::numeric_limits<size_type>::max() / sizeof(T)) {
      throw Error(Errc::invalid_value, "ThrustAllocator::allocate of " + std::to_string(n) +
                                           " elements of " + std::to_string(sizeof(T)) +
                                           " bytes: the size is not representable");
    }
    return pointer(static_cast<T*>(pool_->allocate(n * sizeof(T), stream_)));
  }

  void deallocate(pointer p, size_type n) noexcept {
    if (p.get() != nullptr) pool_->deallocate(p.get(), n * sizeof(T), stream_);
  }

  // thrust asks for it by this name and this signature (a non-const member returning a
  // reference to system_type).
  system_type& system() noexcept { return system_; }

  MemoryPool& pool() const noexcept { return *pool_; }
  cudaStream_t stream() const noexcept { return stream_; }

  template <class U>
  friend bool operator==(const ThrustAllocator& a, const ThrustAllocator<U>& b) noexcept {
    return &a.pool() == &b.pool() && a.stream() == b.stream();
  }
  template <class U>
  friend bool operator!=(const ThrustAllocator& a, const ThrustAllocator<U>& b) noexcept {
    return !(a == b);
  }

 private:
  template <class>
  friend class ThrustAllocator;

  MemoryPool* pool_;
  cudaStream_t stream_;
  system_type system_;
};

}  // namespace streampool
