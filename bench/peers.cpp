#include "peers.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <fmt/format.h>

#include <stdexcept>

namespace streampool::bench {

Peer::~Peer() {
  if (used_ != nullptr) cudaEventDestroy(used_);
}

void Peer::deallocate_after_use(void* ptr, std::size_t bytes, cudaStream_t own, cudaStream_t used) {
  if (stream_ordered_free()) {
    deallocate(ptr, bytes, used);
    return;
  }
  if (used_ == nullptr && cudaEventCreateWithFlags(&used_, cudaEventDisableTiming) != cudaSuccess) {
    throw std::runtime_error("cudaEventCreateWithFlags failed");
  }
  if (cudaEventRecord(used_, used) != cudaSuccess ||
      cudaStreamWaitEvent(own, used_, 0) != cudaSuccess) {
    throw std::runtime_error("cudaEventRecord or cudaStreamWaitEvent failed");
  }
  deallocate(ptr, bytes, own);
}

namespace {

// Its peak reserved memory is not known (Peer::peak_reserved's 0, n/a): what cudaMalloc takes
// for a request, whole pages from the driver shared among small allocations, is not told to its
// caller, and counting the requested bytes instead made it look like the least memory of all.
class CudaMallocPeer final : public Peer {
 public:
  std::string name() const override { return "cudaMalloc + cudaFree"; }
  void* allocate(std::size_t bytes, cudaStream_t) override {
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  }
  void deallocate(void* p, std::size_t, cudaStream_t) override { cudaFree(p); }
};

class MallocAsyncPeer final : public Peer {
 public:
  MallocAsyncPeer() {
    cudaDeviceGetDefaultMemPool(&pool_, 0);
    std::uint64_t threshold = UINT64_MAX;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold);
  }
  std::string name() const override { return "cudaMallocAsync + cudaFreeAsync"; }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    void* p = nullptr;
    return cudaMallocAsync(&p, bytes, stream) == cudaSuccess ? p : nullptr;
  }
  void deallocate(void* p, std::size_t, cudaStream_t stream) override { cudaFreeAsync(p, stream); }
  std::uint64_t peak_reserved() override {
    std::uint64_t high = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high);
    return high;
  }
  void reset_peak() override {
    std::uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero);
  }
  void release_cached() override {
    cudaDeviceSynchronize();
    cudaMemPoolTrimTo(pool_, 0);
  }

 private:
  cudaMemPool_t pool_ = nullptr;
};

class StreampoolPeer final : public Peer {
 public:
  StreampoolPeer(const PoolOptions& options, std::string name)
      : device_(std::make_shared<CudaDevice>(0)), options_(options), name_(std::move(name)) {
    options_.read_environment = false;
    pool_ = std::make_unique<MemoryPool>(device_, options_);
  }
  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    std::error_code error;
    return pool_->try_allocate(bytes, stream, error);
  }
  void deallocate(void* p, std::size_t bytes, cudaStream_t stream) override {
    pool_->deallocate(p, bytes, stream);
  }
  void pair(std::size_t bytes, cudaStream_t stream) override {
    PooledBuffer<std::byte>::alloc_async(*pool_, bytes, stream);
  }
  std::uint64_t peak_reserved() override {
    return std::uint64_t(pool_->stats().reserved_bytes.peak);
  }
  void reset_peak() override { pool_ = std::make_unique<MemoryPool>(device_, options_); }
  void release_cached() override { pool_->trim(0); }
  void forget_stream(cudaStream_t stream) override { pool_->release_stream(stream); }

 private:
  std::shared_ptr<CudaDevice> device_;
  PoolOptions options_;
  std::string name_;
  std::unique_ptr<MemoryPool> pool_;
};

}  // namespace

std::unique_ptr<Peer> make_cuda_malloc_peer() { return std::make_unique<CudaMallocPeer>(); }
std::unique_ptr<Peer> make_malloc_async_peer() { return std::make_unique<MallocAsyncPeer>(); }
std::unique_ptr<Peer> make_streampool_peer(const PoolOptions& options, const std::string& name) {
  return std::make_unique<StreampoolPeer>(options, name);
}

#ifndef STREAMPOOL_BENCH_HAVE_CUB
std::unique_ptr<Peer> make_cub_peer() { return nullptr; }
#endif
#ifndef STREAMPOOL_BENCH_HAVE_TORCH
std::unique_ptr<Peer> make_torch_peer() { return nullptr; }
#endif

std::vector<StreampoolVariant> streampool_variants(const Settings& settings) {
  const std::string line = settings.line();
  const std::string label = line.empty() ? "default" : line;
  const auto with = [&](const std::string& change) {
    return fmt::format("streampool ({}, {})", label, change);
  };
  std::vector<StreampoolVariant> variants;
  PoolOptions fastest = settings.options;
  fastest.stream_checks = StreamChecks::none;
  variants.push_back({line.empty() ? "streampool (stream_checks=none)" : with("stream_checks=none"),
                      fastest});
  variants.push_back({line.empty() ? "streampool (default: every check)"
                                   : fmt::format("streampool ({})", line),
                      settings.options});
  // Large pairs without the shelf: the arena's path (bench/results/ compares the two).
  PoolOptions no_shelf = settings.options;
  no_shelf.large_shelf = 0;
  variants.push_back({with("large_shelf=0"), no_shelf});
  // Segments from cudaMalloc: the large tier without virtual memory (the fallback).
  PoolOptions fixed_segments = settings.options;
  fixed_segments.expandable_segments = false;
  variants.push_back({with("expandable_segments=false"), fixed_segments});
  return variants;
}

std::vector<std::unique_ptr<Peer>> all_peers(const Settings& settings) {
  std::vector<std::unique_ptr<Peer>> peers;
  for (const StreampoolVariant& v : streampool_variants(settings)) {
    peers.push_back(make_streampool_peer(v.options, v.name));
  }
  peers.push_back(make_cuda_malloc_peer());
  peers.push_back(make_malloc_async_peer());
  if (auto cub = make_cub_peer()) peers.push_back(std::move(cub));
  if (auto torch = make_torch_peer()) peers.push_back(std::move(torch));
  return peers;
}

}  // namespace streampool::bench
