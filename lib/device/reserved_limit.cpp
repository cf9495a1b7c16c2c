#include "reserved_limit.hpp"

namespace streampool::detail {

cudaError_t ReservedLimit::malloc(void** ptr, std::size_t bytes) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > limit_ || reserved_ > limit_ - bytes) return cudaErrorMemoryAllocation;
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
      reserved_ -= bytes;
      return cudaErrorMemoryAllocation;
    }
  }
  reserved_ -= bytes;
  return status;
}

cudaError_t ReservedLimit::free(void* ptr) noexcept {
  const cudaError_t status = ForwardingDevice::free(ptr);
  if (status != cudaSuccess) return status;
  std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = sizes_.find(ptr); it != sizes_.end()) {
    reserved_ -= it->second;
    sizes_.erase(it);
  }
  return cudaSuccess;
}

}  // namespace streampool::detail
