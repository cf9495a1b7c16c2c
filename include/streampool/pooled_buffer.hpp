// PooledBuffer<T>: the RAII handle of one stream-ordered allocation from a MemoryPool.
//
//   auto buffer = streampool::PooledBuffer<float>::alloc_async(pool, n, stream);
//   kernel<<<grid, block, 0, stream>>>(buffer.data(), n);
//   // dropped here: reusable on `stream` at once, elsewhere after a fence
//
// Use the memory on its stream; to use it on another stream too, order that stream after the
// allocation (an event) and call record_stream(other) so that the memory is recycled only after
// the other stream's work as well. Drop the buffer before destroying any of those streams. The
// destructor never throws and never blocks the CPU on the normal path (it may record fences; it
// does not wait for them).
#pragma once

#include <streampool/error.hpp>
#include <streampool/export.hpp>
#include <streampool/memory_pool.hpp>

#include <cuda.h>

#include <cstddef>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace streampool {

namespace detail {
// The pool's side of a PooledBuffer (lib/pool/memory_pool.cpp).
STREAMPOOL_API Block* allocate_block(MemoryPool& pool, std::size_t bytes, cudaStream_t stream,
                                     std::error_code& error) noexcept;
STREAMPOOL_API void* block_address(const Block* block) noexcept;
STREAMPOOL_API void release_block(Block* block, cudaStream_t stream) noexcept;
STREAMPOOL_API void record_block_stream(Block* block, cudaStream_t stream);
// Throws the Error MemoryPool::allocate would (a failed device call named, CUDA's error kept).
STREAMPOOL_API Block* allocate_block_or_throw(MemoryPool& pool, std::size_t bytes,
                                              cudaStream_t stream);
}  // namespace detail

// An element type whose alignment is more than the pool's blocks have (block_alignment) cannot be
// held: its pointers would be misaligned.
template <class T>
  requires(alignof(T) <= block_alignment)
class PooledBuffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "PooledBuffer holds device memory: its element type must be trivially copyable");

 public:
  // An empty buffer.
  PooledBuffer() noexcept = default;

  // `n` elements on `stream`. Throws Error: Errc::invalid_value when n is 0 or n * sizeof(T)
  // overflows; out_of_memory and the others of MemoryPool::allocate when the pool fails.
  static PooledBuffer alloc_async(MemoryPool& pool, std::size_t n, cudaStream_t stream) {
    if (n == 0 || n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw Error(Errc::invalid_value, "PooledBuffer::alloc_async of " + std::to_string(n) +
                                           " elements of " + std::to_string(sizeof(T)) +
                                           " bytes: the size must be positive and representable");
    }
    detail::Block* block = detail::allocate_block_or_throw(pool, n * sizeof(T), stream);
    return PooledBuffer(block, static_cast<T*>(detail::block_address(block)), n, stream);
  }

  // The same without exceptions: an empty buffer and `error` set on failure.
  static PooledBuffer try_alloc_async(MemoryPool& pool, std::size_t n, cudaStream_t stream,
                                      std::error_code& error) noexcept {
    error.clear();
    if (n == 0 || n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      error = make_error_code(Errc::invalid_value);
      return {};
    }
    detail::Block* block = detail::allocate_block(pool, n * sizeof(T), stream, error);
    if (block == nullptr) return {};
    return PooledBuffer(block, static_cast<T*>(detail::block_address(block)), n, stream);
  }

  PooledBuffer(PooledBuffer&& other) noexcept
      : block_(std::exchange(other.block_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        len_(std::exchange(other.len_, 0)),
        stream_(std::exchange(other.stream_, nullptr)) {}

  PooledBuffer& operator=(PooledBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      block_ = std::exchange(other.block_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      len_ = std::exchange(other.len_, 0);
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }

  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;

  ~PooledBuffer() { reset(); }

  // Drops the memory now (stream-ordered, as the destructor does); the buffer becomes empty.
  void reset() noexcept {
    if (block_ != nullptr) detail::release_block(std::exchange(block_, nullptr), stream_);
    data_ = nullptr;
    len_ = 0;
    stream_ = nullptr;
  }

  std::size_t len() const noexcept { return len_; }
  bool is_empty() const noexcept { return block_ == nullptr; }
  std::size_t byte_size() const noexcept { return len_ * sizeof(T); }
  T* data() const noexcept { return data_; }
  CUdeviceptr as_device_ptr() const noexcept {
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(data_));
  }
  // The stream the memory was allocated on.
  cudaStream_t stream() const noexcept { return stream_; }

  // The memory is also used by work on `other`: it is recycled only after that work too. Throws
  // Error when `other` cannot be identified, or (invalid_value) on an empty buffer.
  void record_stream(cudaStream_t other) {
    if (block_ == nullptr) throw Error(Errc::invalid_value, "record_stream on an empty buffer");
    detail::record_block_stream(block_, other);
  }

 private:
  PooledBuffer(detail::Block* block, T* data, std::size_t len, cudaStream_t stream) noexcept
      : block_(block), data_(data), len_(len), stream_(stream) {}

  detail::Block* block_ = nullptr;
  T* data_ = nullptr;
  std::size_t len_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace streampool
