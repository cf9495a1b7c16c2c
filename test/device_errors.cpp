// Errors that come from a device call: the thrown Error keeps CUDA's value (Error::cuda_error())
// and names the call that failed, whatever path the failure took up to the public API; the
// non-throwing variants report the library's code alone.
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>
#include <streampool/reserved_limit.hpp>

#include <functional>

using streampool::CapturedGraph;
using streampool::CaptureMode;
using streampool::CaptureStatus;
using streampool::CapturePool;
using streampool::Errc;
using streampool::Error;
using streampool::FakeDevice;
using streampool::StreamChecks;
using Bytes = streampool::PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// The Error `call` throws; fails the test when it throws none.
Error thrown_by(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no Error thrown");
  return Error(Errc::success, "");
}

// Segments from cudaMalloc (the tests of that path; expandable segments are test/pool_expandable.cpp's).
streampool::PoolOptions malloc_segments() {
  auto options = test_options();
  options.expandable_segments = false;
  return options;
}

// A stream handle that names no stream any more.
cudaStream_t destroyed_stream(FakeDevice& fake) {
  cudaStream_t s = fake.create_stream();
  fake.destroy_stream(s);
  return s;
}

streampool::PoolOptions with_checks(StreamChecks checks) {
  auto options = test_options();
  options.stream_checks = checks;
  return options;
}

}  // namespace

TEST_CASE("an allocation on an invalid stream keeps CUDA's error and names the lookup's call",
          "[errors][faults]") {
  struct Case {
    StreamChecks checks;
    const char* call;  // what the lookup asks first
  };
  for (const Case c : {Case{StreamChecks::full, "cudaStreamGetCaptureInfo"},
                       Case{StreamChecks::identity, "cudaStreamGetId"},
                       Case{StreamChecks::none, "cudaStreamGetId"}}) {
    CAPTURE(c.call, static_cast<int>(c.checks));
    PoolOnFake pool(with_checks(c.checks));
    cudaStream_t gone = destroyed_stream(pool.fake());

    SECTION("MemoryPool::allocate") {
      const Error e = thrown_by([&] { pool->allocate(256, gone); });
      CHECK(e.errc() == Errc::device_error);
      CHECK(e.cuda_error() == cudaErrorInvalidResourceHandle);
      CHECK_THAT(e.what(), Catch::Contains(c.call));
      CHECK_THAT(e.what(), Catch::Contains("cudaErrorInvalidResourceHandle"));
    }
    SECTION("PooledBuffer::alloc_async") {
      const Error e = thrown_by([&] { Bytes::alloc_async(*pool, 4 * MiB, gone); });
      CHECK(e.errc() == Errc::device_error);
      CHECK(e.cuda_error() == cudaErrorInvalidResourceHandle);
      CHECK_THAT(e.what(), Catch::Contains(c.call));
    }
    SECTION("the non-throwing variants report the library's code") {
      std::error_code error;
      CHECK(pool->try_allocate(256, gone, error) == nullptr);
      CHECK(error == Errc::device_error);
      CHECK(Bytes::try_alloc_async(*pool, 256, gone, error).is_empty());
      CHECK(error == Errc::device_error);
    }
  }
}

TEST_CASE("an allocation whose cudaMalloc fails keeps CUDA's error and names cudaMalloc",
          "[errors][faults]") {
  SECTION("a device error: no reclaim, the error as CUDA gave it") {
    PoolOnFake pool(malloc_segments());
    cudaStream_t s = pool.fake().create_stream();
    pool.fake().fail_next(Call::malloc, 1, cudaErrorLaunchFailure);
    const Error e = thrown_by([&] { Bytes::alloc_async(*pool, 4 * MiB, s); });
    CHECK(e.errc() == Errc::device_error);
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaMalloc"));
    CHECK_THAT(e.what(), Catch::Contains("cudaErrorLaunchFailure"));
    Bytes again = Bytes::alloc_async(*pool, 4 * MiB, s);  // the fault cleared: it works again
    CHECK_FALSE(again.is_empty());
  }
  SECTION("out of memory after every reclaim step: the out-of-memory message and CUDA's refusal") {
    FakeDevice::Options device;
    device.capacity = 64 * MiB;
    PoolOnFake pool(malloc_segments(), device);
    cudaStream_t s = pool.fake().create_stream();
    const Error e = thrown_by([&] { pool->allocate(128 * MiB, s); });
    CHECK(e.errc() == Errc::out_of_memory);
    CHECK(e.cuda_error() == cudaErrorMemoryAllocation);
    CHECK_THAT(e.what(), Catch::Contains("out of memory allocating"));
    CHECK_THAT(e.what(), Catch::Contains("cudaMalloc"));
  }
  SECTION("the same with expandable segments: cuMemCreate's refusal") {
    FakeDevice::Options device;
    device.capacity = 64 * MiB;
    auto options = test_options();
    options.expandable_segments = true;
    PoolOnFake pool(options, device);
    cudaStream_t s = pool.fake().create_stream();
    const Error e = thrown_by([&] { pool->allocate(128 * MiB, s); });
    CHECK(e.errc() == Errc::out_of_memory);
    CHECK(e.cuda_error() == cudaErrorMemoryAllocation);
    CHECK_THAT(e.what(), Catch::Contains("out of memory allocating"));
    CHECK_THAT(e.what(), Catch::Contains("cuMemCreate"));
  }
  SECTION("past max_reserved_bytes: out of memory, as when the device refuses") {
    auto options = test_options();
    options.max_reserved_bytes = 32 * MiB;
    PoolOnFake pool(options);
    cudaStream_t s = pool.fake().create_stream();
    const Error e = thrown_by([&] { pool->allocate(64 * MiB, s); });
    CHECK(e.errc() == Errc::out_of_memory);
    CHECK(e.cuda_error() == cudaErrorMemoryAllocation);
    // The limit refused, not the device: the message says so, and names no device call.
    CHECK_THAT(e.what(), Catch::Contains("max_reserved_bytes"));
    CHECK_THAT(e.what(), !Catch::Contains("cudaMalloc"));
  }
}

// The limit holds a request's bytes while the device call runs (so that two threads cannot both
// pass it); a call the device refuses must give them back, or each refusal would lower the limit
// for good.
TEST_CASE("a device refusal under a reserved-memory limit gives the limit its bytes back",
          "[errors][faults]") {
  auto fake = std::make_shared<FakeDevice>();
  streampool::ReservedLimit limit(fake, 8 * MiB);
  SECTION("cudaMalloc") {
    void* ptr = nullptr;
    fake->fail_next(Call::malloc, 1, cudaErrorLaunchFailure);
    CHECK(limit.malloc(&ptr, 8 * MiB) == cudaErrorLaunchFailure);  // the device's answer
    REQUIRE(limit.malloc(&ptr, 8 * MiB) == cudaSuccess);            // the whole limit again
    CHECK(limit.malloc(&ptr, 1) == cudaErrorMemoryAllocation);      // and no more
    CHECK(limit.free(ptr) == cudaSuccess);
  }
  SECTION("cuMemCreate") {
    streampool::VmHandle handle{};
    fake->fail_next(Call::vm_create, 1, cudaErrorLaunchFailure);
    CHECK(limit.vm_create(&handle, 8 * MiB) == cudaErrorLaunchFailure);
    REQUIRE(limit.vm_create(&handle, 8 * MiB) == cudaSuccess);
    streampool::VmHandle more{};
    CHECK(limit.vm_create(&more, 2 * MiB) == cudaErrorMemoryAllocation);
    CHECK(limit.vm_release(handle) == cudaSuccess);
  }
  SECTION("through a pool: the out-of-memory ladder's retry gets the memory") {
    auto options = malloc_segments();
    options.max_reserved_bytes = 20 * MiB;  // one segment
    PoolOnFake pool(options);
    cudaStream_t s = pool.fake().create_stream();
    pool.fake().fail_next(Call::malloc, 1);  // out of memory, once
    auto buffer = Bytes::alloc_async(*pool, MiB, s);  // the retry asks for the request alone
    CHECK(pool.fake().calls(Call::malloc) == 2);
    CHECK(pool->stats().reserved_bytes.current == static_cast<std::int64_t>(MiB));
  }
}

TEST_CASE("an allocation whose capture-status query fails keeps CUDA's error",
          "[errors][faults]") {
  PoolOnFake pool;  // StreamChecks::full asks the capture status first
  cudaStream_t s = pool.fake().create_stream();
  pool.fake().fail_next(Call::capture_info, 1, cudaErrorLaunchFailure);
  const Error e = thrown_by([&] { pool->allocate(256, s); });
  CHECK(e.errc() == Errc::device_error);
  CHECK(e.cuda_error() == cudaErrorLaunchFailure);
  CHECK_THAT(e.what(), Catch::Contains("cudaStreamGetCaptureInfo"));

  SECTION("also under StreamChecks::none, which asks the status of a new stream while a capture "
          "with a pool is under way") {
    PoolOnFake unchecked(with_checks(StreamChecks::none));
    FakeDevice& fake = unchecked.fake();
    cudaStream_t captured = fake.create_stream();
    auto capture = std::make_shared<CapturePool>(*unchecked);
    streampool::begin_capture_with_pool(capture, captured);
    cudaStream_t fresh = fake.create_stream();
    fake.fail_next(Call::capture_info, 1, cudaErrorLaunchFailure);
    const Error none = thrown_by([&] { unchecked->allocate(256, fresh); });
    CHECK(none.errc() == Errc::device_error);
    CHECK(none.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(none.what(), Catch::Contains("cudaStreamGetCaptureInfo"));
    CapturedGraph graph = streampool::end_capture_with_pool(captured, capture);
  }
}

TEST_CASE("record_stream naming an invalid stream keeps CUDA's error", "[errors][faults]") {
  PoolOnFake pool(with_checks(StreamChecks::identity));
  cudaStream_t s = pool.fake().create_stream();
  Bytes buffer = Bytes::alloc_async(*pool, 256, s);
  cudaStream_t other = pool.fake().create_stream();
  pool.fake().fail_next(Call::stream_id, 1, cudaErrorLaunchFailure);
  const Error e = thrown_by([&] { buffer.record_stream(other); });
  CHECK(e.errc() == Errc::device_error);
  CHECK(e.cuda_error() == cudaErrorLaunchFailure);
  CHECK_THAT(e.what(), Catch::Contains("cudaStreamGetId"));
}

TEST_CASE("the capture layer's errors from device calls keep CUDA's error", "[errors][faults]") {
  PoolOnFake pool(malloc_segments());  // the sections below make cudaMalloc fail
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);

  SECTION("begin_capture_with_pool when the stream's id cannot be asked") {
    fake.fail_next(Call::stream_id, 1, cudaErrorLaunchFailure);
    const Error e = thrown_by([&] { streampool::begin_capture_with_pool(capture, s); });
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaStreamGetId"));
  }
  SECTION("CapturePool::reserve when cudaMalloc fails with a device error") {
    fake.fail_next(Call::malloc, 1, cudaErrorLaunchFailure);
    const Error e = thrown_by([&] { capture->reserve(4 * MiB); });
    CHECK(e.errc() == Errc::device_error);
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaMalloc"));
  }
  SECTION("CapturePool::reserve past the device") {
    fake.set_capacity(16 * MiB);
    const Error e = thrown_by([&] { capture->reserve(64 * MiB); });
    CHECK(e.errc() == Errc::out_of_memory);
    CHECK(e.cuda_error() == cudaErrorMemoryAllocation);
  }
  SECTION("a relaxed capture that cannot grow: exhausted, with the refusal that stopped it") {
    streampool::begin_capture_with_pool(capture, s, CaptureMode::relaxed);
    fake.fail_next(Call::malloc, 1, cudaErrorLaunchFailure);
    const Error e = thrown_by([&] { Bytes::alloc_async(*pool, 4 * MiB, s); });
    CHECK(e.errc() == Errc::capture_pool_exhausted);
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaMalloc"));
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  }
  SECTION("a capture-pool error that no device call caused carries none") {
    capture->seal();
    streampool::begin_capture_with_pool(capture, s);
    const Error e = thrown_by([&] { Bytes::alloc_async(*pool, 256, s); });
    CHECK(e.errc() == Errc::capture_pool_sealed);
    CHECK(e.cuda_error() == cudaSuccess);
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  }
  // A refused begin or end leaves nothing behind: the stream is not capturing, no graph or user
  // object stays, and the CapturePool captures again (its binding to the stream was undone). The
  // checks after the last section hold after each of them.
  SECTION("begin_capture_with_pool when cudaStreamBeginCapture fails") {
    fake.fail_next(Call::begin_capture, 1, cudaErrorLaunchFailure);
    const Error e = thrown_by([&] { streampool::begin_capture_with_pool(capture, s); });
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaStreamBeginCapture"));
  }
  SECTION("end_capture_with_pool when cudaUserObjectCreate fails") {
    streampool::begin_capture_with_pool(capture, s);
    fake.fail_next(Call::user_object_create, 1, cudaErrorLaunchFailure);
    const Error e = thrown_by([&] { streampool::end_capture_with_pool(s, capture); });
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaUserObjectCreate"));
  }
  SECTION("end_capture_with_pool when cudaGraphInstantiate fails") {
    capture->reserve(MiB);
    streampool::begin_capture_with_pool(capture, s);
    auto inside = Bytes::alloc_async(*pool, 4096, s);  // a buffer of the capture, dropped in it
    inside.reset();
    fake.fail_next(Call::graph_instantiate, 1, cudaErrorLaunchFailure);
    const Error e = thrown_by([&] { streampool::end_capture_with_pool(s, capture); });
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaGraphInstantiate"));
    CHECK(fake.live_user_objects() == 0);  // the graph's reference to the pool went with it
  }
  CHECK(fake.live_graphs() == 0);
  CaptureStatus status = CaptureStatus::active;
  REQUIRE(fake.capture_info(s, &status, nullptr) == cudaSuccess);
  CHECK(status == CaptureStatus::none);
  streampool::begin_capture_with_pool(capture, s);  // the pool captures again
  CapturedGraph again = streampool::end_capture_with_pool(s, capture);
  CHECK(fake.live_graphs() == 1);
}
