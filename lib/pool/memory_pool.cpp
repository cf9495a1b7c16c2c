// MemoryPool and PooledBuffer: the public face of PoolCore.
//
// Each entry point reads the core's observer (observer.hpp) once, after the core's work for an
// allocation and before it for a free; off, that is one load of a pointer written only when a
// recording starts or stops, and a branch not taken. The core's fast paths are not touched.
#include "pool_core.hpp"

#include "../device/nvtx_memory.hpp"

#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>
#include <streampool/reserved_limit.hpp>
#include <streampool/trace_recorder.hpp>

#include <fmt/format.h>

namespace streampool {
namespace detail {
// The Error of a failed allocation: out of memory names the request and what the pool and the
// device hold; a failed device call names the call and keeps CUDA's error.
Error allocation_error(PoolCore& core, const Failure& failure, std::size_t bytes,
                       cudaStream_t stream);

// The observed paths, out of line and each a tail call of its entry point, so that the entry
// point's own code stays a load, a test and a jump: with the observer's call inline, GCC saved
// registers in release_block's prologue on every drop (16 instructions a drop against 6).
[[gnu::noinline, gnu::cold]] void* observed_allocation(Observer& observer, void* ptr,
                                                       std::size_t bytes,
                                                       cudaStream_t stream) noexcept {
  observer.allocated(ptr, bytes, stream);
  return ptr;
}
[[gnu::noinline, gnu::cold]] Block* observed_allocation(Observer& observer, Block* block,
                                                        std::size_t bytes,
                                                        cudaStream_t stream) noexcept {
  observer.allocated(block->ptr, bytes, stream);
  return block;
}
[[gnu::noinline, gnu::cold]] void observed_drop(Observer& observer, PoolCore& core, Block* block,
                                                cudaStream_t stream) noexcept {
  observer.dropping(block->ptr);
  core.drop(block, stream);
}
[[gnu::noinline, gnu::cold]] void observed_deallocate(Observer& observer, PoolCore& core,
                                                      void* ptr, std::size_t bytes,
                                                      cudaStream_t stream) noexcept {
  observer.freeing(ptr, stream);
  core.deallocate_raw(ptr, bytes, stream);
}
}  // namespace detail

namespace {

// The options given in code first: a fault in them is not STREAMPOOL_CONF's. Then the
// environment's, whose parse() validates what it makes of them and names STREAMPOOL_CONF.
PoolOptions checked(PoolOptions options) {
  if (std::string why = options.validate(); !why.empty()) {
    throw Error(Errc::invalid_value, "MemoryPool options: " + why);
  }
  if (options.read_environment) options = PoolOptions::from_environment(options);
  return options;
}

}  // namespace

MemoryPool::MemoryPool(std::shared_ptr<Device> device, PoolOptions options) {
  if (device == nullptr) throw Error(Errc::invalid_value, "MemoryPool: no device");
  options = checked(std::move(options));
  // The reserved-memory limit is a layer over the device, not a branch in the pool.
  if (options.max_reserved_bytes != 0) {
    device = std::make_shared<ReservedLimit>(std::move(device), options.max_reserved_bytes);
  }
  // So is compute-sanitizer's view of the blocks: outermost, so that it sees every segment.
  if (options.nvtx_memory) device = std::make_shared<detail::NvtxMemory>(std::move(device));
  core_ = new detail::PoolCore(std::move(device), options);
  // The trace recorder is a layer over the pool too: it watches the entry points below.
  if (!options.trace_file.empty()) {
    try {
      start_trace(*this, options.trace_file);
    } catch (...) {
      core_->orphan();  // no buffer exists yet: the core goes at once
      throw;
    }
  }
}

MemoryPool::~MemoryPool() {
  if (detail::Observer* observer = core_->installed_observer()) observer->closing();
  core_->orphan();
}

void* MemoryPool::allocate(std::size_t bytes, cudaStream_t stream) {
  detail::Failure failure;
  void* ptr = core_->allocate_raw(bytes, stream, failure);
  if (ptr == nullptr) throw detail::allocation_error(*core_, failure, bytes, stream);
  if (detail::Observer* observer = core_->observer()) [[unlikely]] {
    return detail::observed_allocation(*observer, ptr, bytes, stream);
  }
  return ptr;
}

void* MemoryPool::try_allocate(std::size_t bytes, cudaStream_t stream,
                               std::error_code& error) noexcept {
  detail::Failure failure;
  void* ptr = core_->allocate_raw(bytes, stream, failure);
  error = failure.error_code();
  if (detail::Observer* observer = core_->observer(); observer != nullptr && ptr != nullptr)
      [[unlikely]] {
    return detail::observed_allocation(*observer, ptr, bytes, stream);
  }
  return ptr;
}

void MemoryPool::deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) noexcept {
  if (detail::Observer* observer = core_->observer(); observer != nullptr && ptr != nullptr)
      [[unlikely]] {
    return detail::observed_deallocate(*observer, *core_, ptr, bytes, stream);
  }
  core_->deallocate_raw(ptr, bytes, stream);
}

void MemoryPool::release_stream(cudaStream_t stream) {
  core_->release_stream(stream);
  if (detail::Observer* observer = core_->observer()) [[unlikely]] {
    observer->releasing_stream(stream);
  }
}

void MemoryPool::trim(std::size_t bytes_to_keep) { core_->trim(bytes_to_keep); }

void MemoryPool::grant_access(int device) { core_->grant_access(device); }

PoolStats MemoryPool::stats() const { return core_->stats(); }

PoolBreakdown MemoryPool::breakdown() const { return core_->breakdown(); }

const PoolOptions& MemoryPool::options() const noexcept { return core_->options(); }

Device& MemoryPool::device() const noexcept { return core_->device(); }

namespace detail {

Error allocation_error(PoolCore& core, const Failure& failure, std::size_t bytes,
                       cudaStream_t stream) {
  if (failure == Errc::out_of_memory) {
    std::string message = core.out_of_memory_message(bytes, stream);
    // The limit refused the device call, not the device: naming that call would mislead. CUDA's
    // value stays, as the limit answers what the device answers past its capacity.
    if (core.past_reserved_limit(bytes)) {
      return Error(failure.code, failure.cuda,
                   message + ": the request would pass max_reserved_bytes");
    }
    return error_of(failure, std::move(message));
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
  if (Observer* observer = pool.core().observer(); observer != nullptr && block != nullptr)
      [[unlikely]] {
    return observed_allocation(*observer, block, bytes, stream);
  }
  return block;
}

Block* allocate_block_or_throw(MemoryPool& pool, std::size_t bytes, cudaStream_t stream) {
  Failure failure;
  Block* block = pool.core().allocate(bytes, stream, failure);
  if (block == nullptr) throw allocation_error(pool.core(), failure, bytes, stream);
  if (Observer* observer = pool.core().observer()) [[unlikely]] {
    return observed_allocation(*observer, block, bytes, stream);
  }
  return block;
}

void* block_address(const Block* block) noexcept { return block->ptr; }

void release_block(Block* block, cudaStream_t stream) noexcept {
  PoolCore& core = *block->home->core;
  if (Observer* observer = core.observer()) [[unlikely]] {
    return observed_drop(*observer, core, block, stream);
  }
  core.drop(block, stream);
}

void record_block_stream(Block* block, cudaStream_t stream) {
  PoolCore& core = *block->home->core;
  core.record_stream(block, stream);
  if (Observer* observer = core.observer()) [[unlikely]] {
    observer->recorded_stream(block->ptr, stream);
  }
}

}  // namespace detail
}  // namespace streampool
