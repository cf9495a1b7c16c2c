// Known defects of the capture layer's bookkeeping, found in review on 2026-12-07 and not fixed
// yet: three ways the library's count of captures and what CUDA captures part. Each test fails
// today (hidden, [.known-defect], so the suite and CI do not run them; run them by that tag). A
// fix makes its test pass, and takes the test out of this file and the tag off.
//
// 1. A thread's exit counts its left per-thread captures over (ExitWatch, a thread_local
//    destructor) before CUDA ends them (the runtime's thread cleanup runs after C++'s
//    thread_local destructors): another thread's restricted call in that window is refused.
// 2. A per-thread capture still bound to its CapturePool when its thread exits stays counted until
//    the CapturePool is detached or dropped, though CUDA ended it with the thread.
// 3. calls_allowed() is read, then the restricted call made, with nothing that keeps a capture from
//    beginning in between (large_tier.cpp's growth, reclaim.cpp's synchronize, fences.cpp's event
//    queries): a global capture begun meanwhile is invalidated by the call. A fix: restricted
//    calls hold a permit from their check through their call, and a capture's begin, once
//    counted, waits for the permits already given (this test's hook then must not wait for the
//    begin).
#include "fake_helpers.hpp"
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <atomic>
#include <functional>
#include <future>
#include <thread>

using streampool::CapturedGraph;
using streampool::CaptureMode;
using streampool::CapturePool;
using streampool::CaptureStatus;
using streampool::FakeDevice;
using Bytes = streampool::PooledBuffer<std::byte>;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

CaptureStatus own_status(FakeDevice& fake) {
  return fake_test::capture_status(fake, cudaStreamPerThread);
}

// A thread_local of the test's whose destructor runs at its thread's exit, in the reverse order
// of first use: made after the fake's per-thread streams and before the capture guard's
// ExitWatch, it runs after the ExitWatch and before the per-thread stream's capture ends.
struct AtExit {
  std::function<void()> action;
  ~AtExit() {
    if (action) action();
  }
};
AtExit& at_exit_here() {
  thread_local AtExit at_exit;
  return at_exit;
}
}  // namespace

// ExitWatch counts a per-thread capture left to its thread over as soon as the thread's exit
// begins; CUDA (and the fake) ends it only later in the exit (the runtime's own thread cleanup).
// Meanwhile another thread's trim makes a device synchronize that the capture refuses.
TEST_CASE("known defect: a per-thread capture left to an exiting thread is counted over before "
          "it ends",
          "[.known-defect]") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  Bytes::alloc_async(*pool, 4 * MiB, fake.create_stream()).reset();
  fake.complete_all();
  std::promise<void> in_window;
  std::promise<void> trimmed;
  std::shared_future<void> trimmed_future = trimmed.get_future().share();
  CaptureStatus status_in_window = CaptureStatus::none;
  CaptureStatus status_after_trim = CaptureStatus::none;
  std::thread t([&] {
    static_cast<void>(own_status(fake));  // the fake's per-thread stream first
    at_exit_here().action = [&] {
      status_in_window = own_status(fake);
      in_window.set_value();
      trimmed_future.wait();
      status_after_trim = own_status(fake);
    };
    auto cp = std::make_shared<CapturePool>(*pool);
    streampool::begin_capture_with_pool(cp, cudaStreamPerThread, CaptureMode::global);
    // Its CapturePool goes on another thread: the capture is left to this one.
    std::thread([moved = std::move(cp)]() mutable { moved.reset(); }).join();
  });  // exits mid-capture
  in_window.get_future().wait();
  const auto before = fake.calls(FakeDevice::Call::device_synchronize);
  pool->trim(0);  // another thread: the count says no capture is under way
  const auto after = fake.calls(FakeDevice::Call::device_synchronize);
  trimmed.set_value();
  t.join();
  INFO("the exiting thread's capture in the window: " << static_cast<int>(status_in_window)
                                                       << ", after the trim: "
                                                       << static_cast<int>(status_after_trim));
  REQUIRE(status_in_window == CaptureStatus::active);  // CUDA still captures
  // No call the capture refuses while it is under way: fails, the trim synchronized the device,
  // which the capture refused (and was invalidated by).
  CHECK(after == before);
  CHECK(status_after_trim == CaptureStatus::active);
  fake.complete_all();
}

// ExitWatch counts over only the captures left to the exiting thread: one still bound to its
// CapturePool stays counted though CUDA ended it with the thread, and every thread's device
// synchronize (and, in global mode, cudaMalloc) stays refused until someone drops or detaches
// the CapturePool.
TEST_CASE("known defect: a per-thread capture still bound when its thread exits stays counted",
          "[.known-defect]") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t other = fake.create_stream();
  Bytes::alloc_async(*pool, 4 * MiB, other).reset();
  fake.complete_all();
  std::shared_ptr<CapturePool> cp = std::make_shared<CapturePool>(*pool);
  std::thread([&] {
    streampool::begin_capture_with_pool(cp, cudaStreamPerThread, CaptureMode::global);
  }).join();  // exits mid-capture, the CapturePool kept
  REQUIRE(fake.device_synchronize() == cudaSuccess);  // CUDA ended it with the thread
  const auto before = fake.calls(FakeDevice::Call::device_synchronize);
  pool->trim(0);
  CHECK(fake.calls(FakeDevice::Call::device_synchronize) > before);  // fails: still counted
  std::error_code error;
  auto grown = Bytes::try_alloc_async(*pool, 64 * MiB, other, error);
  CHECK_FALSE(error);  // fails: capture_forbids_call
  grown.reset();
  cp.reset();
  fake.complete_all();
}

// calls_allowed is read, then the call made, with nothing that keeps a capture from beginning in
// between: a global capture begun with a pool while another thread's growth has decided on
// cudaMalloc is invalidated by that cudaMalloc, though prepare promises that from then on no
// thread makes a call the capture refuses.
TEST_CASE("known defect: a global capture begun while another thread's growth is past its "
          "check",
          "[.known-defect]") {
  HookedPool pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t other = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  std::atomic<bool> began{false};
  pool.device->before_next(FakeDevice::Call::malloc, [&] {
    // Another thread begins a capture now, after this one's calls_allowed(malloc).
    on_own_thread([&] {
      try {
        streampool::begin_capture_with_pool(capture, s, CaptureMode::global);
        began = true;
      } catch (...) {
      }
    });
  });
  std::error_code error;
  auto grown = Bytes::try_alloc_async(*pool, 64 * MiB, other, error);
  pool.device->run_unfired();
  REQUIRE(began);
  INFO("the growth's error: " << error.message());
  CHECK(fake_test::capture_status(fake, s) == CaptureStatus::active);  // fails: invalidated
  grown.reset();
  cudaGraph_t graph = nullptr;
  if (fake_test::capture_status(fake, s) != CaptureStatus::none) {
    // Begun on another thread in global mode: ended from here, CUDA ends it (wrong thread).
    static_cast<void>(fake.end_capture(s, &graph));
    if (graph != nullptr) static_cast<void>(fake.graph_destroy(graph));
  }
  streampool::detach_capture_with_pool(capture);
  capture.reset();
  fake.complete_all();
}
