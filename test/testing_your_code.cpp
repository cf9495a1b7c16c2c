// The code of docs/testing-your-code.md, compiled and run: each block between guide-begin and
// guide-end markers is shown in the guide word for word (test/docs/check_guide.cmake checks it).
#include "pool_helpers.hpp"

#include <streampool/error.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>
#include <streampool/stream_ops.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <memory>
#include <vector>

using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PooledBuffer;
using streampool::reads;
using streampool::StreamOps;
using streampool::writes;
using Kind = FakeDevice::Hazard::Kind;

namespace {

// In a program this is a .cu file's kernel launch: `double_kernel<<<g, b, 0, stream>>>(x, n)`.
void launch_double(float*, std::size_t, cudaStream_t) {}

// guide-begin route
// Written once: CudaStreamOps runs the launch, FakeStreamOps checks the accesses and runs the
// host body when the work completes.
void double_all(StreamOps& ops, PooledBuffer<float>& x, cudaStream_t stream) {
  float* p = x.data();
  const std::size_t n = x.len();
  ops.enqueue(
      stream, "double", {reads(x), writes(x)},
      [=](cudaStream_t on) { launch_double(p, n, on); },
      [=] { for (std::size_t i = 0; i < n; ++i) p[i] *= 2; });
}
// guide-end

std::vector<Kind> kinds(const FakeDevice& device) {
  std::vector<Kind> out;
  for (const auto& hazard : device.hazards()) out.push_back(hazard.kind);
  return out;
}

}  // namespace

TEST_CASE("guide: a function written against StreamOps, tested on the fake", "[guide]") {
  // guide-begin test
  FakeDevice::Options options;
  options.host_backed = true;  // bodies can read and write the memory
  auto device = std::make_shared<FakeDevice>(options);
  streampool::FakeStreamOps ops(device);
  MemoryPool pool(device);
  cudaStream_t stream = ops.create_stream("main");

  auto x = PooledBuffer<float>::alloc_async(pool, 4, stream);
  std::vector<float> in{1, 2, 3, 4};
  std::vector<float> out(4);
  ops.copy(x.data(), in.data(), x.byte_size(), streampool::CopyKind::host_to_device, stream);
  double_all(ops, x, stream);
  ops.copy(out.data(), x.data(), x.byte_size(), streampool::CopyKind::device_to_host, stream);
  ops.synchronize(stream);
  REQUIRE(out == std::vector<float>{2, 4, 6, 8});
  REQUIRE(device->hazards().empty());
  // guide-end
  x.reset();
  ops.destroy_stream(stream);
}

TEST_CASE("guide: pending work, reuse, and the order completions happen in", "[guide]") {
  auto device = std::make_shared<FakeDevice>();  // auto_complete off: work stays pending
  streampool::FakeStreamOps ops(device);
  MemoryPool pool(device, test_options());
  cudaStream_t a = ops.create_stream("a");
  cudaStream_t b = ops.create_stream("b");
  const auto no_kernel = [](cudaStream_t) {};
  // guide-begin pending
  auto x = PooledBuffer<float>::alloc_async(pool, 256, a);
  ops.order_after(b, a);
  ops.enqueue(b, "slow reader", {reads(x)}, no_kernel);  // stays pending
  const float* before = x.data();
  x.reset();  // forgot x.record_stream(b): reported at once, as unrecorded_use
  // The same size on the same stream: the pool hands the block out again at once.
  auto y = PooledBuffer<float>::alloc_async(pool, 256, a);
  REQUIRE(y.data() == before);
  ops.enqueue(a, "next writer", {writes(y)}, no_kernel);  // a race with the pending reader
  REQUIRE(kinds(*device) == std::vector<Kind>{Kind::unrecorded_use, Kind::race});
  device->complete(b);  // the test decides when (and in which order) work completes
  // guide-end
  device->complete_all();
}

TEST_CASE("guide: a fault injected into your code's CUDA calls", "[guide]") {
  auto device = std::make_shared<FakeDevice>();
  streampool::FakeStreamOps ops(device);
  cudaStream_t a = ops.create_stream("a");
  cudaStream_t b = ops.create_stream("b");
  // guide-begin faults
  device->fail_next(FakeDevice::Call::event_record);  // CUDA's error for it: a launch failure
  REQUIRE_THROWS_AS(ops.order_after(b, a), streampool::Error);
  REQUIRE(device->live_events() == 0);  // the event the failed call made is gone
  // guide-end
}

TEST_CASE("guide: reading the hazards", "[guide]") {
  auto device = std::make_shared<FakeDevice>();
  MemoryPool pool(device, test_options());
  cudaStream_t a = device->create_stream("a");
  auto x = PooledBuffer<std::byte>::alloc_async(pool, 400, a);
  device->launch(a, {writes(x.data(), 4096)}, {}, "overrun");
  std::string report;
  // guide-begin read
  for (const FakeDevice::Hazard& hazard : device->hazards()) {
    report += fmt::format("{}: {}\n", FakeDevice::hazard_name(hazard.kind), hazard.what);
  }
  // guide-end
  REQUIRE_THAT(report, Catch::StartsWith("out_of_bounds: write of ") &&
                           Catch::Contains("by \"overrun\" on stream \"a\"") &&
                           Catch::Contains("runs 3584 bytes past the end of the block of 512 "
                                           "bytes (400 asked for)"));
}
