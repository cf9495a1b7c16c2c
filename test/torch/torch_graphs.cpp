// The graph hooks, called as PyTorch's CUDAGraph calls them: begin_allocate_to_pool before
// cudaStreamBeginCapture, end_allocate_to_pool after cudaStreamEndCapture, release_pool when the
// graph is reset. Here the test plays PyTorch: it begins and ends the capture on the fake
// itself. It captures in relaxed mode: on the GPU, every call into the pool switches its thread
// to relaxed mode while a capture is under way (RelaxedCaptureMode in streampool_torch.cpp),
// which the fake does not simulate.
#include "torch_helpers.hpp"

#include <vector>

using streampool::CaptureMode;
using streampool::CaptureStatus;
using streampool::FakeDevice;

namespace {

struct Captured {
  cudaGraphExec_t exec = nullptr;
};

// PyTorch's capture_begin: the hook, then the capture.
void capture_begin(FakeDevice& fake, cudaStream_t s, std::uint64_t pool) {
  REQUIRE(streampool_torch_begin_allocate_to_pool(0, pool, 0, s) == 0);
  REQUIRE(fake.begin_capture(s, CaptureMode::relaxed) == cudaSuccess);
}

// PyTorch's capture_end: the end, the hook, then the instantiation.
Captured capture_end(FakeDevice& fake, cudaStream_t s, std::uint64_t pool) {
  cudaGraph_t graph = nullptr;
  REQUIRE(fake.end_capture(s, &graph) == cudaSuccess);
  REQUIRE(streampool_torch_end_allocate_to_pool(0, pool, 0) == 0);
  Captured c;
  REQUIRE(fake.graph_instantiate(&c.exec, graph) == cudaSuccess);
  REQUIRE(fake.graph_destroy(graph) == cudaSuccess);
  return c;
}

}  // namespace

TEST_CASE("allocations during a capture come from the graph's private pool and stay there") {
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  void* before = streampool_torch_alloc(4096, 0, s);  // a tensor made before the capture
  fake.launch(s, {{before, 4096, true}});

  capture_begin(fake, s, 1);
  void* inside = streampool_torch_alloc(4096, 0, s);
  REQUIRE(inside != nullptr);
  fake.launch(s, {{before, 4096, false}, {inside, 4096, true}});
  void* temporary = streampool_torch_alloc(8192, 0, s);
  fake.launch(s, {{temporary, 8192, true}});
  streampool_torch_free(temporary, 8192, 0, s);  // freed during the capture
  streampool_torch_free(before, 4096, 0, s);     // a shared tensor the graph reads
  Captured graph = capture_end(fake, s, 1);
  REQUIRE(streampool_torch_trim(0) == 0);  // the capture is over: trim runs

  // After the capture, nothing the graph uses is handed out again while its pool lives.
  std::vector<void*> after;
  for (int i = 0; i < 8; ++i) after.push_back(streampool_torch_alloc(8192, 0, s));
  for (int i = 0; i < 8; ++i) after.push_back(streampool_torch_alloc(4096, 0, s));
  for (void* p : after) {
    REQUIRE(p != temporary);
    REQUIRE(p != before);
    REQUIRE(p != inside);
  }
  REQUIRE(fake.graph_launch(graph.exec, s) == cudaSuccess);
  for (void* p : after) fake.launch(s, {{p, 4096, true}});
  fake.complete_all();
  REQUIRE(fake.hazards().empty());
  for (void* p : after) streampool_torch_free(p, 0, 0, s);

  SECTION("released (the graph reset), its memory is returned by the next trim") {
    streampool_torch_free(inside, 4096, 0, s);  // the graph's output, freed by its owner
    const auto held = TorchOnFakes::stats(0).reserved_bytes_current;
    REQUIRE(fake.graph_exec_destroy(graph.exec) == cudaSuccess);
    REQUIRE(streampool_torch_release_pool(0, 1, 0) == 0);
    REQUIRE(TorchOnFakes::stats(0).reserved_bytes_current == held);  // not before the trim
    REQUIRE(streampool_torch_trim(0) == 0);
    REQUIRE(TorchOnFakes::stats(0).reserved_bytes_current == 0);
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(streampool_torch_release_pool(0, 1, 0) == -1);  // released once only
  }
  SECTION("a second capture into the same pool reuses its memory; two releases free it") {
    capture_begin(fake, s, 1);
    void* second = streampool_torch_alloc(8192, 0, s);
    REQUIRE(second == temporary);  // free in the pool since the first capture ended
    fake.launch(s, {{second, 8192, true}});
    streampool_torch_free(second, 8192, 0, s);
    Captured other = capture_end(fake, s, 1);
    REQUIRE(streampool_torch_release_pool(0, 1, 0) == 0);
    REQUIRE(fake.graph_launch(other.exec, s) == cudaSuccess);
    fake.complete_all();
    REQUIRE(fake.hazards().empty());
    REQUIRE(fake.graph_exec_destroy(other.exec) == cudaSuccess);
    REQUIRE(fake.graph_exec_destroy(graph.exec) == cudaSuccess);
    REQUIRE(streampool_torch_release_pool(0, 1, 0) == 0);
    streampool_torch_free(inside, 4096, 0, s);
    REQUIRE(streampool_torch_trim(0) == 0);
    REQUIRE(fake.live_bytes() == 0);
  }
}

TEST_CASE("trim is refused while a capture is under way, and runs again after it") {
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  capture_begin(fake, s, 7);
  REQUIRE(streampool_torch_trim(0) == -1);
  REQUIRE(fake.calls(FakeDevice::Call::device_synchronize) == 0);
  Captured graph = capture_end(fake, s, 7);
  REQUIRE(fake.graph_exec_destroy(graph.exec) == cudaSuccess);
  REQUIRE(streampool_torch_release_pool(0, 7, 0) == 0);
  REQUIRE(streampool_torch_trim(0) == 0);
  REQUIRE(fake.calls(FakeDevice::Call::device_synchronize) >= 1);
}

TEST_CASE("without the begin hook, an allocation during a capture fails and touches nothing") {
  // What a plain CUDAPluggableAllocator (no hooks) gets inside torch.cuda.graph.
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  void* warm = streampool_torch_alloc(4096, 0, s);  // the stream is known to the pool
  streampool_torch_free(warm, 4096, 0, s);
  REQUIRE(fake.begin_capture(s, CaptureMode::relaxed) == cudaSuccess);
  REQUIRE(streampool_torch_alloc(4096, 0, s) == nullptr);
  REQUIRE(std::string(streampool_torch_last_error()).find("without") != std::string::npos);
  cudaGraph_t graph = nullptr;
  REQUIRE(fake.end_capture(s, &graph) == cudaSuccess);
  REQUIRE(fake.graph_destroy(graph) == cudaSuccess);
}

TEST_CASE("route 2: a segment asked for during a capture without the hooks is clean memory no "
          "stream reuses until it is freed, and its free waits for the device") {
  // What torch.cuda.MemPool's cache does inside torch.cuda.graph(pool=...): it begins and ends
  // the capture itself, asks for whole segments on the capturing stream, and frees them when it
  // releases the graph's private pool, after the graph.
  using Call = streampool::FakeDevice::Call;
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  constexpr std::size_t segment = std::size_t{2} << 20;
  void* eager = streampool_torch_segment_alloc(segment, 0, s);  // outside a capture: as alloc
  REQUIRE(eager != nullptr);
  fake.launch(s, {{eager, segment, true}});
  streampool_torch_segment_free(eager, segment, 0, s);  // waits for the device, as cudaFree
  CHECK(fake.calls(Call::device_synchronize) == 1);

  REQUIRE(fake.begin_capture(s, CaptureMode::global) == cudaSuccess);
  void* first = streampool_torch_segment_alloc(segment, 0, s);
  INFO(streampool_torch_last_error());
  REQUIRE(first != nullptr);
  CHECK(first != eager);  // eager's drop may still be pending on s
  void* second = streampool_torch_segment_alloc(segment, 0, s);
  REQUIRE(second != nullptr);
  REQUIRE(second != first);
  fake.launch(s, {{first, segment, true}, {second, segment, false}});
  CaptureStatus status = CaptureStatus::none;
  streampool::CaptureId id = 0;
  REQUIRE(fake.capture_info(s, &status, &id) == cudaSuccess);
  REQUIRE(status == CaptureStatus::active);  // nothing the capture refuses was called
  cudaGraph_t graph = nullptr;
  REQUIRE(fake.end_capture(s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(fake.graph_instantiate(&exec, graph) == cudaSuccess);
  REQUIRE(fake.graph_destroy(graph) == cudaSuccess);
  REQUIRE(fake.graph_launch(exec, s) == cudaSuccess);

  // Eager segments while the graph lives: not the graph's (a sanity check; the segments are
  // live, and the pool hands out nothing twice).
  std::vector<void*> after;
  for (int i = 0; i < 4; ++i) after.push_back(streampool_torch_segment_alloc(segment, 0, s));
  for (void* p : after) {
    REQUIRE(p != nullptr);
    REQUIRE(p != first);
    REQUIRE(p != second);
    fake.launch(s, {{p, segment, true}});
  }
  REQUIRE(fake.graph_launch(exec, s) == cudaSuccess);
  for (void* p : after) streampool_torch_segment_free(p, segment, 0, s);
  CHECK(fake.calls(Call::device_synchronize) == 1 + after.size());
  REQUIRE(fake.graph_exec_destroy(exec) == cudaSuccess);
  const std::size_t synchronized = fake.calls(Call::device_synchronize);

  SECTION("freed: the device is synchronized first, and the memory is the cache's again") {
    streampool_torch_segment_free(first, segment, 0, s);
    CHECK(fake.calls(Call::device_synchronize) == synchronized + 1);
    streampool_torch_segment_free(second, segment, 0, s);
    CHECK(fake.calls(Call::device_synchronize) == synchronized + 2);
    REQUIRE(streampool_torch_trim(0) == 0);
    CHECK(fake.live_bytes() == 0);
  }
  SECTION("freed during a capture of route 1: dropped at the next trim, after a synchronize") {
    cudaStream_t t = fake.create_stream();
    REQUIRE(streampool_torch_begin_allocate_to_pool(0, 9, 0, t) == 0);
    REQUIRE(fake.begin_capture(t, CaptureMode::relaxed) == cudaSuccess);
    streampool_torch_segment_free(first, segment, 0, s);
    streampool_torch_segment_free(second, segment, 0, s);
    CHECK(fake.calls(Call::device_synchronize) == synchronized);  // it would break the capture
    cudaGraph_t other = nullptr;
    REQUIRE(fake.end_capture(t, &other) == cudaSuccess);
    REQUIRE(streampool_torch_end_allocate_to_pool(0, 9, 0) == 0);
    REQUIRE(fake.graph_destroy(other) == cudaSuccess);
    REQUIRE(streampool_torch_release_pool(0, 9, 0) == 0);
    const auto held = TorchOnFakes::stats(0).reserved_bytes_current;
    void* meanwhile = streampool_torch_segment_alloc(segment, 0, s);
    CHECK(meanwhile != first);  // still not the cache's
    CHECK(meanwhile != second);
    streampool_torch_segment_free(meanwhile, segment, 0, s);
    REQUIRE(streampool_torch_trim(0) == 0);
    CHECK(TorchOnFakes::stats(0).reserved_bytes_current < held);  // not before the trim
    CHECK(fake.live_bytes() == 0);
  }
  fake.complete_all();
  CHECK(fake.hazards().empty());
}

TEST_CASE("route 2: a segment there is no room for during a capture fails as out of memory, "
          "and the capture stays active") {
  // The pool's out-of-memory ladder frees segments and synchronizes the device: both refused
  // during a capture (the H200 refuses cudaDeviceSynchronize in a relaxed capture too, and the
  // capture is invalidated). The capture is noticed, so the ladder skips them.
  using Call = streampool::FakeDevice::Call;
  auto options = test_options();
  options.max_reserved_bytes = std::size_t{8} << 20;
  TorchOnFakes torch(options);
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  void* held = streampool_torch_segment_alloc(std::size_t{4} << 20, 0, s);
  REQUIRE(held != nullptr);
  const std::size_t synchronized = fake.calls(Call::device_synchronize);
  const std::size_t freed = fake.calls(Call::free) + fake.calls(Call::vm_unmap);
  const auto mode = GENERATE(CaptureMode::relaxed, CaptureMode::global);
  REQUIRE(fake.begin_capture(s, mode) == cudaSuccess);
  CHECK(streampool_torch_segment_alloc(std::size_t{16} << 20, 0, s) == nullptr);
  CHECK(streampool_torch_last_error_was_out_of_memory() == 1);
  CHECK(fake.calls(Call::device_synchronize) == synchronized);
  CHECK(fake.calls(Call::free) + fake.calls(Call::vm_unmap) == freed);
  CaptureStatus status = CaptureStatus::none;
  REQUIRE(fake.capture_info(s, &status, nullptr) == cudaSuccess);
  CHECK(status == CaptureStatus::active);
  cudaGraph_t graph = nullptr;
  REQUIRE(fake.end_capture(s, &graph) == cudaSuccess);
  REQUIRE(fake.graph_destroy(graph) == cudaSuccess);
  streampool_torch_segment_free(held, 0, 0, s);
  CHECK(fake.hazards().empty());
}

TEST_CASE("route 2 refuses a segment during a capture with cross_stream_wait, and touches "
          "nothing") {
  auto options = test_options();
  options.cross_stream_wait = true;
  TorchOnFakes torch(options);
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  REQUIRE(fake.begin_capture(s, CaptureMode::relaxed) == cudaSuccess);
  CHECK(streampool_torch_segment_alloc(4096, 0, s) == nullptr);
  CHECK(std::string(streampool_torch_last_error()).find("cross_stream_wait") != std::string::npos);
  CHECK(TorchOnFakes::stats(0).live_allocations_current == 0);
  cudaGraph_t graph = nullptr;
  REQUIRE(fake.end_capture(s, &graph) == cudaSuccess);
  REQUIRE(fake.graph_destroy(graph) == cudaSuccess);
}

TEST_CASE("the graph hooks refuse what PyTorch would never ask") {
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  REQUIRE(streampool_torch_end_allocate_to_pool(0, 3, 0) == -1);    // never begun
  REQUIRE(streampool_torch_release_pool(0, 3, 0) == -1);
  REQUIRE(streampool_torch_end_allocate_to_pool(5, 3, 0) == -1);    // no pool on device 5
  capture_begin(fake, s, 3);
  REQUIRE(streampool_torch_begin_allocate_to_pool(0, 3, 0, s) == -1);  // already capturing
  Captured graph = capture_end(fake, s, 3);
  REQUIRE(streampool_torch_end_allocate_to_pool(0, 3, 0) == -1);   // ended already
  REQUIRE(fake.graph_exec_destroy(graph.exec) == cudaSuccess);
  REQUIRE(streampool_torch_release_pool(0, 3, 0) == 0);
}

TEST_CASE("a capture prepared by the begin hook and never begun is given up by the end hook") {
  // PyTorch's capture_begin can fail between the hook and cudaStreamBeginCapture.
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  REQUIRE(streampool_torch_begin_allocate_to_pool(0, 9, 0, s) == 0);
  void* p = streampool_torch_alloc(4096, 0, s);  // not capturing: the shared cache
  REQUIRE(p != nullptr);
  streampool_torch_free(p, 4096, 0, s);
  REQUIRE(streampool_torch_trim(0) == -1);  // the capture counts as under way
  REQUIRE(streampool_torch_end_allocate_to_pool(0, 9, 0) == 0);
  REQUIRE(streampool_torch_release_pool(0, 9, 0) == 0);
  REQUIRE(streampool_torch_trim(0) == 0);
  REQUIRE(fake.live_bytes() == 0);
  SECTION("and the stream can be captured again") {
    REQUIRE(streampool_torch_begin_allocate_to_pool(0, 10, 0, s) == 0);
    REQUIRE(fake.begin_capture(s, CaptureMode::relaxed) == cudaSuccess);
    void* q = streampool_torch_alloc(4096, 0, s);
    REQUIRE(q != nullptr);
    cudaGraph_t graph = nullptr;
    REQUIRE(fake.end_capture(s, &graph) == cudaSuccess);
    REQUIRE(streampool_torch_end_allocate_to_pool(0, 10, 0) == 0);
    REQUIRE(fake.graph_destroy(graph) == cudaSuccess);
    streampool_torch_free(q, 4096, 0, s);
    REQUIRE(streampool_torch_release_pool(0, 10, 0) == 0);
    REQUIRE(streampool_torch_trim(0) == 0);
    REQUIRE(fake.live_bytes() == 0);
  }
}
