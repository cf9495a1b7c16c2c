// ReservedLimit: PoolOptions::max_reserved_bytes as a decorator of the device. The pool's
// segments are its only device allocations, so refusing a malloc past the limit, as the device
// itself refuses one past its capacity, is all the limit needs: the pool reclaims and then fails
// with out_of_memory the same way in both cases.
#pragma once

#include <streampool/device.hpp>

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace streampool::detail {

class ReservedLimit final : public ForwardingDevice {
 public:
  ReservedLimit(std::shared_ptr<Device> inner, std::size_t limit) noexcept
      : ForwardingDevice(std::move(inner)), limit_(limit) {}

  // cudaErrorMemoryAllocation, without a device call, when `bytes` more would pass the limit.
  cudaError_t malloc(void** ptr, std::size_t bytes) noexcept override;
  cudaError_t free(void* ptr) noexcept override;

 private:
  const std::size_t limit_;
  std::mutex mutex_;
  std::size_t reserved_ = 0;                          // [mutex_]
  std::unordered_map<void*, std::size_t> sizes_;      // [mutex_]
};

}  // namespace streampool::detail
