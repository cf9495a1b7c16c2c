// CapturePool on the H200: real captures, real graphs, real replays.
#include "kernels.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/cuda_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <thread>

namespace {

using streampool::CapturedGraph;
using streampool::CapturePool;
using streampool::PooledBuffer;

constexpr std::size_t words = 1 << 20;

struct Fixture {
  std::shared_ptr<streampool::CudaDevice> cuda = std::make_shared<streampool::CudaDevice>(0);
  streampool::MemoryPool pool{cuda};
  cudaStream_t stream = nullptr;
  unsigned long long* mismatches = nullptr;

  Fixture() {
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&mismatches), sizeof *mismatches) == cudaSuccess);
    REQUIRE(cudaMemset(mismatches, 0, sizeof *mismatches) == cudaSuccess);
  }
  ~Fixture() {
    cudaDeviceSynchronize();
    cudaFree(mismatches);
    pool.release_stream(stream);
    cudaStreamDestroy(stream);
  }
  // Reserved bytes, once a buffer allocated and dropped on `stream` is cached and its work done:
  // what a trim would free.
  std::int64_t cached_buffer() {
    { auto cached = PooledBuffer<std::uint32_t>::alloc_async(pool, words, stream); }
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    const std::int64_t reserved = pool.stats().reserved_bytes.current;
    REQUIRE(reserved > 0);
    return reserved;
  }
  unsigned long long found() {
    unsigned long long n = ~0ull;
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    REQUIRE(cudaMemcpy(&n, mismatches, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess);
    return n;
  }
  // Zeroes the buffer, replays, and counts words the replay did not write.
  void replay_and_check(const std::function<void()>& launch, std::uint32_t* data,
                        std::uint32_t value) {
    REQUIRE(cudaMemsetAsync(data, 0, words * sizeof(std::uint32_t), stream) == cudaSuccess);
    launch();
    REQUIRE(gpu_test::launch_count_mismatches(stream, data, words, value, mismatches) ==
            cudaSuccess);
  }
};

// Captures a kernel that fills a buffer cut from the pool's private memory; the pool keeps the
// buffer; the caller keeps only the address.
CapturedGraph capture_fill(Fixture& f, const std::shared_ptr<CapturePool>& pool,
                           std::uint32_t** data, std::uint32_t value) {
  streampool::begin_capture_with_pool(pool, f.stream);
  auto out = PooledBuffer<std::uint32_t>::alloc_async(f.pool, words, f.stream);
  REQUIRE(gpu_test::launch_delayed_fill(f.stream, out.data(), words, value, 0) == cudaSuccess);
  *data = out.data();
  pool->record_buffer(std::move(out));
  return streampool::end_capture_with_pool(f.stream, pool);
}

}  // namespace

TEST_CASE("captured kernels replay into pool memory after the caller dropped its handles",
          "[capture][gpu]") {
  Fixture f;
  auto pool = std::make_shared<CapturePool>(f.pool);
  pool->reserve(words * sizeof(std::uint32_t));
  std::uint32_t* data = nullptr;
  CapturedGraph graph = capture_fill(f, pool, &data, 0xabcd1234u);
  pool.reset();  // the graph holds its own reference; the buffer lives with the pool
  for (int i = 0; i < 3; ++i) f.replay_and_check([&] { graph.launch(f.stream); }, data, 0xabcd1234u);
  REQUIRE(graph.replay_count() == 3);
  REQUIRE(f.found() == 0);
}

TEST_CASE("a CapturePool with nothing reserved grows during a real global-mode capture by "
          "mapping, and the graph replays into that memory", "[capture][gpu]") {
  Fixture f;
  {
    // The pool's first growth, before the capture: its reservation of addresses.
    auto first = PooledBuffer<std::uint32_t>::alloc_async(f.pool, 1 << 18, f.stream);
  }
  const auto reserved_before = f.pool.stats().reserved_bytes.current;
  auto pool = std::make_shared<CapturePool>(f.pool);  // nothing reserved
  std::uint32_t* data = nullptr;
  CapturedGraph graph = capture_fill(f, pool, &data, 0x5eed5eedu);
  REQUIRE(graph.valid());
  REQUIRE(pool->reserved_bytes() >= words * sizeof(std::uint32_t));
  REQUIRE(f.pool.stats().reserved_bytes.current > reserved_before);  // mapped in the capture
  pool.reset();
  for (int i = 0; i < 3; ++i) f.replay_and_check([&] { graph.launch(f.stream); }, data, 0x5eed5eedu);
  REQUIRE(f.found() == 0);
}

TEST_CASE("a raw executable graph replays into live memory after its wrapper is gone",
          "[capture][gpu]") {
  Fixture f;
  const auto baseline = f.pool.stats().live_allocations.current;
  {
    auto pool = std::make_shared<CapturePool>(f.pool);
    pool->reserve(words * sizeof(std::uint32_t));
    std::uint32_t* data = nullptr;
    CapturedGraph graph = capture_fill(f, pool, &data, 0x5eedu);
    pool.reset();
    cudaGraphExec_t exec = graph.release();
    graph = CapturedGraph();
    for (int i = 0; i < 3; ++i) {
      f.replay_and_check([&] { REQUIRE(cudaGraphLaunch(exec, f.stream) == cudaSuccess); }, data,
                         0x5eedu);
    }
    REQUIRE(f.found() == 0);
    REQUIRE(f.pool.stats().live_allocations.current > baseline);  // still held by the graph
    REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  }
  // CUDA runs the user object's destructor on a thread of its own, some time after: the release
  // it queues is completed at the library's next safe point.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (f.pool.stats().live_allocations.current != baseline &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    streampool::complete_graph_releases();
  }
  REQUIRE(f.pool.stats().live_allocations.current == baseline);
}

TEST_CASE("a sealed pool's refusal during a real capture reaches the caller, and the capture "
          "survives",
          "[capture][gpu]") {
  Fixture f;
  auto pool = std::make_shared<CapturePool>(f.pool);
  pool->reserve(words * sizeof(std::uint32_t));
  pool->seal();
  streampool::begin_capture_with_pool(pool, f.stream);
  std::error_code error;
  auto refused = PooledBuffer<std::uint32_t>::try_alloc_async(f.pool, 1024, f.stream, error);
  REQUIRE(refused.is_empty());
  REQUIRE(error == streampool::Errc::capture_pool_sealed);
  cudaStreamCaptureStatus status{};
  REQUIRE(cudaStreamIsCapturing(f.stream, &status) == cudaSuccess);
  REQUIRE(status == cudaStreamCaptureStatusActive);
  REQUIRE_NOTHROW(streampool::end_capture_with_pool(f.stream, pool));
}

TEST_CASE("a buffer dropped during a real capture is reused within the same capture",
          "[capture][gpu]") {
  Fixture f;
  auto pool = std::make_shared<CapturePool>(f.pool);
  pool->reserve(2 * words * sizeof(std::uint32_t));
  streampool::begin_capture_with_pool(pool, f.stream);
  std::uint32_t* first = nullptr;
  {
    auto a = PooledBuffer<std::uint32_t>::alloc_async(f.pool, words, f.stream);
    REQUIRE(gpu_test::launch_delayed_fill(f.stream, a.data(), words, 1u, 0) == cudaSuccess);
    first = a.data();
  }
  auto b = PooledBuffer<std::uint32_t>::alloc_async(f.pool, words, f.stream);
  REQUIRE(b.data() == first);
  REQUIRE(gpu_test::launch_delayed_fill(f.stream, b.data(), words, 2u, 0) == cudaSuccess);
  std::uint32_t* data = b.data();
  pool->record_buffer(std::move(b));
  CapturedGraph graph = streampool::end_capture_with_pool(f.stream, pool);
  for (int i = 0; i < 3; ++i) f.replay_and_check([&] { graph.launch(f.stream); }, data, 2u);
  REQUIRE(f.found() == 0);
}

// The per-thread default stream's capture, left under way when its CapturePool goes on another
// thread (capture_pool.hpp): the pool makes none of the calls CUDA would refuse during a global
// capture (and be invalidated by) until this thread has ended it and the pool has seen so.
TEST_CASE("a global per-thread capture left under way by its CapturePool's going on another "
          "thread survives the pool's trim and growth, and the pool frees again once it ended",
          "[capture][gpu]") {
  Fixture f;
  const auto reserved = f.cached_buffer();
  auto cp = std::make_shared<CapturePool>(f.pool);
  streampool::begin_capture_with_pool(cp, cudaStreamPerThread, streampool::CaptureMode::global);
  std::thread([moved = std::move(cp)]() mutable { moved.reset(); }).join();
  const auto capturing = [] {
    cudaStreamCaptureStatus status{};
    REQUIRE(cudaStreamIsCapturing(cudaStreamPerThread, &status) == cudaSuccess);
    return status;
  };
  REQUIRE(capturing() == cudaStreamCaptureStatusActive);
  f.pool.trim(0);  // neither a device synchronize nor a free
  CHECK(capturing() == cudaStreamCaptureStatusActive);
  CHECK(f.pool.stats().reserved_bytes.current == reserved);
  std::error_code error;
  auto grown = PooledBuffer<std::uint32_t>::try_alloc_async(f.pool, 64 * words, f.stream, error);
  CHECK(capturing() == cudaStreamCaptureStatusActive);
  grown.reset();
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(cudaStreamPerThread, &graph) == cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  f.pool.trim(0);  // sees the capture ended: synchronizes and frees
  CHECK(f.pool.stats().reserved_bytes.current == 0);
}

// The framework route given up before the caller's end (test/capture_external.cpp on the fake):
// the capture stays counted while CUDA captures, so another thread's trim neither synchronizes
// nor frees, and the caller's end succeeds.
TEST_CASE("a real global capture detached before the caller's end survives another thread's "
          "trim, and the pool frees again once it ended",
          "[capture][gpu]") {
  Fixture f;
  const auto reserved = f.cached_buffer();
  auto cp = std::make_shared<CapturePool>(f.pool);
  streampool::prepare_capture_with_pool(cp, f.stream, streampool::CaptureMode::global);
  REQUIRE(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(streampool::attach_capture_with_pool(cp));
  streampool::detach_capture_with_pool(cp);  // before the caller's end
  std::thread([&] { f.pool.trim(0); }).join();
  cudaStreamCaptureStatus status{};
  REQUIRE(cudaStreamIsCapturing(f.stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  CHECK(f.pool.stats().reserved_bytes.current == reserved);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(f.stream, &graph) == cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  f.pool.trim(0);  // sees the capture ended: synchronizes and frees
  CHECK(f.pool.stats().reserved_bytes.current == 0);
}

// A stream that waits on an event recorded in a capture joins it: a buffer of that stream which
// the graph writes, dropped there during the capture, must stay the graph's. Before the fix
// (test/capture_joined.cpp on the fake) the drop went to the stream's own list: the next
// allocation of its size took the memory, and each replay overwrote it.
TEST_CASE("a buffer dropped on a stream that joined a real capture is not handed out while the "
          "graph replays into it", "[capture]") {
  const std::size_t bytes = GENERATE(std::size_t{64} << 10, std::size_t{4} << 20);
  CAPTURE(bytes);
  const std::size_t n = bytes / sizeof(std::uint32_t);
  Fixture f;
  cudaStream_t side = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t fork = nullptr;
  cudaEvent_t back = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&back, cudaEventDisableTiming) == cudaSuccess);
  {
    auto x = PooledBuffer<std::uint32_t>::alloc_async(f.pool, n, side);
    REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
    auto cp = std::make_shared<CapturePool>(f.pool);
    streampool::begin_capture_with_pool(cp, f.stream, streampool::CaptureMode::relaxed);
    REQUIRE(cudaEventRecord(fork, f.stream) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side, fork, 0) == cudaSuccess);  // side joins the capture
    REQUIRE(gpu_test::launch_delayed_fill(side, x.data(), n, 0xAB, 1000) == cudaSuccess);
    x.reset();  // on side, during the capture it joined
    REQUIRE(cudaEventRecord(back, side) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(f.stream, back, 0) == cudaSuccess);
    CapturedGraph graph = streampool::end_capture_with_pool(f.stream, cp);
    cp.reset();

    // Another buffer of the same size on the same stream, filled with its own value; then the
    // graph replays (writing 0xAB where x was) and the buffer is checked.
    f.pool.trim();
    auto y = PooledBuffer<std::uint32_t>::alloc_async(f.pool, n, side);
    REQUIRE(gpu_test::launch_delayed_fill(side, y.data(), n, 0x11, 0) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
    graph.launch(f.stream);
    REQUIRE(cudaStreamSynchronize(f.stream) == cudaSuccess);
    REQUIRE(gpu_test::launch_count_mismatches(f.stream, y.data(), n, 0x11, f.mismatches) ==
            cudaSuccess);
    CHECK(f.found() == 0);
    REQUIRE(cudaStreamSynchronize(f.stream) == cudaSuccess);
    y.reset();
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  f.pool.release_stream(side);
  REQUIRE(cudaEventDestroy(fork) == cudaSuccess);
  REQUIRE(cudaEventDestroy(back) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
}
