#include <streampool/reserved_limit.hpp>

namespace streampool {

template <class Key, class Allocate, class Undo>
cudaError_t ReservedLimit::take(std::unordered_map<Key, std::size_t>& sizes, std::size_t bytes,
                                Allocate&& allocate, Undo&& undo) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t limit = this->limit();
    if (bytes > limit || reserved_ > limit - bytes) return cudaErrorMemoryAllocation;
    reserved_ += bytes;  // held while the call runs, so that two threads cannot both pass
  }
  Key key{};
  const cudaError_t status = allocate(key);
  std::lock_guard<std::mutex> lock(mutex_);
  if (status == cudaSuccess) {
    try {
      sizes.emplace(key, bytes);
      return cudaSuccess;
    } catch (const std::bad_alloc&) {
      undo(key);
      reserved_ -= bytes;
      return cudaErrorMemoryAllocation;
    }
  }
  reserved_ -= bytes;
  return status;
}

template <class Key>
void ReservedLimit::give(std::unordered_map<Key, std::size_t>& sizes, Key key) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = sizes.find(key); it != sizes.end()) {
    reserved_ -= it->second;
    sizes.erase(it);
  }
}

cudaError_t ReservedLimit::malloc(void** ptr, std::size_t bytes) noexcept {
  return take(
      sizes_, bytes,
      [&](void*& key) {
        const cudaError_t status = ForwardingDevice::malloc(ptr, bytes);
        key = *ptr;
        return status;
      },
      [&](void* key) {
        ForwardingDevice::free(key);
        *ptr = nullptr;
      });
}

cudaError_t ReservedLimit::free(void* ptr) noexcept {
  const cudaError_t status = ForwardingDevice::free(ptr);
  if (status == cudaSuccess) give(sizes_, ptr);
  return status;
}

cudaError_t ReservedLimit::vm_create(VmHandle* handle, std::size_t bytes) noexcept {
  return take(
      handle_sizes_, bytes,
      [&](VmHandle& key) {
        const cudaError_t status = ForwardingDevice::vm_create(handle, bytes);
        key = *handle;
        return status;
      },
      [&](VmHandle key) { ForwardingDevice::vm_release(key); });
}

cudaError_t ReservedLimit::vm_release(VmHandle handle) noexcept {
  // The pool unmaps physical memory before releasing it, so its memory goes back now.
  const cudaError_t status = ForwardingDevice::vm_release(handle);
  if (status == cudaSuccess) give(handle_sizes_, handle);
  return status;
}

}  // namespace streampool
