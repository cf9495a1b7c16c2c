// Device calls failing inside the capture layer and at pool destruction (issue 9, "seen today"):
// the stream leaves capture, the error names the call and keeps CUDA's value, nothing leaks, and
// everything works again once the fault clears.
#include "fake_helpers.hpp"
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

using fake_test::capture_status;
using streampool::CapturedGraph;
using streampool::CaptureMode;
using streampool::CapturePool;
using streampool::CaptureStatus;
using streampool::Errc;
using streampool::Error;
using streampool::FakeDevice;
using Bytes = streampool::PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Completes the graph releases still queued when it goes out of scope (see capture_lifetime.cpp).
struct CompleteReleasesAtExit {
  CompleteReleasesAtExit() = default;
  CompleteReleasesAtExit(const CompleteReleasesAtExit&) = delete;
  CompleteReleasesAtExit& operator=(const CompleteReleasesAtExit&) = delete;
  ~CompleteReleasesAtExit() { streampool::complete_graph_releases(); }
};

// The whole round once the fault cleared: a capture with `capture` on `s` gives a graph that
// launches, and the allocation the capture made comes from its private memory.
void captures_again(streampool::MemoryPool& pool, FakeDevice& fake,
                    const std::shared_ptr<CapturePool>& capture, cudaStream_t s) {
  streampool::begin_capture_with_pool(capture, s);
  Bytes inside = Bytes::alloc_async(pool, 4096, s);
  fake.launch(s, {{inside.data(), inside.byte_size(), true}});
  inside.reset();
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  REQUIRE(capture_status(fake, s) == CaptureStatus::none);
  graph.launch(s);
  fake.complete_all();
  REQUIRE(fake.hazards().empty());
}

// The MemoryPool's reserved bytes once the CapturePools and graphs are gone and it trimmed.
std::int64_t reserved_after_trim(streampool::MemoryPool& pool) {
  streampool::complete_graph_releases();
  pool.trim();
  return pool.stats().reserved_bytes.current;
}

}  // namespace

TEST_CASE("a capture-status query failing after a successful begin leaves the stream not capturing",
          "[capture][faults]") {
  CompleteReleasesAtExit complete;
  HookedPool pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  const int failures = GENERATE(1, 2, 3);
  // The end that discards the capture fails too (the stream stays capturing after it).
  const bool end_fails = GENERATE(false, true);
  CAPTURE(failures, end_fails);
  pool.device->after_next(Call::begin_capture, [&] {
    fake.fail_next(Call::capture_info, failures);
    if (end_fails) fake.fail_next(Call::end_capture, 1);
  });
  try {
    streampool::begin_capture_with_pool(capture, s);
    FAIL("began a capture whose id could not be asked");
  } catch (const Error& e) {
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaStreamGetCaptureInfo"));
  }
  fake.fail_next(Call::capture_info, 0);
  CHECK(capture_status(fake, s) == CaptureStatus::none);
  // Nothing of the failed begin is left: not the pool's claim, not the stream's binding, not a
  // restriction on other threads' calls.
  Bytes outside = Bytes::alloc_async(*pool, 32 * MiB, fake.create_stream());
  captures_again(*pool, fake, capture, s);
}

// Found in review, 2026-12-07: a begin that could not bind its capture, and whose every end CUDA
// refused, stopped counting the capture while the stream still captured: the pool's next device
// allocation (another stream, global mode) was refused by CUDA and invalidated it. It stays
// prepared with the pool, as the framework route's prepare leaves it, until
// detach_capture_with_pool after the caller ends it.
TEST_CASE("a begin that can neither bind nor end its capture leaves it counted, for "
          "detach_capture_with_pool",
          "[capture][faults]") {
  CompleteReleasesAtExit complete;
  HookedPool pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  pool.device->after_next(Call::begin_capture, [&] {
    fake.fail_next(Call::capture_info, 1);
    fake.fail_next(Call::end_capture, 1000);
  });
  try {
    streampool::begin_capture_with_pool(capture, s);
    FAIL("began a capture whose id could not be asked");
  } catch (const Error& e) {
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("detach_capture_with_pool"));
  }
  fake.fail_next(Call::end_capture, 0);
  REQUIRE(capture_status(fake, s) == CaptureStatus::active);
  std::error_code error;
  CHECK(Bytes::try_alloc_async(*pool, 32 * MiB, fake.create_stream(), error).is_empty());
  CHECK(error == Errc::capture_forbids_call);
  CHECK(capture_status(fake, s) == CaptureStatus::active);  // not invalidated
  fake_test::end_and_discard(fake, s, cudaSuccess);
  streampool::detach_capture_with_pool(capture);
  Bytes outside = Bytes::alloc_async(*pool, 32 * MiB, fake.create_stream());
  captures_again(*pool, fake, capture, s);
}

TEST_CASE("an end_capture that fails leaves the stream not capturing, as the header promises",
          "[capture][faults]") {
  CompleteReleasesAtExit complete;
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  const int failures = GENERATE(1, 2, 3);
  CAPTURE(failures);
  streampool::begin_capture_with_pool(capture, s);
  fake.launch(s);
  fake.fail_next(Call::end_capture, failures);
  try {
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
    FAIL("ended a capture whose end failed");
  } catch (const Error& e) {
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaStreamEndCapture"));
  }
  fake.fail_next(Call::end_capture, 0);
  CHECK(capture_status(fake, s) == CaptureStatus::none);
  Bytes outside = Bytes::alloc_async(*pool, 32 * MiB, fake.create_stream());
  captures_again(*pool, fake, capture, s);
}

TEST_CASE("an end_capture that CUDA refuses every time leaves the stream bound to its pool, for "
          "a later end",
          "[capture][faults]") {
  CompleteReleasesAtExit complete;
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  streampool::begin_capture_with_pool(capture, s);
  fake.fail_next(Call::end_capture, 1000);
  try {
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
    FAIL("ended a capture whose every end failed");
  } catch (const Error& e) {
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("still capturing"));
  }
  fake.fail_next(Call::end_capture, 0);
  REQUIRE(capture_status(fake, s) == CaptureStatus::active);
  // Still the pool's capture: its allocations come from the pool, and no thread makes a call the
  // capture forbids (a device allocation is refused rather than invalidating it).
  Bytes inside = Bytes::alloc_async(*pool, 4096, s);
  std::error_code error;
  CHECK(Bytes::try_alloc_async(*pool, 32 * MiB, fake.create_stream(), error).is_empty());
  CHECK(error == Errc::capture_forbids_call);
  inside.reset();
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  CHECK(capture_status(fake, s) == CaptureStatus::none);
  graph.launch(s);
  fake.complete_all();
}

TEST_CASE("a graph destroy that fails does not keep the CapturePool's memory for good",
          "[capture][faults]") {
  CompleteReleasesAtExit complete;
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  const int failures = GENERATE(1, 3);
  CAPTURE(failures);
  {
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(20 * MiB);
    streampool::begin_capture_with_pool(capture, s);
    fake.launch(s);
    // end_capture_with_pool destroys the graph once it is instantiated.
    fake.fail_next(Call::graph_destroy, failures);
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
    graph.launch(s);
    fake.complete_all();
  }
  fake.fail_next(Call::graph_destroy, 0);
  CHECK(reserved_after_trim(*pool) == 0);
  CHECK(fake.live_user_objects() == 0);
  pool.pool.reset();
  CHECK(fake.live_bytes() == 0);
}

TEST_CASE("a graph-exec destroy that fails does not keep the CapturePool's memory for good",
          "[capture][faults]") {
  CompleteReleasesAtExit complete;
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  const int failures = GENERATE(1, 3);
  CAPTURE(failures);
  {
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(20 * MiB);
    streampool::begin_capture_with_pool(capture, s);
    fake.launch(s);
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
    graph.launch(s);
    fake.complete_all();
    fake.fail_next(Call::graph_exec_destroy, failures);
  }  // ~CapturedGraph destroys the executable graph
  fake.fail_next(Call::graph_exec_destroy, 0);
  CHECK(reserved_after_trim(*pool) == 0);
  CHECK(fake.live_user_objects() == 0);
  pool.pool.reset();
  CHECK(fake.live_bytes() == 0);
}

TEST_CASE("frees that fail while the pool is destroyed do not leak its segments",
          "[pool][faults]") {
  auto fake = std::make_shared<FakeDevice>();
  const int failures = GENERATE(1, 2, 3);
  CAPTURE(failures);
  {
    streampool::MemoryPool pool(fake, test_options());
    cudaStream_t s = fake->create_stream();
    Bytes large = Bytes::alloc_async(pool, 32 * MiB, s);
    Bytes small = Bytes::alloc_async(pool, 4096, s);
    REQUIRE(fake->live_allocations() >= 1);
    fake->fail_next(Call::free, failures);
  }
  fake->fail_next(Call::free, 0);
  // A later safe point (here: a new pool) frees what could not be freed then.
  streampool::MemoryPool next(fake, test_options());
  CHECK(fake->live_allocations() == 0);
  CHECK(fake->live_bytes() == 0);
}

TEST_CASE("unmaps, releases and unreserves that fail while the pool is destroyed do not leak "
          "its expandable segments",
          "[pool][faults]") {
  auto fake = std::make_shared<FakeDevice>();
  const int failures = GENERATE(1, 2, 3);
  const auto call = GENERATE(Call::vm_unmap, Call::vm_release, Call::vm_unreserve);
  CAPTURE(failures, FakeDevice::call_name(call));
  auto options = test_options();
  options.expandable_segments = true;
  {
    streampool::MemoryPool pool(fake, options);
    cudaStream_t s = fake->create_stream();
    Bytes large = Bytes::alloc_async(pool, 32 * MiB, s);
    Bytes small = Bytes::alloc_async(pool, 4096, s);
    REQUIRE(fake->live_vm_handles() >= 1);
    REQUIRE(fake->live_reservations() == 1);
    fake->fail_next(call, failures);
  }
  fake->fail_next(call, 0);
  streampool::MemoryPool next(fake, test_options());
  CHECK(fake->live_vm_handles() == 0);
  CHECK(fake->live_reservations() == 0);
  CHECK(fake->live_bytes() == 0);
}

TEST_CASE("event destroys that fail while the pool is destroyed do not leak its events",
          "[pool][faults]") {
  auto fake = std::make_shared<FakeDevice>();
  const int failures = GENERATE(1, 2, 3);
  CAPTURE(failures);
  {
    auto options = test_options();
    options.fence_every_free = true;  // a fence (an event) per drop
    streampool::MemoryPool pool(fake, options);
    cudaStream_t s = fake->create_stream();
    cudaStream_t t = fake->create_stream();
    for (cudaStream_t stream : {s, t, s}) {
      Bytes buffer = Bytes::alloc_async(pool, 4096, stream);
      fake->launch(stream, {{buffer.data(), buffer.byte_size(), true}});
    }
    fake->complete(t);
    Bytes::alloc_async(pool, 4096, s).reset();  // more of s's fences
    REQUIRE(fake->live_events() >= 2);
    fake->fail_next(Call::event_destroy, failures);
  }
  // One refusal is retried at once; an event refused twice waits, with the pool, for the next
  // safe point (as a segment whose free is refused does).
  if (failures == 1) CHECK(fake->live_events() == 0);
  fake->fail_next(Call::event_destroy, 0);
  streampool::MemoryPool next(fake, test_options());
  CHECK(fake->live_events() == 0);
  CHECK(fake->live_allocations() == 0);
}

// A raw free on this thread's per-thread stream while it captures with a pool, whose capture
// status CUDA fails to give: the pool cannot find the stream's state, and the gate, which knows a
// per-thread stream's binding by its state, did not see the capture, so the block went back to
// the cache (parked until a device synchronize) while the graph could use it (the model check,
// seed 9691, 2026-12-06).
TEST_CASE("a raw free on a capturing per-thread stream whose status cannot be asked is the "
          "capture's") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t other = fake.create_stream("other");
  constexpr std::size_t bytes = 64 * 1024 + 512;
  void* x = pool->allocate(bytes, cudaStreamPerThread);
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, cudaStreamPerThread);
  fake.launch(cudaStreamPerThread, {{x, bytes, false}}, {}, "graph reads x");
  fake.fail_next(Call::capture_info, 1);
  pool->deallocate(x, bytes, cudaStreamPerThread);
  fake.fail_next(Call::capture_info, 0);
  CapturedGraph graph = streampool::end_capture_with_pool(cudaStreamPerThread, capture);
  fake.complete_all();
  pool->trim();
  auto y = Bytes::alloc_async(*pool, bytes, other);
  CHECK(static_cast<const void*>(y.data()) != x);
  graph.launch(cudaStreamPerThread);
  fake.complete_all();
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
}
