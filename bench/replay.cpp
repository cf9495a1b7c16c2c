#include "replay.hpp"

#include "reserved_watch.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>
#include <streampool/size_classes.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace streampool::bench {

Target fake_target() {
  FakeDevice::Options options;
  options.auto_complete = true;  // no kernels run in a replay: nothing stays pending
  options.capacity = std::size_t{141} << 30;  // an H200's worth
  auto fake = std::make_shared<FakeDevice>(options);
  Target target;
  target.device = fake;
  target.create_stream = [fake] { return fake->create_stream(); };
  target.destroy_stream = [fake](cudaStream_t s) { fake->destroy_stream(s); };
  target.description = "fake device";
  return target;
}

Target gpu_target() {
  auto cuda = std::make_shared<CudaDevice>(0);
  Target target;
  target.device = cuda;
  target.create_stream = [] {
    cudaStream_t s = nullptr;
    throw_on_cuda_error(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  };
  target.destroy_stream = [](cudaStream_t s) { cudaStreamDestroy(s); };
  cudaDeviceProp props{};
  cudaGetDeviceProperties(&props, 0);
  target.description = props.name;
  target.real = true;
  return target;
}

Target default_target() { return CudaDevice::count() > 0 ? gpu_target() : fake_target(); }

namespace {

// Block bytes a request occupies under `options`: its class's block, or the rounded large size.
std::uint64_t block_bytes(const SizeClasses& classes, const PoolOptions& options,
                          std::uint64_t bytes) {
  if (!classes.is_large(bytes)) return classes.block_size(classes.class_of(bytes));
  const std::uint64_t r = options.large_rounding;
  return (bytes + r - 1) / r * r;
}

}  // namespace

namespace {

void lower(std::atomic<std::int64_t>& low, std::int64_t value) {
  std::int64_t seen = low.load(std::memory_order_relaxed);
  while (value < seen && !low.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
void raise(std::atomic<std::int64_t>& high, std::int64_t value) {
  std::int64_t seen = high.load(std::memory_order_relaxed);
  while (value > seen && !high.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// The timeline's stretches, written by every replaying thread after each of its events.
class Timeline {
 public:
  Timeline(std::size_t points, std::size_t events)
      : buckets_(std::min(points, events)), events_(events), cells_(buckets_ * 4) {
    for (std::size_t b = 0; b < buckets_; ++b) {
      for (int k = 0; k < 2; ++k) {
        cells_[b * 4 + 2 * k].store(std::numeric_limits<std::int64_t>::max());
        cells_[b * 4 + 2 * k + 1].store(std::numeric_limits<std::int64_t>::min());
      }
    }
  }
  bool on() const { return buckets_ != 0; }
  void note(std::uint64_t event, std::int64_t requested, std::int64_t reserved) {
    const std::size_t b = bucket(event);
    lower(cells_[b * 4], requested);
    raise(cells_[b * 4 + 1], requested);
    lower(cells_[b * 4 + 2], reserved);
    raise(cells_[b * 4 + 3], reserved);
  }
  std::vector<TimelinePoint> points() const {
    std::vector<TimelinePoint> out;
    const auto value = [&](std::size_t i) {
      return static_cast<std::uint64_t>(std::max<std::int64_t>(0, cells_[i].load()));
    };
    for (std::size_t b = 0; b < buckets_; ++b) {
      if (cells_[b * 4].load() > cells_[b * 4 + 1].load()) continue;  // no event landed here
      out.push_back({(b * events_ + buckets_ - 1) / buckets_, value(b * 4), value(b * 4 + 1),
                     value(b * 4 + 2), value(b * 4 + 3)});
    }
    return out;
  }

 private:
  std::size_t bucket(std::uint64_t event) const { return event * buckets_ / events_; }
  std::size_t buckets_;
  std::size_t events_;
  std::vector<std::atomic<std::int64_t>> cells_;  // per stretch: requested min, max; reserved
};

}  // namespace

ReplayReport replay(const Trace& trace, const Target& target, const ReplayOptions& options) {
  PoolOptions pool_options = options.pool;
  pool_options.read_environment = false;  // the bench applies STREAMPOOL_CONF once (settings.hpp)
  pool_options.stats_granule = 0;
  ReplayReport report;
  report.trace = trace.name;
  report.target = target.description;
  report.config = options.pool.to_conf();
  report.raw = options.raw;
  report.events = trace.events.size();
  report.allocations = trace.allocations;
  report.unmatched_frees = trace.unmatched_frees;
  report.empty_allocations = trace.empty_allocations;
  report.left_live = trace.left_live;
  report.peak_requested = trace.peak_requested();

  auto* fake = dynamic_cast<FakeDevice*>(target.device.get());
  const std::uint64_t records_before = fake != nullptr ? fake->calls(FakeDevice::Call::event_record) : 0;
  const SizeClasses classes(pool_options.size_classes);
  Timeline timeline(options.timeline_points, trace.events.size());
  // The pool's device: the target's, under the call counter (--calls) and, only where a timeline
  // needs the reserved bytes after every event, the watch.
  std::shared_ptr<CallCounts> counts;
  if (options.count_calls) counts = std::make_shared<CallCounts>(target.device);
  std::shared_ptr<Device> device = counts ? std::shared_ptr<Device>(counts) : target.device;
  std::shared_ptr<ReservedWatch> watch;
  if (timeline.on()) watch = std::make_shared<ReservedWatch>(device);
  if (watch) device = watch;

  std::vector<cudaStream_t> streams;
  for (std::size_t i = 0; i < trace.streams.size(); ++i) streams.push_back(target.create_stream());
  std::string failure;
  {
    MemoryPool pool(device, pool_options);
    std::vector<PooledBuffer<std::byte>> live(trace.allocations);
    std::vector<void*> raw_live(trace.allocations, nullptr);  // options.raw
    std::vector<std::size_t> raw_bytes(trace.allocations, 0);
    std::unique_ptr<std::atomic<bool>[]> made(new std::atomic<bool>[trace.allocations]);
    for (std::uint64_t i = 0; i < trace.allocations; ++i) made[i].store(false);
    std::atomic<std::uint64_t> failed{0};
    std::atomic<bool> go{false};
    std::atomic<bool> abandon{false};
    std::mutex failure_mutex;

    // Bytes live: every allocation of the trace (its demand, failed ones included), and the
    // requested and block bytes of those the pool served, for the waste at the demand's peak.
    std::atomic<std::int64_t> requested{0};
    std::atomic<std::int64_t> served{0};
    std::atomic<std::int64_t> blocks{0};
    std::atomic<std::int64_t> peak{0};
    std::atomic<std::int64_t> waste_at_peak{0};

    const auto run = [&](std::uint32_t thread, bool reporting) {
      go.wait(false, std::memory_order_acquire);
      std::uint64_t index = 0;
      for (const TraceEvent& e : trace.events) {
        if (abandon.load(std::memory_order_relaxed)) return;
        ++index;
        if (e.thread != thread) continue;
        const auto size = static_cast<std::int64_t>(e.size);
        std::int64_t now = 0;
        if (e.kind == TraceEvent::Kind::alloc) {
          std::error_code error;
          if (options.raw) {
            raw_live[e.allocation] = pool.try_allocate(e.size, streams[e.stream], error);
            raw_bytes[e.allocation] = e.size;
          } else {
            live[e.allocation] = PooledBuffer<std::byte>::try_alloc_async(
                pool, e.size, streams[e.stream], error);
          }
          now = requested.fetch_add(size) + size;
          std::int64_t seen = peak.load();
          while (now > seen && !peak.compare_exchange_weak(seen, now)) {
          }
          if (error) {
            failed.fetch_add(1);
            // A peak of demand the pool did not serve: the waste is that of the blocks live.
            if (now > seen) waste_at_peak.store(blocks.load() - served.load());
          } else {
            const auto b = static_cast<std::int64_t>(block_bytes(classes, pool_options, e.size));
            const std::int64_t in_blocks = blocks.fetch_add(b) + b;
            const std::int64_t in_use = served.fetch_add(size) + size;
            if (now > seen) waste_at_peak.store(in_blocks - in_use);
          }
          made[e.allocation].store(true, std::memory_order_release);
        } else {
          while (!made[e.allocation].load(std::memory_order_acquire)) {
            if (abandon.load(std::memory_order_relaxed)) return;
            std::this_thread::yield();
          }
          now = requested.fetch_sub(size) - size;
          PooledBuffer<std::byte>& buffer = live[e.allocation];
          void*& raw = raw_live[e.allocation];
          if (!buffer.is_empty() || raw != nullptr) {
            served.fetch_sub(size);
            blocks.fetch_sub(static_cast<std::int64_t>(block_bytes(classes, pool_options, e.size)));
          }
          if (raw != nullptr) {
            pool.deallocate(raw, e.size, streams[e.used_on != no_stream ? e.used_on : e.stream]);
            raw = nullptr;
          } else if (!buffer.is_empty()) {
            if (e.used_on != no_stream) buffer.record_stream(streams[e.used_on]);
            buffer.reset();
          }
        }
        if (timeline.on()) timeline.note(index - 1, now, watch->current());
        if (reporting && options.progress && (index & 0xfff) == 0) {
          options.progress(double(index) / double(trace.events.size()));
        }
      }
    };
    const auto guarded = [&](std::uint32_t thread, bool reporting) {
      try {
        run(thread, reporting);
      } catch (const std::exception& e) {
        std::lock_guard lock(failure_mutex);
        if (failure.empty()) failure = fmt::format("thread {} of the trace: {}", thread, e.what());
        abandon = true;
      }
    };

    const auto start = std::chrono::steady_clock::now();
    const auto count = static_cast<std::uint32_t>(std::max<std::size_t>(1, trace.threads.size()));
    std::vector<std::thread> threads;
    try {
      threads.reserve(count - 1);
      for (std::uint32_t t = 1; t < count; ++t) threads.emplace_back(guarded, t, false);
    } catch (const std::exception& e) {
      // Without every thread the trace cannot be replayed: stop the ones made, then report.
      failure = fmt::format("cannot create thread {} of the {} the trace names: {}",
                            threads.size() + 2, count, e.what());
      abandon = true;
    }
    go.store(true, std::memory_order_release);
    go.notify_all();
    if (!abandon) guarded(0, true);
    for (auto& t : threads) t.join();
    if (target.real) target.device->device_synchronize();
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.timed = target.real;
    if (options.progress && failure.empty()) options.progress(1.0);

    const PoolStats stats = pool.stats();
    report.waste_at_peak = std::uint64_t(std::max<std::int64_t>(0, waste_at_peak.load()));
    report.replayed_peak_requested = std::uint64_t(std::max<std::int64_t>(0, peak.load()));
    report.peak_reserved = std::uint64_t(stats.reserved_bytes.peak);
    report.device_allocations = stats.device_allocations;
    report.fences = stats.fences_recorded;
    report.cross_stream_reuses = stats.cross_stream_reuses;
    report.cache_hits = stats.cache_hits;
    report.cache_misses = stats.cache_misses;
    report.blocking_fallbacks = stats.blocking_fallbacks;
    report.oom_retries = stats.oom_retries;
    report.growth_waits = stats.growth_waits;
    report.failed_allocations = failed.load();
    live.clear();
    for (std::size_t i = 0; i < raw_live.size(); ++i) {
      if (raw_live[i] != nullptr) pool.deallocate(raw_live[i], raw_bytes[i], streams.front());
    }
    report.device_frees = pool.stats().device_frees;
  }
  for (cudaStream_t s : streams) target.destroy_stream(s);
  if (counts) {
    report.calls_counted = true;
    report.device_calls = counts->counts();
  }
  if (!failure.empty()) throw std::runtime_error(fmt::format("replay of {}: {}", trace.name, failure));
  report.timeline = timeline.points();
  report.events_recorded =
      fake != nullptr ? fake->calls(FakeDevice::Call::event_record) - records_before
                      : report.fences;
  return report;
}

}  // namespace streampool::bench
