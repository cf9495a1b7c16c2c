// ThrustAllocator and PoolResource on the GPU: a thrust sort on a stream with its temporaries
// from the pool, a device_vector that grows, and the CCCL resource's members with real memory.
#include <streampool/cuda_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/memory_resource.hpp>
#include <streampool/thrust_allocator.hpp>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/host_vector.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

using streampool::MemoryPool;
using streampool::ThrustAllocator;

namespace {

streampool::PoolOptions exact_options() {
  streampool::PoolOptions options;
  options.read_environment = false;
  options.stats_granule = 0;
  return options;
}

struct GpuPool {
  MemoryPool pool{std::make_shared<streampool::CudaDevice>(0), exact_options()};
  cudaStream_t stream = nullptr;
  GpuPool() { REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess); }
  ~GpuPool() {
    cudaStreamSynchronize(stream);
    pool.release_stream(stream);
    cudaStreamDestroy(stream);
  }
};

using IntVector = thrust::device_vector<int, ThrustAllocator<int>>;

}  // namespace

TEST_CASE("gpu: thrust sorts on a stream with its temporaries from the pool") {
  GpuPool g;
  constexpr int n = 1 << 20;
  ThrustAllocator<int> alloc(g.pool, g.stream);
  IntVector v(n, alloc);
  CHECK(g.pool.stats().live_allocations.current == 1);
  // n-1, n-2, ..., 0: sorting must reverse it.
  thrust::sequence(thrust::cuda::par.on(g.stream), v.begin(), v.end(), n - 1, -1);

  const auto before = g.pool.stats();
  ThrustAllocator<char> temporaries(g.pool, g.stream);
  thrust::sort(thrust::cuda::par_nosync(temporaries).on(g.stream), v.begin(), v.end());
  REQUIRE(cudaStreamSynchronize(g.stream) == cudaSuccess);
  const auto after = g.pool.stats();
  // The sort's scratch space came from the pool and went back to it.
  CHECK(after.live_allocations.total > before.live_allocations.total);
  CHECK(after.live_allocations.current == 1);
  CHECK(after.requested_bytes.peak > static_cast<std::int64_t>(n * sizeof(int)));

  thrust::host_vector<int> host(v);
  bool sorted = true;
  for (int i = 0; i < n; ++i) sorted = sorted && host[static_cast<std::size_t>(i)] == i;
  CHECK(sorted);
}

TEST_CASE("gpu: a device_vector on the pool grows and keeps its elements") {
  GpuPool g;
  ThrustAllocator<int> alloc(g.pool, g.stream);
  const auto allocations_before = g.pool.stats().live_allocations.total;
  {
    IntVector v(alloc);
    std::size_t growths = 0;
    std::size_t capacity = v.capacity();
    for (int i = 0; i < 100000; ++i) {
      v.push_back(i * 3);
      if (v.capacity() != capacity) {
        ++growths;
        capacity = v.capacity();
      }
    }
    v.resize(1 << 22, -1);  // a large block, from the large tier
    if (v.capacity() != capacity) ++growths;
    const auto stats = g.pool.stats();
    CHECK(stats.live_allocations.current == 1);  // each growth dropped the old storage
    CHECK(stats.live_allocations.total - allocations_before == static_cast<std::int64_t>(growths));
    CHECK(stats.requested_bytes.current == static_cast<std::int64_t>(v.capacity() * sizeof(int)));

    thrust::host_vector<int> host(v);
    bool kept = true;
    for (std::size_t i = 0; i < 100000; ++i) kept = kept && host[i] == static_cast<int>(i * 3);
    for (std::size_t i = 100000; i < host.size(); ++i) kept = kept && host[i] == -1;
    CHECK(kept);
  }
  CHECK(g.pool.stats().live_allocations.current == 0);
}

TEST_CASE("gpu: PoolResource's members on real memory") {
  GpuPool g;
  streampool::PoolResource resource(g.pool);

  void* p = resource.allocate(cuda::stream_ref(g.stream), 1 << 20, 256);
  REQUIRE(cudaMemsetAsync(p, 0x5a, 1 << 20, g.stream) == cudaSuccess);
  unsigned char byte = 0;
  REQUIRE(cudaMemcpyAsync(&byte, static_cast<unsigned char*>(p) + 12345, 1,
                          cudaMemcpyDeviceToHost, g.stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(g.stream) == cudaSuccess);
  CHECK(byte == 0x5a);
  CHECK(g.pool.stats().live_allocations.current == 1);
  resource.deallocate(cuda::stream_ref(g.stream), p, 1 << 20, 256);

  // Synchronous: usable from the host's point of view at once (a blocking memset).
  void* q = resource.allocate_sync(4096);
  REQUIRE(cudaMemset(q, 0, 4096) == cudaSuccess);
  CHECK(g.pool.stats().live_allocations.current == 1);
  resource.deallocate_sync(q, 4096);
  CHECK(g.pool.stats().live_allocations.current == 0);
  CHECK_THROWS_AS(resource.allocate(cuda::stream_ref(g.stream), 4096, 512), streampool::Error);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}
