// cub::CachingDeviceAllocator as a peer. Configured to cache every size the bench asks for
// (bins of powers of two from 256 B to 1 GiB, no cap on cached bytes): with its defaults it
// would not cache anything above 2 MiB and would fall back to cudaMalloc there.
#include "peers.hpp"

#include <cub/util_allocator.cuh>

namespace streampool::bench {
namespace {

class CubPeer final : public Peer {
 public:
  CubPeer() : allocator_(2, 8, 30, ~std::size_t{0}, true) {}
  std::string name() const override { return "cub::CachingDeviceAllocator"; }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    void* p = nullptr;
    return allocator_.DeviceAllocate(&p, bytes, stream) == cudaSuccess ? p : nullptr;
  }
  void deallocate(void* p, std::size_t, cudaStream_t) override { allocator_.DeviceFree(p); }
  void release_cached() override { allocator_.FreeAllCached(); }

 protected:
  bool stream_ordered_free() const override { return false; }

 private:
  cub::CachingDeviceAllocator allocator_;
};

}  // namespace

std::unique_ptr<Peer> make_cub_peer() { return std::make_unique<CubPeer>(); }

}  // namespace streampool::bench
