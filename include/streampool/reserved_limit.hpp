// ReservedLimit: a limit on the device memory a pool reserves, as a decorator of its device.
//
// A pool's segments (malloc's) and the physical memory of its expandable segments (vm_create's)
// are its only device allocations, so refusing one that would pass the limit, as the device
// itself refuses one past its capacity (cudaErrorMemoryAllocation, without a device call), is
// all a limit needs: the pool reclaims and then fails with out_of_memory the same way in both
// cases. PoolOptions::max_reserved_bytes puts one under the pool; a layer that changes the limit
// while the pool lives (the PyTorch layer, for torch.cuda.set_per_process_memory_fraction) puts
// its own under it, and may lower it below what is reserved: that frees nothing, later
// allocations fail until trim returns memory. Thread-safe.
#pragma once

#include <streampool/device.hpp>
#include <streampool/export.hpp>

#include <atomic>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace streampool {

class STREAMPOOL_API ReservedLimit final : public ForwardingDevice {
 public:
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

  explicit ReservedLimit(std::shared_ptr<Device> inner, std::size_t limit = none) noexcept
      : ForwardingDevice(std::move(inner)), limit_(limit) {}

  void set_limit(std::size_t bytes) noexcept { limit_.store(bytes, std::memory_order_relaxed); }
  std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }

  cudaError_t malloc(void** ptr, std::size_t bytes) noexcept override;
  cudaError_t free(void* ptr) noexcept override;
  cudaError_t vm_create(VmHandle* handle, std::size_t bytes) noexcept override;
  cudaError_t vm_release(VmHandle handle) noexcept override;

 private:
  // Counts `bytes` in while `allocate` runs (so two threads cannot both pass) and keeps them
  // under its key if it succeeds. The record is made first: nothing is left to fail after the
  // device call, which would leave memory that neither the caller nor the limit counts.
  template <class Key, class Allocate>
  cudaError_t take(std::unordered_map<Key, std::size_t>& sizes, std::size_t bytes,
                   Allocate&& allocate) noexcept;
  template <class Key>
  void give(std::unordered_map<Key, std::size_t>& sizes, Key key) noexcept;

  std::atomic<std::size_t> limit_;
  std::mutex mutex_;
  std::size_t reserved_ = 0;                                // [mutex_]
  std::size_t taking_ = 0;  // takes whose device call runs, each with a record to add [mutex_]
  std::unordered_map<void*, std::size_t> sizes_;            // [mutex_]
  std::unordered_map<VmHandle, std::size_t> handle_sizes_;  // [mutex_]
};

}  // namespace streampool
