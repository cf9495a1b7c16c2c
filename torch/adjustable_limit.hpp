// AdjustableLimit: a reserved-memory limit that can change while the pool lives, as a decorator
// of the device (the pool's own max_reserved_bytes is fixed at construction). PyTorch sets it
// through torch.cuda.set_per_process_memory_fraction at any time. The pool's segments are its
// only device allocations, so refusing a malloc past the limit, as the device refuses one past
// its capacity, makes the pool reclaim and then fail with out_of_memory. Lowering the limit below
// what is reserved frees nothing: later mallocs fail until trim (empty_cache) returns memory.
#pragma once

#include <streampool/device.hpp>

#include <atomic>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace streampool::torch_layer {

class AdjustableLimit final : public ForwardingDevice {
 public:
  explicit AdjustableLimit(std::shared_ptr<Device> inner) noexcept
      : ForwardingDevice(std::move(inner)) {}

  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  void set_limit(std::size_t bytes) noexcept { limit_.store(bytes, std::memory_order_relaxed); }
  std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }

  cudaError_t malloc(void** ptr, std::size_t bytes) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::size_t limit = this->limit();
      if (bytes > limit || reserved_ > limit - bytes) return cudaErrorMemoryAllocation;
      reserved_ += bytes;  // held while the call runs, so that two threads cannot both pass
    }
    const cudaError_t status = ForwardingDevice::malloc(ptr, bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    if (status == cudaSuccess) {
      try {
        sizes_.emplace(*ptr, bytes);
        return cudaSuccess;
      } catch (const std::bad_alloc&) {
        ForwardingDevice::free(*ptr);
        *ptr = nullptr;
      }
    }
    reserved_ -= bytes;
    return status == cudaSuccess ? cudaErrorMemoryAllocation : status;
  }

  cudaError_t free(void* ptr) noexcept override {
    const cudaError_t status = ForwardingDevice::free(ptr);
    if (status != cudaSuccess) return status;
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = sizes_.find(ptr); it != sizes_.end()) {
      reserved_ -= it->second;
      sizes_.erase(it);
    }
    return cudaSuccess;
  }

 private:
  std::atomic<std::size_t> limit_{none};
  std::mutex mutex_;
  std::size_t reserved_ = 0;                      // [mutex_]
  std::unordered_map<void*, std::size_t> sizes_;  // [mutex_]
};

}  // namespace streampool::torch_layer
