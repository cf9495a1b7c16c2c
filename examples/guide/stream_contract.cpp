// docs/guide.md, "The stream contract": a buffer used on a second stream, a stream destroyed the
// right way and the wrong way, and the errors an allocation reports, on the fake device. Exits
// with 1 when the fake's hazards or the errors are not what the guide says they are.
#include <streampool/streampool.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdio>
#include <system_error>
#include <vector>

using streampool::Errc;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using streampool::reads;
using streampool::writes;

namespace {

bool right = true;
void expect(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "stream_contract: not as docs/guide.md says: %s\n", what);
  right = right && ok;
}

std::vector<FakeDevice::Hazard::Kind> kinds(const FakeDevice& device) {
  std::vector<FakeDevice::Hazard::Kind> out;
  for (const auto& hazard : device.hazards()) out.push_back(hazard.kind);
  return out;
}

}  // namespace

int main() {
  auto device = std::make_shared<FakeDevice>();
  streampool::FakeStreamOps ops(device);
  streampool::MemoryPool pool(device);
  cudaStream_t a = ops.create_stream("a");
  cudaStream_t b = ops.create_stream("b");
  const std::size_t n = 1024;
  auto no_kernel = [](cudaStream_t) {};  // on a GPU: the kernel launch

  // guide-begin cross_stream
  auto x = PooledBuffer<float>::alloc_async(pool, n, a);    // usable on `a` at once
  ops.enqueue(a, "produce", {writes(x)}, no_kernel);
  ops.order_after(b, a);  // an event recorded on `a`, waited on by `b`
  x.record_stream(b);     // the memory is recycled only after `b`'s work too
  ops.enqueue(b, "consume", {reads(x)}, no_kernel);
  x.reset();              // dropped on `a`, its own stream; fenced before another stream gets it
  // guide-end
  expect(device->hazards().empty(), "a buffer used on two streams the right way: no hazard");
  device->complete_all();

  // guide-begin release_stream
  cudaStream_t c = ops.create_stream("c");
  {
    auto scratch = PooledBuffer<std::byte>::alloc_async(pool, 4096, c);
    ops.enqueue(c, "scratch", {writes(scratch)}, no_kernel);
  }                        // every buffer used on `c` dropped first,
  pool.release_stream(c);  // then the pool told (required under StreamChecks::none),
  ops.destroy_stream(c);   // then the stream destroyed
  // guide-end
  expect(device->hazards().empty(), "a stream released and destroyed the right way: no hazard");
  device->complete_all();

  // guide-begin destroyed_stream
  cudaStream_t d = ops.create_stream("short-lived");
  auto kept = PooledBuffer<float>::alloc_async(pool, n, d);
  ops.destroy_stream(d);  // `kept` is still live: FakeDevice reports destroyed_stream
  // guide-end
  expect(kinds(*device) == std::vector{FakeDevice::Hazard::Kind::destroyed_stream},
         "a stream destroyed under a live buffer: one destroyed_stream hazard");
  for (const auto& hazard : device->hazards()) {
    fmt::print("{}: {}\n", FakeDevice::hazard_name(hazard.kind), hazard.what);
  }
  device->clear_hazards();
  kept = {};  // too late, but the fake's work is complete: nothing else to report
  device->device_synchronize();

  // A capture begun by someone else, without a pool: under StreamChecks::full (the default) the
  // allocation fails and the capture goes on.
  expect(device->begin_capture(a, streampool::CaptureMode::global) == cudaSuccess, "capture");
  // guide-begin errors
  try {
    auto y = PooledBuffer<float>::alloc_async(pool, n, a);  // `a` is being captured, no pool
  } catch (const streampool::Error& e) {
    fmt::print("{}\n", e.what());
    expect(e.errc() == Errc::capture_without_pool, "capture_without_pool");
  }
  std::error_code error;
  auto z = PooledBuffer<float>::try_alloc_async(pool, n, a, error);  // the same, as a code
  expect(z.is_empty() && error == Errc::capture_without_pool, "try_alloc_async's code");
  // guide-end
  streampool::CaptureStatus status{};
  streampool::CaptureId id{};
  expect(device->capture_info(a, &status, &id) == cudaSuccess &&
             status == streampool::CaptureStatus::active,
         "the capture is not harmed");
  cudaGraph_t graph = nullptr;
  expect(device->end_capture(a, &graph) == cudaSuccess, "end the capture");
  device->graph_destroy(graph);

  // guide-begin out_of_memory
  streampool::PoolOptions limited;
  limited.max_reserved_bytes = std::size_t{64} << 20;
  streampool::MemoryPool small_pool(device, limited);
  try {
    auto big = PooledBuffer<std::byte>::alloc_async(small_pool, std::size_t{100} << 20, a);
  } catch (const streampool::Error& e) {
    fmt::print("{}\n", e.what());
    expect(e.errc() == Errc::out_of_memory, "out_of_memory past max_reserved_bytes");
  }
  // guide-end

  ops.destroy_stream(b);
  ops.destroy_stream(a);
  expect(device->hazards().empty(), "no other hazard");
  return right ? 0 : 1;
}
