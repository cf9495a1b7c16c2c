// The allocators streampool-bench compares, behind one interface. Each peer is measured as its
// users call it: streampool through PooledBuffer, the others through their own entry points.
#pragma once

#include "settings.hpp"

#include <streampool/pool_options.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace streampool::bench {

class Peer {
 public:
  Peer() = default;
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  virtual ~Peer();
  virtual std::string name() const = 0;
  // Stream-ordered allocate and free (blocking ones ignore the stream). allocate returns nullptr
  // on failure.
  virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) = 0;
  // The free of a block that stream `own` allocated and stream `used` used after it, as each
  // peer's users write it: where the free is stream-ordered (cudaFreeAsync, streampool's raw
  // API), on `used`; where it ignores the stream and the block stays `own`'s (PyTorch's
  // raw_delete, CUB's DeviceFree), `own` first waits for `used` through an event (a PyTorch
  // user would call record_stream, which the raw entry points lack): one event, recorded again at
  // each call, so from one thread at a time (compare's trace replay has one).
  void deallocate_after_use(void* ptr, std::size_t bytes, cudaStream_t own, cudaStream_t used);
  // Device memory the peer held at most since reset_peak (0 when the peer cannot tell).
  virtual std::uint64_t peak_reserved() { return 0; }
  virtual void reset_peak() {}
  // Returns cached memory to the device, between measurements.
  virtual void release_cached() {}
  // Called once per stream a measurement will no longer use, before it is destroyed.
  virtual void forget_stream(cudaStream_t) {}
  // A single allocate+free pair, as users write it: for streampool, a PooledBuffer's life.
  virtual void pair(std::size_t bytes, cudaStream_t stream) {
    deallocate(allocate(bytes, stream), bytes, stream);
  }

 protected:
  // Whether deallocate orders the free after the work enqueued on the stream it is given.
  virtual bool stream_ordered_free() const { return true; }

 private:
  cudaEvent_t used_ = nullptr;  // deallocate_after_use's, made at its first need
};

std::unique_ptr<Peer> make_cuda_malloc_peer();
// cudaMallocAsync on the device's default pool, release threshold UINT64_MAX.
std::unique_ptr<Peer> make_malloc_async_peer();
std::unique_ptr<Peer> make_streampool_peer(const PoolOptions& options, const std::string& name);
// Null where the bench was built without it.
std::unique_ptr<Peer> make_cub_peer();
std::unique_ptr<Peer> make_torch_peer();

// The streampool rows of a comparison, each on top of the user's settings (the defaults, then
// STREAMPOOL_CONF, then --config): the settings with stream_checks=none, the settings themselves,
// and the settings with the large shelf off and with fixed segments. A name says the settings'
// line ("default" when there is none) and the key the row changes on top of them.
struct StreampoolVariant {
  std::string name;
  PoolOptions options;
};
std::vector<StreampoolVariant> streampool_variants(const Settings& settings);

// Every peer available in this build, in table order: streampool_variants(settings), then the
// others.
std::vector<std::unique_ptr<Peer>> all_peers(const Settings& settings);

}  // namespace streampool::bench
