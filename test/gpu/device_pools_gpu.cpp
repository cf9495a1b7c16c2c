// The process's DevicePools on real GPUs, and the current device left as the caller had it by
// every pool call. With one GPU the pool of device 0 is used with device 0 current; with two or
// more, the pool of the last device is used while device 0 is current, which is where a call that
// switched devices and did not switch back would show.
#include "kernels.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/device_pools.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace {

int current_device() {
  int ordinal = -1;
  REQUIRE(cudaGetDevice(&ordinal) == cudaSuccess);
  return ordinal;
}

}  // namespace

TEST_CASE("gpu: the current device's pool is the pool of that device") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  auto pool = streampool::current_device_pool();
  CHECK(pool == streampool::pool_for_device(0));
  CHECK(pool->device().ordinal() == 0);
  CHECK(streampool::CudaDevice::current() == 0);
  CHECK_THROWS_AS(streampool::pool_for_device(streampool::CudaDevice::count()),
                  streampool::Error);  // no such GPU
  if (streampool::CudaDevice::count() >= 2) {
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    CHECK(streampool::current_device_pool() == streampool::pool_for_device(1));
    CHECK(streampool::current_device_pool()->device().ordinal() == 1);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
  }
}

TEST_CASE("gpu: pool calls leave the caller's current device as it was") {
  const int last = streampool::CudaDevice::count() - 1;
  if (last == 0) WARN("one GPU: the pool's device is the current one; 2+ GPUs test the switch");
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  auto pool = streampool::pool_for_device(last);
  CHECK(current_device() == 0);

  // A stream of the pool's device, made with that device current; then device 0 again.
  cudaStream_t stream = nullptr;
  REQUIRE(cudaSetDevice(last) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  cudaStream_t other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);

  {
    // Allocation (a device malloc on the first), drop, a drop recorded on a second stream
    // (fences), an allocation on the other stream, trim (device synchronize and frees).
    auto a = streampool::PooledBuffer<float>::alloc_async(*pool, 1 << 20, stream);
    CHECK(current_device() == 0);
    a.record_stream(other);
    CHECK(current_device() == 0);
    a.reset();
    CHECK(current_device() == 0);
    auto b = streampool::PooledBuffer<float>::alloc_async(*pool, 1 << 20, other);
    CHECK(current_device() == 0);
    void* raw = pool->allocate(std::size_t{64} << 20, stream);
    pool->deallocate(raw, std::size_t{64} << 20, stream);
    CHECK(current_device() == 0);
  }
  pool->release_stream(stream);
  pool->release_stream(other);
  CHECK(current_device() == 0);
  pool->trim();
  CHECK(current_device() == 0);
  (void)pool->stats();
  CHECK(current_device() == 0);

  REQUIRE(cudaSetDevice(last) == cudaSuccess);
  cudaStreamDestroy(stream);
  cudaStreamDestroy(other);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("gpu: threads use the current device's pool at once") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  // A pool of the user's, installed for device 0: exact statistics, whatever STREAMPOOL_CONF says.
  streampool::PoolOptions options;
  options.read_environment = false;
  options.stats_granule = 0;
  auto pool = std::make_shared<streampool::MemoryPool>(
      std::make_shared<streampool::CudaDevice>(0), options);
  const auto previous = streampool::set_pool_for_device(0, pool);
  constexpr int threads = 8;
  constexpr int rounds = 500;
  std::atomic<int> wrong{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      // A new thread's current device is 0 until it sets another.
      auto mine = streampool::current_device_pool();
      if (mine != pool) ++wrong;
      cudaStream_t stream = nullptr;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        ++wrong;
        return;
      }
      for (int r = 0; r < rounds; ++r) {
        auto buffer = streampool::PooledBuffer<std::uint32_t>::alloc_async(
            *mine, 4096 + static_cast<std::size_t>(r) * 64, stream);
        if (gpu_test::launch_noop(stream) != cudaSuccess) ++wrong;
      }
      if (cudaStreamSynchronize(stream) != cudaSuccess) ++wrong;
      mine->release_stream(stream);
      cudaStreamDestroy(stream);
    });
  }
  for (auto& w : workers) w.join();
  CHECK(wrong == 0);
  const auto stats = pool->stats();
  CHECK(stats.live_allocations.total == threads * rounds);
  CHECK(stats.live_allocations.current == 0);
  CHECK(streampool::set_pool_for_device(0, previous) == pool);
}
