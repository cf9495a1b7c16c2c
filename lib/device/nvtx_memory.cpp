// NvtxMemory: the pool's segments and blocks, told to compute-sanitizer (nvtx_memory.hpp).
//
// NVTX is header-only: with no tool attached each call below finds no handler and returns. The
// calls take a mutex of this layer: the option is for checking runs, not for speed (with it off
// the layer does not exist).
#include "nvtx_memory.hpp"

#include <nvtx3/nvToolsExtMem.h>

namespace streampool::detail {
namespace {

nvtxDomainHandle_t as_domain(void* domain) { return static_cast<nvtxDomainHandle_t>(domain); }
nvtxMemHeapHandle_t as_heap(void* heap) { return static_cast<nvtxMemHeapHandle_t>(heap); }

}  // namespace

NvtxMemory::NvtxMemory(std::shared_ptr<Device> inner) noexcept
    : ForwardingDevice(std::move(inner)) {}

NvtxMemory::~NvtxMemory() {
  if (domain_ == nullptr) return;
  for (const auto& [base, heap] : heaps_) {
    nvtxMemHeapUnregister(as_domain(domain_), as_heap(heap.handle));
  }
  nvtxDomainDestroy(as_domain(domain_));
}

cudaError_t NvtxMemory::malloc(void** ptr, std::size_t bytes) noexcept {
  const cudaError_t status = ForwardingDevice::malloc(ptr, bytes);
  if (status != cudaSuccess || *ptr == nullptr) return status;
  std::lock_guard<std::mutex> lock(mutex_);
  if (domain_ == nullptr) domain_ = nvtxDomainCreateA("streampool");
  nvtxMemVirtualRangeDesc_t range{};
  range.ptr = *ptr;
  range.size = bytes;
  nvtxMemHeapDesc_t desc{};
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = sizeof(desc);
  desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.typeSpecificDescSize = sizeof(range);
  desc.typeSpecificDesc = &range;
  const nvtxMemHeapHandle_t heap = nvtxMemHeapRegister(as_domain(domain_), &desc);
  try {
    heaps_[reinterpret_cast<std::uintptr_t>(*ptr)] = {bytes, static_cast<void*>(heap)};
  } catch (const std::bad_alloc&) {
    nvtxMemHeapUnregister(as_domain(domain_), heap);  // unknown to the layer: not a heap at all
  }
  return status;
}

cudaError_t NvtxMemory::free(void* ptr) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = heaps_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it != heaps_.end()) {
      // Its regions go with it.
      std::erase_if(regions_, [&](const auto& region) {
        const auto at = reinterpret_cast<std::uintptr_t>(region.first);
        return at >= it->first && at < it->first + it->second.bytes;
      });
      nvtxMemHeapUnregister(as_domain(domain_), as_heap(it->second.handle));
      heaps_.erase(it);
    }
  }
  return ForwardingDevice::free(ptr);
}

void NvtxMemory::add_region(const void* ptr, std::size_t bytes) noexcept {
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = heaps_.upper_bound(at);
  if (it == heaps_.begin()) return;
  --it;
  if (at >= it->first + it->second.bytes) return;  // not in a segment of this pool
  remove_region(ptr);
  nvtxMemVirtualRangeDesc_t range{};
  range.ptr = ptr;
  range.size = bytes;
  nvtxMemRegionsRegisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.heap = as_heap(it->second.handle);
  batch.regionCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  nvtxMemRegionsRegister(as_domain(domain_), &batch);
  try {
    regions_[ptr] = bytes;
  } catch (const std::bad_alloc&) {
  }
}

void NvtxMemory::remove_region(const void* ptr) noexcept {
  if (regions_.erase(ptr) == 0) return;
  nvtxMemRegionRef_t ref{};
  ref.pointer = ptr;
  nvtxMemRegionsUnregisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  batch.refCount = 1;
  batch.refElementSize = sizeof(ref);
  batch.refElements = &ref;
  nvtxMemRegionsUnregister(as_domain(domain_), &batch);
}

void NvtxMemory::block_live(const void* ptr, std::size_t bytes, std::size_t size,
                            cudaStream_t stream) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    add_region(ptr, bytes);  // the bytes asked for: memcheck reports a read of the rounding too
  }
  ForwardingDevice::block_live(ptr, bytes, size, stream);
}

void NvtxMemory::block_dropped(const void* ptr, cudaStream_t stream) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remove_region(ptr);
  }
  ForwardingDevice::block_dropped(ptr, stream);
}

void NvtxMemory::block_dropped_home(const void* ptr) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remove_region(ptr);
  }
  ForwardingDevice::block_dropped_home(ptr);
}

void NvtxMemory::block_held(const void* ptr, std::size_t bytes) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    add_region(ptr, bytes);
  }
  ForwardingDevice::block_held(ptr, bytes);
}

}  // namespace streampool::detail
