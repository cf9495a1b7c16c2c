// ReservedWatch: a device decorator that counts the bytes the pool holds on its device, so that
// the bench can read the reserved memory at any moment without asking the pool (whose stats()
// takes every stream's lock) and can take the exact peak of any stretch of a run (the pool's own
// peak covers the whole run only). Device mallocs and frees are the pool's slow path: a mutex
// here costs nothing on the fast path.
#pragma once

#include <streampool/device.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>

namespace streampool::bench {

class ReservedWatch final : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;

  cudaError_t malloc(void** ptr, std::size_t bytes) noexcept override {
    const cudaError_t status = ForwardingDevice::malloc(ptr, bytes);
    if (status == cudaSuccess && *ptr != nullptr) {
      std::lock_guard lock(mutex_);
      try {
        sizes_.emplace(*ptr, bytes);
      } catch (const std::bad_alloc&) {
        lost_ = true;  // that allocation's free will not be subtracted: figures read high
      }
      const std::int64_t now =
          current_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed) +
          static_cast<std::int64_t>(bytes);
      peak_ = std::max(peak_, now);
    }
    return status;
  }

  cudaError_t free(void* ptr) noexcept override {
    const cudaError_t status = ForwardingDevice::free(ptr);
    if (status == cudaSuccess) {
      std::lock_guard lock(mutex_);
      if (auto it = sizes_.find(ptr); it != sizes_.end()) {
        current_.fetch_sub(static_cast<std::int64_t>(it->second), std::memory_order_relaxed);
        sizes_.erase(it);
      }
    }
    return status;
  }

  // Physical memory of expandable segments: held from creation to release (the pool unmaps
  // before it releases).
  cudaError_t vm_create(VmHandle* handle, std::size_t bytes) noexcept override {
    const cudaError_t status = ForwardingDevice::vm_create(handle, bytes);
    if (status == cudaSuccess) {
      std::lock_guard lock(mutex_);
      try {
        handle_sizes_.emplace(*handle, bytes);
      } catch (const std::bad_alloc&) {
        lost_ = true;
      }
      const auto now = current_.fetch_add(static_cast<std::int64_t>(bytes),
                                          std::memory_order_relaxed) +
                       static_cast<std::int64_t>(bytes);
      peak_ = std::max(peak_, now);
    }
    return status;
  }

  cudaError_t vm_release(VmHandle handle) noexcept override {
    const cudaError_t status = ForwardingDevice::vm_release(handle);
    if (status == cudaSuccess) {
      std::lock_guard lock(mutex_);
      if (auto it = handle_sizes_.find(handle); it != handle_sizes_.end()) {
        current_.fetch_sub(static_cast<std::int64_t>(it->second), std::memory_order_relaxed);
        handle_sizes_.erase(it);
      }
    }
    return status;
  }

  // The bytes held now: exact after the caller's own device calls, without a lock.
  std::int64_t current() const noexcept { return current_.load(std::memory_order_relaxed); }

  // The peak since the last call (or the start), and a new stretch begins now.
  std::int64_t take_peak() {
    std::lock_guard lock(mutex_);
    return std::exchange(peak_, current_.load(std::memory_order_relaxed));
  }

  bool lost() const {
    std::lock_guard lock(mutex_);
    return lost_;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::unordered_map<VmHandle, std::size_t> handle_sizes_;
  std::atomic<std::int64_t> current_{0};  // written under mutex_, read without it
  std::int64_t peak_ = 0;
  bool lost_ = false;
};

}  // namespace streampool::bench
