// PyTorch's caching allocator as a peer, through its C++ entry points (c10_cuda), built where
// PyTorch's libraries are found at configure time.
#include "peers.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace streampool::bench {
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

class TorchPeer final : public Peer {
 public:
  TorchPeer() { alloc::init(c10::cuda::device_count()); }
  std::string name() const override { return "PyTorch caching allocator"; }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    return alloc::raw_alloc_with_stream(bytes, stream);
  }
  void deallocate(void* p, std::size_t, cudaStream_t) override { alloc::raw_delete(p); }
  std::uint64_t peak_reserved() override {
    const auto stats = alloc::getDeviceStats(0);
    return std::uint64_t(stats.reserved_bytes[0].peak);  // [0]: the aggregate of all pools
  }
  void reset_peak() override {
    alloc::emptyCache();
    alloc::resetPeakStats(0);
  }
  void release_cached() override { alloc::emptyCache(); }

 protected:
  bool stream_ordered_free() const override { return false; }
};

}  // namespace

std::unique_ptr<Peer> make_torch_peer() { return std::make_unique<TorchPeer>(); }

}  // namespace streampool::bench
