// NvtxMemory: PoolOptions::nvtx_memory as a decorator of the device. compute-sanitizer sees a pool
// segment as one valid cudaMalloc, so an access past a block or after its drop goes unseen. This
// layer tells it more through NVTX's memory API (nvtx3/nvToolsExtMem.h): each segment (every
// malloc of the pool is one) is registered as a sub-allocator heap, which memcheck treats as
// inaccessible except for its regions, and each live block as a region of the bytes asked for,
// unregistered at the drop. It wants the pool's notifications and passes them on, so that a fake
// device under it still checks the blocks.
#pragma once

#include <streampool/device.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace streampool::detail {

class NvtxMemory final : public ForwardingDevice {
 public:
  explicit NvtxMemory(std::shared_ptr<Device> inner) noexcept;
  ~NvtxMemory() override;

  bool wants_notifications() const noexcept override { return true; }
  cudaError_t malloc(void** ptr, std::size_t bytes) noexcept override;
  cudaError_t free(void* ptr) noexcept override;
  void block_live(const void* ptr, std::size_t bytes, std::size_t size,
                  cudaStream_t stream) noexcept override;
  void block_dropped(const void* ptr, cudaStream_t stream) noexcept override;
  void block_dropped_home(const void* ptr) noexcept override;
  void block_held(const void* ptr, std::size_t bytes) noexcept override;

 private:
  // Registers [ptr, ptr + bytes) as a region of the heap holding it, replacing one at ptr.
  void add_region(const void* ptr, std::size_t bytes) noexcept;  // [mutex_]
  void remove_region(const void* ptr) noexcept;                   // [mutex_]

  std::mutex mutex_;
  void* domain_ = nullptr;  // nvtxDomainHandle_t, made at the first segment: NVTX must come
                            // after the CUDA runtime is initialized [mutex_]
  struct Heap {
    std::size_t bytes = 0;
    void* handle = nullptr;  // nvtxMemHeapHandle_t
  };
  std::map<std::uintptr_t, Heap> heaps_;                // segment base -> heap [mutex_]
  std::unordered_map<const void*, std::size_t> regions_;  // registered regions [mutex_]
};

}  // namespace streampool::detail
