#include "replay.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>
#include <streampool/size_classes.hpp>

#include <atomic>
#include <chrono>
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

ReplayReport replay(const Trace& trace, const Target& target, const ReplayOptions& options) {
  PoolOptions pool_options = options.pool;
  pool_options.read_environment = false;
  pool_options.stats_granule = 0;
  ReplayReport report;
  report.trace = trace.name;
  report.target = target.description;
  report.config = options.pool.to_conf();
  report.events = trace.events.size();
  report.allocations = trace.allocations;

  auto* fake = dynamic_cast<FakeDevice*>(target.device.get());
  const std::uint64_t records_before = fake != nullptr ? fake->calls(FakeDevice::Call::event_record) : 0;
  const SizeClasses classes(pool_options.size_classes);

  std::vector<cudaStream_t> streams;
  for (std::size_t i = 0; i < trace.streams.size(); ++i) streams.push_back(target.create_stream());
  {
    MemoryPool pool(target.device, pool_options);
    std::vector<PooledBuffer<std::byte>> live(trace.allocations);
    std::unique_ptr<std::atomic<bool>[]> made(new std::atomic<bool>[trace.allocations]);
    for (std::uint64_t i = 0; i < trace.allocations; ++i) made[i].store(false);
    std::atomic<std::uint64_t> failed{0};

    // Requested and block bytes live, for the peak and the waste at the peak (single-threaded
    // replays keep these exact; multi-threaded ones sum per-thread deltas).
    std::atomic<std::int64_t> requested{0};
    std::atomic<std::int64_t> blocks{0};
    std::atomic<std::int64_t> peak{0};
    std::atomic<std::int64_t> waste_at_peak{0};
    const std::uint64_t sample_every =
        options.timeline_points == 0 ? 0
                                     : std::max<std::uint64_t>(1, trace.events.size() /
                                                                      options.timeline_points);

    const auto run = [&](std::uint32_t thread, bool sampling) {
      std::uint64_t index = 0;
      for (const TraceEvent& e : trace.events) {
        ++index;
        if (e.thread != thread) continue;
        if (e.kind == TraceEvent::Kind::alloc) {
          std::error_code error;
          live[e.allocation] = PooledBuffer<std::byte>::try_alloc_async(
              pool, e.size, streams[e.stream], error);
          if (error) {
            failed.fetch_add(1);
          } else {
            const auto b = static_cast<std::int64_t>(block_bytes(classes, pool_options, e.size));
            const std::int64_t now = requested.fetch_add(std::int64_t(e.size)) + std::int64_t(e.size);
            const std::int64_t in_blocks = blocks.fetch_add(b) + b;
            std::int64_t seen = peak.load();
            while (now > seen && !peak.compare_exchange_weak(seen, now)) {
            }
            if (now > seen) waste_at_peak.store(in_blocks - now);
          }
          made[e.allocation].store(true, std::memory_order_release);
        } else {
          while (!made[e.allocation].load(std::memory_order_acquire)) std::this_thread::yield();
          PooledBuffer<std::byte>& buffer = live[e.allocation];
          if (!buffer.is_empty()) {
            if (e.used_on != no_stream) buffer.record_stream(streams[e.used_on]);
            requested.fetch_sub(std::int64_t(e.size));
            blocks.fetch_sub(static_cast<std::int64_t>(block_bytes(classes, pool_options, e.size)));
            buffer.reset();
          }
        }
        if (sampling && sample_every != 0 && index % sample_every == 0) {
          const PoolStats stats = pool.stats();
          report.timeline.push_back({index, std::uint64_t(requested.load()),
                                     std::uint64_t(stats.reserved_bytes.current)});
        }
        if (sampling && options.progress && (index & 0xfff) == 0) {
          options.progress(double(index) / double(trace.events.size()));
        }
      }
    };

    const auto start = std::chrono::steady_clock::now();
    if (trace.threads.size() <= 1) {
      run(0, true);
    } else {
      std::vector<std::thread> threads;
      for (std::uint32_t t = 1; t < trace.threads.size(); ++t) threads.emplace_back(run, t, false);
      run(0, true);
      for (auto& t : threads) t.join();
    }
    if (target.real) target.device->device_synchronize();
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.timed = target.real;
    if (options.progress) options.progress(1.0);

    const PoolStats stats = pool.stats();
    report.peak_requested = std::uint64_t(peak.load());
    report.waste_at_peak = std::uint64_t(waste_at_peak.load());
    report.peak_reserved = std::uint64_t(stats.reserved_bytes.peak);
    report.device_allocations = stats.device_allocations;
    report.fences = stats.fences_recorded;
    report.cross_stream_reuses = stats.cross_stream_reuses;
    report.cache_hits = stats.cache_hits;
    report.cache_misses = stats.cache_misses;
    report.blocking_fallbacks = stats.blocking_fallbacks;
    report.oom_retries = stats.oom_retries;
    report.failed_allocations = failed.load();
    live.clear();
    report.device_frees = pool.stats().device_frees;
  }
  for (cudaStream_t s : streams) target.destroy_stream(s);
  report.events_recorded =
      fake != nullptr ? fake->calls(FakeDevice::Call::event_record) - records_before
                      : report.fences;
  return report;
}

}  // namespace streampool::bench
