#include <streampool/reserved_limit.hpp>

#include <cstdint>
#include <new>
#include <type_traits>

namespace streampool {

namespace {
// A record of `sizes`' kind outside it, made with a key it does not hold: inserted later with
// its key set, it needs no memory (where the buckets have room).
template <class Key>
auto blank_record(std::unordered_map<Key, std::size_t>& sizes) {
  std::uintptr_t n = 0;
  const auto key = [&] {
    if constexpr (std::is_pointer_v<Key>) return reinterpret_cast<Key>(n);
    else return static_cast<Key>(n);
  };
  while (sizes.count(key()) != 0) ++n;
  return sizes.extract(sizes.emplace(key(), 0).first);
}
}  // namespace

template <class Key, class Allocate>
cudaError_t ReservedLimit::take(std::unordered_map<Key, std::size_t>& sizes, std::size_t bytes,
                                Allocate&& allocate) noexcept {
  typename std::unordered_map<Key, std::size_t>::node_type record;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t limit = this->limit();
    if (bytes > limit || reserved_ > limit - bytes) return cudaErrorMemoryAllocation;
    try {
      // Buckets for every record the takes under way will add: no insertion below rehashes.
      sizes.reserve(sizes.size() + taking_ + 1);
      record = blank_record(sizes);
    } catch (const std::bad_alloc&) {
      return cudaErrorMemoryAllocation;  // as the device answers when it has no memory
    }
    reserved_ += bytes;  // held while the call runs, so that two threads cannot both pass
    ++taking_;
  }
  Key key{};
  const cudaError_t status = allocate(key);
  std::lock_guard<std::mutex> lock(mutex_);
  --taking_;
  if (status != cudaSuccess) {
    reserved_ -= bytes;
    return status;
  }
  record.key() = key;
  record.mapped() = bytes;
  sizes.insert(std::move(record));
  return cudaSuccess;
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
      });
}

cudaError_t ReservedLimit::vm_release(VmHandle handle) noexcept {
  // The pool unmaps physical memory before releasing it, so its memory goes back now.
  const cudaError_t status = ForwardingDevice::vm_release(handle);
  if (status == cudaSuccess) give(handle_sizes_, handle);
  return status;
}

}  // namespace streampool
