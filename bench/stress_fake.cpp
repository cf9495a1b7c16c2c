// The stress command on the fake device. The kernels are units of work that name every byte of
// the buffer's block as what they write or read, so the fake's race detector checks every
// hand-over the pool makes; their bodies write and check the tag in three words only (first,
// middle, last), which keeps the cost on the CPU low. A completer thread plays the GPU's part:
// work launched on an idle stream makes the stream due a random lag later (20-300 us), and the
// completer completes each stream that is due (everything enqueued on it by then), so work is
// often still pending when a buffer is dropped and its memory handed out again.
//
// The block, not the requested bytes: the request rounded up as the pool documents (to its size
// class's block, or to a multiple of large_rounding), all of it the buffer's own. The fake's race
// detector keeps a boundary for every distinct end of an access it has seen, for as long as the
// device allocation lives, and walks them on every access; the requests' odd sizes would leave
// millions of boundaries after a few seconds and slow every launch to a crawl, while the blocks'
// ends are few.
#include "stress_target.hpp"

#include <streampool/fake_device.hpp>
#include <streampool/size_classes.hpp>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>

namespace streampool::bench {
namespace {

void checked(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw StressError(fmt::format("FakeDevice::{}: {}", call, cudaGetErrorName(status)));
  }
}

using Clock = std::chrono::steady_clock;

// The lag between a stream's first pending launch and its completion.
constexpr int min_lag_us = 20;
constexpr int max_lag_us = 300;
// A lane launches no more while this many of its kernels are pending, as a GPU's launch queue
// holds back a thread that runs too far ahead. Without it the workers, which launch faster than
// the completer can complete on a small machine, pile up work (and the pool memory for it)
// without bound, and the figures would describe the backlog rather than the pool.
constexpr int max_pending_kernels = 64;
// The fake's memory: less than an H200's, because the pages the bodies touch stay resident in host
// memory while their device allocation lives, so the capacity is what a runaway pool may take
// from the host. A workload with at most T x 8 MiB live needs a small part of it.
constexpr std::size_t fake_capacity = std::size_t{16} << 30;
// A lane waiting longer than this for its work to complete gives up (the completer has stopped).
constexpr auto completion_timeout = std::chrono::seconds(10);

// The words a fake kernel touches.
std::array<std::size_t, 3> probes(std::size_t words) { return {0, words / 2, words - 1}; }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// When a stream's pending work is due to complete: 0 while nothing is pending, else a time of
// now_ns(). Set by the launching thread when it finds the stream idle, cleared by the completer
// before it completes the stream (so that a launch racing the completion makes it due again).
class Due {
 public:
  void launched(std::int64_t lag_ns) {
    std::int64_t idle = 0;
    at_.compare_exchange_strong(idle, now_ns() + lag_ns, std::memory_order_relaxed);
  }
  bool take_if_due(std::int64_t now) {
    std::int64_t at = at_.load(std::memory_order_relaxed);
    return at != 0 && at <= now && at_.compare_exchange_strong(at, 0, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::int64_t> at_{0};
};

// The bytes of the block the pool hands out for a request (pool_options.hpp, size_classes.hpp).
class BlockExtent {
 public:
  explicit BlockExtent(const PoolOptions& options)
      : classes_(options.size_classes), large_rounding_(options.large_rounding) {}

  std::size_t operator()(std::size_t bytes) const {
    if (!classes_.is_large(bytes)) return classes_.block_size(classes_.class_of(bytes));
    return (bytes + large_rounding_ - 1) / large_rounding_ * large_rounding_;
  }

 private:
  SizeClasses classes_;
  std::size_t large_rounding_;
};

class FakeLane final : public StressLane {
 public:
  FakeLane(std::shared_ptr<FakeDevice> fake, const BlockExtent& extent, std::uint64_t seed)
      : fake_(std::move(fake)),
        extent_(extent),
        random_(seed),
        first_(fake_->create_stream()),
        second_(fake_->create_stream()),
        drain_(fake_->create_stream()) {
    checked(fake_->event_create(&order_), "event_create");
    checked(fake_->event_create(&retire_), "event_create");
  }

  ~FakeLane() override {
    fake_->event_destroy(order_);
    fake_->event_destroy(retire_);
    std::lock_guard lock(mutex_);
    for (cudaStream_t s : {first_, second_, drain_}) fake_->destroy_stream(s);
  }

  cudaStream_t first() const override { return first_; }
  cudaStream_t second() const override { return second_; }

  void write_tag(unsigned* data, std::size_t words, std::uint32_t tag, std::uint32_t) override {
    wait_for_room();
    fake_->launch(first_, {{data, extent_(words * sizeof(unsigned)), true}},
                  [data, words, tag, pending = pending_] {
                    for (std::size_t i : probes(words)) data[i] = tag;
                    pending->fetch_sub(1, std::memory_order_relaxed);
                  });
    launched(first_due_);
  }

  void check_tag(const unsigned* data, std::size_t words, std::uint32_t tag,
                 bool on_second) override {
    cudaStream_t stream = first_;
    if (on_second) {
      checked(fake_->event_record(order_, first_), "event_record");
      checked(fake_->stream_wait_event(second_, order_), "stream_wait_event");
      stream = second_;
    }
    wait_for_room();
    fake_->launch(stream, {{data, extent_(words * sizeof(unsigned)), false}},
                  [data, words, tag, mismatches = mismatches_, pending = pending_,
                   checks = checks_] {
                    for (std::size_t i : probes(words)) {
                      if (data[i] != tag) mismatches->fetch_add(1, std::memory_order_relaxed);
                    }
                    checks->fetch_sub(1, std::memory_order_relaxed);
                    pending->fetch_sub(1, std::memory_order_relaxed);
                  });
    checks_->fetch_add(1, std::memory_order_relaxed);
    launched(on_second ? second_due_ : first_due_);
  }

  void renew_first() override {
    // The old stream's pending work must still complete, as it would on a GPU, but a destroyed
    // stream can no longer be named: the drain stream is made to wait for it, and completing
    // the drain stream completes that work first.
    checked(fake_->event_record(retire_, first_), "event_record");
    checked(fake_->stream_wait_event(drain_, retire_), "stream_wait_event");
    fake_->launch(drain_);
    launched(drain_due_);
    std::lock_guard lock(mutex_);  // the completer names first_ under it
    fake_->destroy_stream(first_);
    first_ = fake_->create_stream();
  }

  std::uint64_t finish() override {
    {
      std::lock_guard lock(mutex_);
      for (cudaStream_t s : {drain_, first_, second_}) fake_->complete(s);
    }
    return mismatches_->load();
  }

  std::uint64_t checks_in_flight() const override {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(checks_->load(std::memory_order_relaxed), 0));
  }

  // The completer's part: completes the streams that are due.
  void complete_due(std::int64_t now) {
    std::lock_guard lock(mutex_);
    if (first_due_.take_if_due(now)) fake_->complete(first_);
    if (second_due_.take_if_due(now)) fake_->complete(second_);
    if (drain_due_.take_if_due(now)) fake_->complete(drain_);
  }

 private:
  void launched(Due& due) { due.launched(lag_ns_(random_)); }

  // Counts a kernel about to be launched, first waiting while the lane has too many pending.
  void wait_for_room() {
    if (pending_->load(std::memory_order_relaxed) >= max_pending_kernels) {
      const auto give_up = Clock::now() + completion_timeout;
      while (pending_->load(std::memory_order_relaxed) >= max_pending_kernels) {
        if (Clock::now() > give_up) {
          throw StressError("the fake device's work did not complete for 10 s");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    pending_->fetch_add(1, std::memory_order_relaxed);
  }

  std::shared_ptr<FakeDevice> fake_;
  const BlockExtent& extent_;  // the target's
  std::mt19937_64 random_;     // the lags; used by the owning thread only
  std::mutex mutex_;    // held by renew_first's change of first_ and by whoever names it from
                        // another thread (the completer)
  cudaStream_t first_;  // written only by the owning thread, under mutex_
  cudaStream_t second_;
  cudaStream_t drain_;  // waits for the work of every first stream destroyed
  cudaEvent_t order_ = nullptr;
  cudaEvent_t retire_ = nullptr;
  std::uniform_int_distribution<std::int64_t> lag_ns_{std::int64_t{min_lag_us} * 1000,
                                                      std::int64_t{max_lag_us} * 1000};
  // A renewed first stream is new and idle: its due time carries over harmlessly (completing it
  // early completes nothing more than it holds).
  Due first_due_, second_due_, drain_due_;
  // Shared with the bodies, which may outlive the lane when the fake drops them.
  std::shared_ptr<std::atomic<std::uint64_t>> mismatches_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::shared_ptr<std::atomic<int>> pending_ = std::make_shared<std::atomic<int>>(0);  // kernels
  // Check kernels launched and not completed (may dip below zero for a moment: a check can
  // complete before its launch is counted).
  std::shared_ptr<std::atomic<std::int64_t>> checks_ = std::make_shared<std::atomic<std::int64_t>>(0);
};

class FakeStressTarget final : public StressTarget {
 public:
  FakeStressTarget(const PoolOptions& options, std::uint64_t seed) : seed_(seed), extent_(options) {
    FakeDevice::Options fake;
    fake.host_backed = true;  // the bodies write and read the memory
    fake.capacity = fake_capacity;
    fake_ = std::make_shared<FakeDevice>(fake);
  }

  ~FakeStressTarget() override { stop(); }

  std::shared_ptr<Device> device() const override { return fake_; }
  std::string description() const override { return "fake device"; }

  std::unique_ptr<StressLane> make_lane() override {
    auto lane =
        std::make_unique<FakeLane>(fake_, extent_, seed_ * 0x9E3779B97F4A7C15ull + lanes_.size());
    lanes_.push_back(lane.get());
    return lane;
  }

  void start() override {
    stopping_ = false;
    completer_ = std::thread([this] { complete_due_work(); });
  }

  void stop() override {
    if (completer_.joinable()) {
      stopping_ = true;
      completer_.join();
    }
    lanes_.clear();
    fake_->complete_all();
  }

  std::vector<std::string> hazards() const override {
    std::vector<std::string> out;
    for (const FakeDevice::Hazard& h : fake_->hazards()) {
      const char* kind = h.kind == FakeDevice::Hazard::Kind::race ? "race"
                         : h.kind == FakeDevice::Hazard::Kind::out_of_bounds
                             ? "out of bounds"
                             : "call in a destructor";
      out.push_back(fmt::format("{}: {}", kind, h.what));
    }
    if (!completer_error_.empty()) out.push_back("the completer stopped: " + completer_error_);
    return out;
  }

 private:
  // Polls the lanes' due times. The sleep is short; Linux makes it some tens of microseconds
  // (timer slack), which adds to the lags.
  void complete_due_work() {
    try {
      while (!stopping_.load(std::memory_order_relaxed)) {
        std::this_thread::sleep_for(std::chrono::microseconds(10));
        const std::int64_t now = now_ns();
        for (FakeLane* lane : lanes_) lane->complete_due(now);
      }
    } catch (const std::exception& e) {
      // A control naming a stream the fake does not know: a bug of the bench, reported as a
      // hazard rather than ending the process.
      completer_error_ = e.what();
    }
  }

  std::uint64_t seed_;
  BlockExtent extent_;
  std::shared_ptr<FakeDevice> fake_;
  std::vector<FakeLane*> lanes_;  // changed only while the completer is not running
  std::thread completer_;
  std::atomic<bool> stopping_{false};
  std::string completer_error_;  // written by the completer, read after it is joined
};

}  // namespace

std::unique_ptr<StressTarget> make_fake_stress_target(const PoolOptions& options,
                                                      std::uint64_t seed) {
  return std::make_unique<FakeStressTarget>(options, seed);
}

}  // namespace streampool::bench
