// ReservedLimit: PoolOptions::max_reserved_bytes as a decorator of the device. The pool's
// segments (malloc's) and the physical memory of its expandable segments (vm_create's) are its
// only device allocations, so refusing one past the limit, as the device itself refuses one past
// its capacity, is all the limit needs: the pool reclaims and then fails
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
  cudaError_t vm_create(VmHandle* handle, std::size_t bytes) noexcept override;
  cudaError_t vm_release(VmHandle handle) noexcept override;

 private:
  // Counts `bytes` in while `allocate` runs (so two threads cannot both pass) and keeps them
  // under its key if it succeeds; `undo` frees the key if they cannot be kept.
  template <class Key, class Allocate, class Undo>
  cudaError_t take(std::unordered_map<Key, std::size_t>& sizes, std::size_t bytes,
                   Allocate&& allocate, Undo&& undo) noexcept;
  template <class Key>
  void give(std::unordered_map<Key, std::size_t>& sizes, Key key) noexcept;

  const std::size_t limit_;
  std::mutex mutex_;
  std::size_t reserved_ = 0;                          // [mutex_]
  std::unordered_map<void*, std::size_t> sizes_;      // [mutex_]
  std::unordered_map<VmHandle, std::size_t> handle_sizes_;  // [mutex_]
};

}  // namespace streampool::detail
