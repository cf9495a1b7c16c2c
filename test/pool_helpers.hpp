// Shared set-up for the MemoryPool tests: a pool on a fresh FakeDevice, with options that ignore
// STREAMPOOL_CONF and keep the statistics exact.
#pragma once

#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <catch2/catch.hpp>

#include <memory>
#include <string>

// Segments from cudaMalloc: the tests of the arena's layout name segment sizes and device
// allocations. Expandable segments are tested in pool_expandable.cpp, and both settings by the
// fault matrix, the model check and the fuzzer.
inline streampool::PoolOptions test_options() {
  streampool::PoolOptions options;
  options.read_environment = false;
  options.stats_granule = 0;
  options.expandable_segments = false;
  return options;
}

// One block per slab and no rounding slack: a stream that misses its own list cannot be served by
// a fresh slab's spare blocks, so which block it gets (another stream's, or a fresh one) shows.
inline streampool::PoolOptions one_block_slabs() {
  auto options = test_options();
  options.slab_bytes = 4096;
  options.large_rounding = 4096;
  return options;
}

struct PoolOnFake {
  std::shared_ptr<streampool::FakeDevice> device;
  std::unique_ptr<streampool::MemoryPool> pool;

  explicit PoolOnFake(streampool::PoolOptions options = test_options(),
                      streampool::FakeDevice::Options device_options = {})
      : device(std::make_shared<streampool::FakeDevice>(device_options)),
        pool(std::make_unique<streampool::MemoryPool>(device, options)) {}

  streampool::FakeDevice& fake() { return *device; }
  streampool::MemoryPool& operator*() { return *pool; }
  streampool::MemoryPool* operator->() { return pool.get(); }
};

// Work on `stream` that writes the whole buffer, as a kernel would.
template <class T>
void write_on(streampool::FakeDevice& device, cudaStream_t stream,
              const streampool::PooledBuffer<T>& buffer) {
  device.launch(stream, {{buffer.data(), buffer.byte_size(), true}});
}

// What the fake device's first hazard says, or "none": for a failure message.
inline std::string first_hazard(const streampool::FakeDevice& device) {
  const auto hazards = device.hazards();
  return hazards.empty() ? std::string("none") : hazards.front().what;
}
