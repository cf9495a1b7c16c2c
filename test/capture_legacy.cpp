// The legacy default stream while a blocking stream (cudaStreamPerThread) captures: CUDA refuses
// every call naming the legacy stream with cudaErrorStreamCaptureImplicit, and those that enqueue
// on it (an event record, a wait) or synchronize it invalidate the capture as well (seen on an
// H100, 2026-12-06; the device contract's case). A pool serving a buffer of the legacy stream
// then may not ask that stream anything it cannot answer by failing the request, and may not
// invalidate a capture it has no part in, however the buffer comes back.
#include "fake_helpers.hpp"
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <thread>

using fake_test::end_and_discard;
using streampool::CaptureMode;
using streampool::CaptureStatus;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

CaptureStatus status_of(FakeDevice& fake, cudaStream_t stream) {
  CaptureStatus status = CaptureStatus::none;
  REQUIRE(fake.capture_info(stream, &status, nullptr) == cudaSuccess);
  return status;
}

}  // namespace

TEST_CASE("an allocation on the legacy stream while cudaStreamPerThread captures fails with "
          "CUDA's error and leaves the capture active") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  REQUIRE(fake.begin_capture(cudaStreamPerThread, CaptureMode::relaxed) == cudaSuccess);
  std::error_code error;
  void* ptr = pool->try_allocate(4 * KiB, cudaStreamLegacy, error);
  cudaError_t thrown = cudaSuccess;
  try {
    auto buffer = Bytes::alloc_async(*pool, 3 * MiB, cudaStreamLegacy);
  } catch (const streampool::Error& e) {
    thrown = e.cuda_error();
  }
  const CaptureStatus during = status_of(fake, cudaStreamPerThread);
  end_and_discard(fake, cudaStreamPerThread, cudaSuccess);
  CHECK(ptr == nullptr);
  CHECK(error == streampool::Errc::device_error);
  CHECK(thrown == cudaErrorStreamCaptureImplicit);
  CHECK(during == CaptureStatus::active);
  // Once the capture has ended the legacy stream is served again.
  auto again = Bytes::alloc_async(*pool, 4 * KiB, cudaStreamLegacy);
  CHECK(again.data() != nullptr);
}

// A buffer of the legacy stream, in use there, dropped (and freed through the raw API) while this
// thread's per-thread stream captures: the drop has no way to fence the legacy stream now. It
// must neither invalidate the capture nor let another stream have the memory before the legacy
// stream's work is done; once the capture ends the memory comes back.
TEST_CASE("a legacy stream's block dropped while cudaStreamPerThread captures leaves the capture "
          "alone and reaches no other stream early") {
  const std::size_t bytes = GENERATE(std::size_t{4 * KiB}, std::size_t{3 * MiB});
  const bool raw = GENERATE(false, true);
  const CaptureMode mode =
      GENERATE(CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed);
  CAPTURE(bytes, raw, static_cast<int>(mode));
  streampool::PoolOptions options = test_options();
  options.fence_every_free = GENERATE(false, true);
  CAPTURE(options.fence_every_free);
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t other = fake.create_stream();
  // A second stream seen, so that drops are fenced rather than kept for the stream alone.
  { auto seen = Bytes::alloc_async(*pool, bytes, other); }

  Bytes buffer;
  void* raw_ptr = nullptr;
  void* at = nullptr;
  if (raw) {
    raw_ptr = pool->allocate(bytes, cudaStreamLegacy);
    at = raw_ptr;
  } else {
    buffer = Bytes::alloc_async(*pool, bytes, cudaStreamLegacy);
    at = buffer.data();
  }
  fake.launch(cudaStreamLegacy, {{at, bytes, true}});  // stays pending

  REQUIRE(fake.begin_capture(cudaStreamPerThread, mode) == cudaSuccess);
  if (raw) {
    pool->deallocate(raw_ptr, bytes, cudaStreamLegacy);
  } else {
    buffer.reset();
  }
  const CaptureStatus during = status_of(fake, cudaStreamPerThread);
  end_and_discard(fake, cudaStreamPerThread, during == CaptureStatus::active
                                                  ? cudaSuccess
                                                  : cudaErrorStreamCaptureInvalidated);
  CHECK(during == CaptureStatus::active);

  // The legacy stream's write is still pending: another stream's allocation of the same size
  // must not get its memory (the fake reports the overlap if it does).
  auto next = Bytes::alloc_async(*pool, bytes, other);
  fake.launch(other, {{next.data(), bytes, true}});
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  next.reset();
  fake.complete_all();
  REQUIRE(fake.stream_synchronize(other) == cudaSuccess);
  // Nothing is lost: with all work done, a trim (a device synchronize) leaves no block waiting.
  pool->trim();
  const streampool::PoolBreakdown parts = pool->breakdown();
  CHECK(parts.parked_blocks == 0);
  CHECK(parts.stranded_blocks == 0);
  CHECK(pool->stats().live_allocations.current == 0);
}

// A capture with a pool that another thread begins on its per-thread stream (a blocking one),
// just before the next `call` of `device` reaches the fake, waited for up to 200 ms there;
// `make()` makes the call. What became of the capture is read before the thread ends it.
struct BlockingBegin {
  bool fired_in = false;      // the hook ran inside make()
  bool began = false;         // the begin returned
  bool began_before = false;  // ... by the time the call was made
  CaptureStatus during = CaptureStatus::none;

  BlockingBegin(HookedPool& pool, HookedDevice::Call call, CaptureMode mode,
                const std::function<void()>& make) {
    FakeDevice& fake = pool.fake();
    auto capture = std::make_shared<streampool::CapturePool>(*pool);
    std::promise<void> go;
    std::promise<void> finish;
    std::atomic<bool> begun{false};
    std::thread capturer([&, go_now = go.get_future(), finish_now = finish.get_future()]() mutable {
      go_now.wait();
      try {
        streampool::begin_capture_with_pool(capture, cudaStreamPerThread, mode);
        begun = true;
      } catch (const streampool::Error&) {
      }
      finish_now.wait();
      if (fake.capture_info(cudaStreamPerThread, &during, nullptr) != cudaSuccess) {
        during = CaptureStatus::none;
      }
      try {
        streampool::CapturedGraph graph =
            streampool::end_capture_with_pool(cudaStreamPerThread, capture);
      } catch (const streampool::Error&) {
      }
    });
    bool fired = false;
    pool.device->before_next(call, [&] {
      fired = true;
      go.set_value();
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (!begun && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      began_before = begun;
    });
    make();
    fired_in = fired;
    pool.device->run_unfired();  // else the capture begins now, so that the thread ends
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!begun && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    began = begun;
    finish.set_value();
    capturer.join();
  }
};

// The same, with the capture's begin on another thread coming between a call's look at the
// legacy stream (not yet refused: nothing captures) and the call, which would then invalidate
// the capture: the drop's fence, release_stream's synchronize, cross_stream_wait's wait. The
// begin waits for the call, in every mode (found in review, 2026-12-08: the legacy stream's calls
// were made under no permit).
TEST_CASE("a capture with a pool of a blocking stream begun while a call on the legacy stream is "
          "past its look at the gate waits for that call, in every mode") {
  const CaptureMode mode =
      GENERATE(CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed);
  CAPTURE(static_cast<int>(mode));
  streampool::PoolOptions options = one_block_slabs();  // a miss looks at other streams
  options.fence_every_free = true;  // a drop on the legacy stream records a fence there
  options.cross_stream_wait = true;
  HookedPool pool(options);
  FakeDevice& fake = pool.fake();
  // A second stream seen first: otherwise the begin's registration of its stream, the pool's
  // second, takes every stream's lock (StreamRegistry::note_several), and waits for the drop's.
  cudaStream_t a = fake.create_stream();
  Bytes::alloc_async(*pool, 4 * KiB, a).reset();
  HookedDevice::Call call = HookedDevice::Call::event_record;
  std::function<void()> make;
  std::optional<Bytes> held;
  SECTION("the fence of a drop") {
    held = Bytes::alloc_async(*pool, 4 * KiB, cudaStreamLegacy);
    call = HookedDevice::Call::event_record;
    make = [&] { held.reset(); };
  }
  SECTION("the synchronize of release_stream") {
    {
      auto buffer = Bytes::alloc_async(*pool, 4 * KiB, cudaStreamLegacy);
      fake.launch(cudaStreamLegacy, {{buffer.data(), 4 * KiB, true}});
    }  // fenced on the legacy stream, pending
    call = HookedDevice::Call::stream_synchronize;
    make = [&] { pool->release_stream(cudaStreamLegacy); };
  }
  SECTION("the wait of a miss on another stream's pending fence (cross_stream_wait)") {
    {
      auto on_a = Bytes::alloc_async(*pool, 4 * KiB, a);
      fake.launch(a, {{on_a.data(), 4 * KiB, true}});
    }  // fenced on a, pending: the legacy stream's miss waits on that fence
    call = HookedDevice::Call::stream_wait_event;
    make = [&] { Bytes::alloc_async(*pool, 4 * KiB, cudaStreamLegacy).reset(); };
  }
  CAPTURE(static_cast<int>(call));
  const BlockingBegin begin(pool, call, mode, make);
  REQUIRE(begin.fired_in);  // the call was made
  CHECK(begin.began);
  CHECK_FALSE(begin.began_before);
  CHECK(begin.during == CaptureStatus::active);
  fake.complete_all();
}

// A capture of any stream may be joined by a blocking one (a wait on an event recorded in the
// capture), which then restricts the legacy stream as a capture of its own would, and the library
// cannot see the join: while any capture with a pool is under way, it makes none of the legacy
// stream's calls (found in review, 2026-12-08: a version that counted only the captures of
// blocking streams recorded a legacy stream's fence as cudaStreamPerThread joined a non-blocking
// stream's capture, and invalidated it).
TEST_CASE("a capture with a pool of a non-blocking stream that a blocking stream joins is left "
          "intact by a drop on the legacy stream, in every mode") {
  const CaptureMode mode =
      GENERATE(CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed);
  CAPTURE(static_cast<int>(mode));
  streampool::PoolOptions options = test_options();
  options.fence_every_free = true;  // a drop on the legacy stream would record a fence there
  HookedPool pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  Bytes::alloc_async(*pool, 4 * KiB, a).reset();  // a second stream seen
  cudaStream_t captured = fake.create_stream();   // non-blocking
  auto on_legacy = Bytes::alloc_async(*pool, 4 * KiB, cudaStreamLegacy);
  auto capture = std::make_shared<streampool::CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, captured, mode);
  cudaEvent_t forked = nullptr;
  REQUIRE(fake.event_create(&forked) == cudaSuccess);
  REQUIRE(fake.event_record(forked, captured) == cudaSuccess);  // in the capture
  // This thread's per-thread stream (a blocking one) joins the capture just before the drop's
  // record reaches the device, or after the drop where it makes none.
  cudaError_t joined = cudaErrorUnknown;
  pool.device->before_next(HookedDevice::Call::event_record,
                           [&] { joined = fake.stream_wait_event(cudaStreamPerThread, forked); });
  on_legacy.reset();
  pool.device->run_unfired();
  const CaptureStatus during = status_of(fake, captured);
  // The joined stream joined back, and the capture ended (refused where it was invalidated).
  cudaEvent_t back = nullptr;
  REQUIRE(fake.event_create(&back) == cudaSuccess);
  static_cast<void>(fake.event_record(back, cudaStreamPerThread));
  static_cast<void>(fake.stream_wait_event(captured, back));
  try {
    streampool::CapturedGraph graph = streampool::end_capture_with_pool(captured, capture);
  } catch (const streampool::Error&) {
  }
  CHECK(joined == cudaSuccess);
  CHECK(during == CaptureStatus::active);
  static_cast<void>(fake.event_destroy(forked));
  static_cast<void>(fake.event_destroy(back));
  fake.complete_all();
}
