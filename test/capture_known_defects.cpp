// Known defects of the capture layer's bookkeeping, found in review on 2026-12-07 and not fixed
// yet: two ways the library's count of captures and what CUDA captures part. Each test fails
// today (hidden, [.known-defect], so the suite and CI do not run them; run them by that tag). A
// fix makes its test pass, and takes the test out of this file and the tag off.
//
// 1. A thread's exit counts its left per-thread captures over (ExitWatch, a thread_local
//    destructor) before CUDA ends them (the runtime's thread cleanup runs after C++'s
//    thread_local destructors): another thread's restricted call in that window is refused.
// 2. A per-thread capture still bound to its CapturePool when its thread exits stays counted until
//    the CapturePool is detached or dropped, though CUDA ended it with the thread.
// (A third, a restricted call checked before a capture's begin and made after it, is fixed:
// capture_calls.cpp, "a global capture with a pool begun while another thread's growth is past
// its look at the gate ...".)
#include "fake_helpers.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

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
