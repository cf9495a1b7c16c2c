// A device for interleaving tests: a FakeDevice behind a ForwardingDevice that runs a test's
// action at one chosen point, right before or right after the next call of a kind. The action
// stands for another thread doing something at exactly that moment, deterministically: the race
// a stress test finds by luck, a hook finds every time.
//
//   HookedPool pool(test_options());
//   pool.device->after_next(Call::device_synchronize, [&] { /* another thread's drop */ });
//   pool->trim();
//
// An action runs with whatever locks the library holds at that call, so one that needs them
// deadlocks; run it on a thread of its own (on_own_thread) where it may block, and where a
// library that took the lock later must still see it. Actions must not throw (the seam is
// noexcept) and, on other threads, must not use Catch's assertions: they record what they saw
// and the test asserts it afterwards.
#pragma once

#include "pool_helpers.hpp"

#include <streampool/device.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

class HookedDevice final : public streampool::ForwardingDevice {
 public:
  using Call = streampool::FakeDevice::Call;
  // The names device_calls.def uses, as in namespace streampool.
  using StreamId = streampool::StreamId;
  using CaptureId = streampool::CaptureId;
  using CaptureMode = streampool::CaptureMode;
  using CaptureStatus = streampool::CaptureStatus;

  explicit HookedDevice(std::shared_ptr<streampool::FakeDevice> fake)
      : ForwardingDevice(fake), fake_(std::move(fake)) {}

  streampool::FakeDevice& fake() const noexcept { return *fake_; }

  // Runs `action` once, just before the next call of `call` reaches the fake device.
  void before_next(Call call, std::function<void()> action) {
    add(call, false, std::move(action));
  }
  // Runs `action` once, just after the next call of `call` returned from the fake device, before
  // the library sees the result.
  void after_next(Call call, std::function<void()> action) { add(call, true, std::move(action)); }

  // How many actions have run so far.
  int fired() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return fired_;
  }
  // Runs the actions whose call never came. A test does it after the operation it hooked, so
  // that the other thread's action happens in any case (later, if a rewritten library no longer
  // makes that call at that point): what the test asserts must hold for every interleaving.
  void run_unfired() {
    std::vector<Hook> left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      left.swap(hooks_);
      fired_ += static_cast<int>(left.size());
    }
    for (Hook& hook : left) hook.action();
  }

#define STREAMPOOL_DEVICE_CALL(name, params, args)     \
  cudaError_t name params noexcept override {          \
    run(Call::name, false);                            \
    const cudaError_t result = inner().name args;      \
    run(Call::name, true);                             \
    return result;                                     \
  }
#include <streampool/device_calls.def>

 private:
  struct Hook {
    Call call;
    bool after;
    std::function<void()> action;
  };

  void add(Call call, bool after, std::function<void()> action) {
    std::lock_guard<std::mutex> lock(mutex_);
    hooks_.push_back({call, after, std::move(action)});
  }

  void run(Call call, bool after) noexcept {
    std::function<void()> action;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = hooks_.begin(); it != hooks_.end(); ++it) {
        if (it->call == call && it->after == after) {
          action = std::move(it->action);
          hooks_.erase(it);
          ++fired_;
          break;
        }
      }
    }
    if (action) action();
  }

  std::shared_ptr<streampool::FakeDevice> fake_;
  mutable std::mutex mutex_;
  std::vector<Hook> hooks_;
  int fired_ = 0;
};

// A MemoryPool on a HookedDevice over a fresh FakeDevice.
struct HookedPool {
  std::shared_ptr<streampool::FakeDevice> fake_device;
  std::shared_ptr<HookedDevice> device;
  std::unique_ptr<streampool::MemoryPool> pool;

  explicit HookedPool(streampool::PoolOptions options = test_options(),
                      streampool::FakeDevice::Options device_options = {})
      : fake_device(std::make_shared<streampool::FakeDevice>(device_options)),
        device(std::make_shared<HookedDevice>(fake_device)),
        pool(std::make_unique<streampool::MemoryPool>(device, options)) {}

  streampool::FakeDevice& fake() { return *fake_device; }
  streampool::MemoryPool& operator*() { return *pool; }
  streampool::MemoryPool* operator->() { return pool.get(); }
};

// Runs `action` on a thread of its own, as another thread of the program would, and waits for
// it up to `patience`. An action still blocked then (on a lock its caller holds) is left to
// finish once the caller lets go; the returned future is ready when it has.
inline std::shared_future<void> on_own_thread(
    std::function<void()> action,
    std::chrono::milliseconds patience = std::chrono::milliseconds(2000)) {
  std::packaged_task<void()> task(std::move(action));
  std::shared_future<void> done = task.get_future().share();
  std::thread(std::move(task)).detach();
  done.wait_for(patience);
  return done;
}
