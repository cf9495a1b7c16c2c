// Where `streampool-bench stress` runs: a device for the pool, and per worker thread a Lane (two
// streams, an event, the two kernels). The stress loop (stress.cpp) is written once against this
// interface; the GPU implementation is the only CUDA code of the stress command (stress_gpu.cu),
// the fake one simulates the kernels on a FakeDevice (stress_fake.cpp).
#pragma once

#include <streampool/device.hpp>
#include <streampool/pool_options.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace streampool::bench {

// A device call of a lane or target failed; the message names the call and CUDA's error.
class StressError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One worker thread's streams and kernels. Every member but the completion machinery of the fake
// is called only from the thread that owns the lane (after enter_thread). Members throw
// StressError when a device call fails.
class StressLane {
 public:
  virtual ~StressLane() = default;

  // Called first in the worker thread (the GPU lane makes the device current there).
  virtual void enter_thread() {}
  // The stream buffers are allocated on and written on, and the one a third of the checks run on.
  virtual cudaStream_t first() const = 0;
  virtual cudaStream_t second() const = 0;
  // Enqueues on first(): spin `spin_ns` nanoseconds, then write `tag` into every word of
  // data[0, words) (the fake writes only the first, middle and last words).
  virtual void write_tag(unsigned* data, std::size_t words, std::uint32_t tag,
                         std::uint32_t spin_ns) = 0;
  // Enqueues a kernel that counts the words of data[0, words) that differ from `tag`: on first(),
  // or on second() ordered after the work enqueued on first() so far by the lane's event.
  virtual void check_tag(const unsigned* data, std::size_t words, std::uint32_t tag,
                         bool on_second) = 0;
  // Destroys first() and creates a new stream in its place (CUDA, and the fake, usually give it
  // the old handle). Every buffer used on first() must have been dropped.
  virtual void renew_first() = 0;
  // Records an event of the lane's own on first(), which nothing waits for (stress --mark-drops:
  // the GPU's queues get the events fence_every_free records, the pool none of its fences). The
  // fake device has no queues to schedule: a no-op there.
  virtual void mark_first() {}
  // Waits for all of the lane's work and returns the mismatches its checks counted.
  virtual std::uint64_t finish() = 0;
  // Check kernels launched so far whose work has not completed: how far the lane's thread runs
  // ahead of its device. Read without a device call (the GPU's kernels count their completions
  // in host memory), so that asking does not slow the thread it measures.
  virtual std::uint64_t checks_in_flight() const = 0;
};

class StressTarget {
 public:
  virtual ~StressTarget() = default;

  // The device the pool is built on.
  virtual std::shared_ptr<Device> device() const = 0;
  // "fake device" or the GPU's name.
  virtual std::string description() const = 0;
  // Lanes are made before start() and destroyed after stop().
  virtual std::unique_ptr<StressLane> make_lane() = 0;
  // Around the workers' run: the fake starts and stops its completer thread here; after stop()
  // no work is pending.
  virtual void start() {}
  virtual void stop() {}
  // Races and other hazards seen (the fake's race detector); empty on the GPU.
  virtual std::vector<std::string> hazards() const { return {}; }
};

// A FakeDevice with host-backed memory, whose streams a completer thread completes after random
// lags of tens to hundreds of microseconds (drawn from `seed`; thread timing still makes every
// run different).
// Its kernels name the block the pool gives a request under `options` as their access.
std::unique_ptr<StressTarget> make_fake_stress_target(const PoolOptions& options,
                                                      std::uint64_t seed);

// GPU 0. Throws StressError where the bench was built without a CUDA compiler (no kernels) or
// CUDA sees no GPU.
std::unique_ptr<StressTarget> make_gpu_stress_target();
// Whether this build has the stress kernels.
bool gpu_stress_built() noexcept;

}  // namespace streampool::bench
