// docs/guide.md, "Capture and graph lifetime": a CapturePool on the fake device (which simulates
// capture, graphs and their user objects as CUDA does): what it keeps alive and until when, and
// what an allocation during a capture may not do. Exits with 1 when the pool's statistics or the
// errors are not what the guide says they are.
#include <streampool/streampool.hpp>

#include <cstddef>
#include <cstdio>
#include <system_error>

using streampool::Errc;
using streampool::PooledBuffer;
using streampool::reads;
using streampool::writes;

namespace {

bool right = true;
void expect(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "capture: not as docs/guide.md says: %s\n", what);
  right = right && ok;
}

}  // namespace

int main() {
  auto device = std::make_shared<streampool::FakeDevice>();
  streampool::MemoryPool pool(device);
  cudaStream_t stream = device->create_stream("main");
  const std::size_t n = 1024;
  auto live = [&] { return pool.stats().live_allocations.current; };

  // guide-begin capture
  auto capture = std::make_shared<streampool::CapturePool>(pool);
  capture->reserve(std::size_t{1} << 20);  // set aside before: nothing to grow in the capture

  auto weights = PooledBuffer<float>::alloc_async(pool, n, stream);  // made before the capture
  const float* w = weights.data();
  capture->record_buffer(std::move(weights));  // now lives as long as the CapturePool

  streampool::begin_capture_with_pool(capture, stream);
  auto scratch = PooledBuffer<float>::alloc_async(pool, n, stream);  // the CapturePool's memory
  device->launch(stream, {reads(w, n * sizeof(float)), writes(scratch)}, {}, "step");
  scratch.reset();  // back to the CapturePool: reusable later in this capture, on this stream
  streampool::CapturedGraph graph = streampool::end_capture_with_pool(stream, capture);
  capture.reset();  // safe: the graph holds its own reference

  graph.launch(stream);  // every replay reads `w` and writes the same scratch memory
  graph.launch(stream);
  // guide-end
  expect(graph.replay_count() == 2, "two replays");
  expect(live() == 2, "the pool holds the weights and the reserved range");

  // guide-begin capture_release
  device->complete_all();                // on a GPU: the last replay completes
  graph = streampool::CapturedGraph();   // destroys the executable graph
  streampool::complete_graph_releases();  // or wait for the library's next safe point
  // guide-end
  expect(live() == 0, "the weights and the CapturePool's memory back to the pool");

  // guide-begin capture_refused
  streampool::PoolOptions no_vm;  // segments of cudaMalloc, as without virtual memory
  no_vm.expandable_segments = false;
  streampool::MemoryPool fixed(device, no_vm);
  auto limited = std::make_shared<streampool::CapturePool>(fixed);
  limited->reserve(std::size_t{1} << 20);
  streampool::begin_capture_with_pool(limited, stream);
  std::error_code past_reserve;
  auto big = PooledBuffer<std::byte>::try_alloc_async(fixed, std::size_t{4} << 20, stream,
                                                      past_reserve);
  // Errc::capture_pool_exhausted: more than reserve() set aside, and growing would take a
  // cudaMalloc, which CUDA refuses during a global-mode capture (`pool`, on virtual memory,
  // would map more instead)
  limited->seal();
  std::error_code after_seal;
  auto small = PooledBuffer<std::byte>::try_alloc_async(fixed, 256, stream, after_seal);
  // Errc::capture_pool_sealed: a sealed CapturePool serves no new allocation
  auto unharmed = streampool::end_capture_with_pool(stream, limited);  // the capture goes on
  // guide-end
  expect(big.is_empty() && past_reserve == Errc::capture_pool_exhausted,
         "capture_pool_exhausted past the reserve");
  expect(small.is_empty() && after_seal == Errc::capture_pool_sealed,
         "capture_pool_sealed once sealed");
  expect(unharmed.valid(), "the capture ended with a graph");
  limited.reset();
  unharmed = streampool::CapturedGraph();
  device->complete_all();
  streampool::complete_graph_releases();
  expect(live() == 0, "everything back to the pool");
  expect(fixed.stats().live_allocations.current == 0, "everything back to the pool without VM");

  device->destroy_stream(stream);
  expect(device->hazards().empty(), "no hazard");
  return right ? 0 : 1;
}
