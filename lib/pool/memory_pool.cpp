// MemoryPool and PooledBuffer: the public face of PoolCore.
#include "pool_core.hpp"

#include "../device/nvtx_memory.hpp"
#include "../device/reserved_limit.hpp"

#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <fmt/format.h>

namespace streampool {
namespace detail {
// The Error of a failed allocation: out of memory names the request and what the pool and the
// device hold; a failed device call names the call and keeps CUDA's error.
Error allocation_error(PoolCore& core, const Failure& failure, std::size_t bytes,
                       cudaStream_t stream);
}  // namespace detail

namespace {

PoolOptions checked(PoolOptions options) {
  if (options.read_environment) options = PoolOptions::from_environment(options);
  if (std::string why = options.validate(); !why.empty()) {
    throw Error(Errc::invalid_value, "MemoryPool options: " + why);
  }
  return options;
}

}  // namespace

MemoryPool::MemoryPool(std::shared_ptr<Device> device, PoolOptions options) {
  if (device == nullptr) throw Error(Errc::invalid_value, "MemoryPool: no device");
  options = checked(std::move(options));
  // The reserved-memory limit is a layer over the device, not a branch in the pool.
  if (options.max_reserved_bytes != 0) {
    device = std::make_shared<detail::ReservedLimit>(std::move(device), options.max_reserved_bytes);
  }
  // So is compute-sanitizer's view of the blocks: outermost, so that it sees every segment.
  if (options.nvtx_memory) device = std::make_shared<detail::NvtxMemory>(std::move(device));
  core_ = new detail::PoolCore(std::move(device), options);
}

MemoryPool::~MemoryPool() { core_->orphan(); }

void* MemoryPool::allocate(std::size_t bytes, cudaStream_t stream) {
  detail::Failure failure;
  void* ptr = core_->allocate_raw(bytes, stream, failure);
  if (ptr == nullptr) throw detail::allocation_error(*core_, failure, bytes, stream);
  return ptr;
}

void* MemoryPool::try_allocate(std::size_t bytes, cudaStream_t stream,
                               std::error_code& error) noexcept {
  detail::Failure failure;
  void* ptr = core_->allocate_raw(bytes, stream, failure);
  error = failure.error_code();
  return ptr;
}

void MemoryPool::deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) noexcept {
  core_->deallocate_raw(ptr, bytes, stream);
}

void MemoryPool::release_stream(cudaStream_t stream) { core_->release_stream(stream); }

void MemoryPool::trim(std::size_t bytes_to_keep) { core_->trim(bytes_to_keep); }

PoolStats MemoryPool::stats() const { return core_->stats(); }

PoolBreakdown MemoryPool::breakdown() const { return core_->breakdown(); }

const PoolOptions& MemoryPool::options() const noexcept { return core_->options(); }

Device& MemoryPool::device() const noexcept { return core_->device(); }

namespace detail {

Error allocation_error(PoolCore& core, const Failure& failure, std::size_t bytes,
                       cudaStream_t stream) {
  if (failure == Errc::out_of_memory) {
    return error_of(failure, core.out_of_memory_message(bytes, stream));
  }
  if (failure == Errc::invalid_value && failure.cuda == cudaSuccess) {
    return Error(failure.code, fmt::format("allocation of {} bytes: the size must be positive "
                                           "and representable",
                                           bytes));
  }
  return error_of(failure, fmt::format("allocation of {} bytes on stream {}", bytes,
                                       static_cast<const void*>(stream)));
}

Block* allocate_block(MemoryPool& pool, std::size_t bytes, cudaStream_t stream,
                      std::error_code& error) noexcept {
  Failure failure;
  Block* block = pool.core().allocate(bytes, stream, failure);
  error = failure.error_code();
  return block;
}

Block* allocate_block_or_throw(MemoryPool& pool, std::size_t bytes, cudaStream_t stream) {
  Failure failure;
  Block* block = pool.core().allocate(bytes, stream, failure);
  if (block == nullptr) throw allocation_error(pool.core(), failure, bytes, stream);
  return block;
}

void* block_address(const Block* block) noexcept { return block->ptr; }

void release_block(Block* block, cudaStream_t stream) noexcept {
  block->home->core->drop(block, stream);
}

void record_block_stream(Block* block, cudaStream_t stream) {
  block->home->core->record_stream(block, stream);
}

}  // namespace detail
}  // namespace streampool
