// docs/guide.md, "Quick start": a pool, a buffer on a stream, its drop and its reuse, on the fake
// device so that it runs on any machine. Exits with 1 when the pool's statistics are not what the
// guide says they are.
#include <streampool/streampool.hpp>

#include <fmt/format.h>

#include <cstdio>

int main() {
  // guide-begin quick_start
  auto device = std::make_shared<streampool::FakeDevice>();  // a CudaDevice(0) on a GPU
  streampool::MemoryPool pool(device);
  cudaStream_t stream = device->create_stream("main");

  {
    auto buffer = streampool::PooledBuffer<float>::alloc_async(pool, 1000, stream);
    // A kernel on `stream` would use buffer.data(); the fake is told what the work touches.
    device->launch(stream, {streampool::writes(buffer)}, {}, "fill");
  }  // dropped: reusable on `stream` at once (stream order), on other streams after a fence

  auto again = streampool::PooledBuffer<float>::alloc_async(pool, 1000, stream);
  const streampool::PoolStats stats = pool.stats();
  fmt::print("{}\n", streampool::to_string(stats));
  // guide-end

  bool right = true;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) std::fprintf(stderr, "quick_start: not as docs/guide.md says: %s\n", what);
    right = right && ok;
  };
  // guide-begin quick_start_stats
  // The first allocation took the slow path and reserved one segment; the second came off the
  // stream's own free list, while the first one's work was still pending.
  expect(stats.cache_misses == 1 && stats.cache_hits == 1, "one miss, then one hit");
  expect(stats.device_allocations == 1, "one device allocation");
  expect(stats.live_allocations.current == 1, "one live buffer");
  expect(device->pending_work() == 1, "the fill still pending");
  // guide-end
  again.reset();
  device->complete_all();
  device->destroy_stream(stream);
  expect(device->hazards().empty(), "no hazard");
  return right ? 0 : 1;
}
