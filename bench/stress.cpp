#include "stress.hpp"

#include "call_counts.hpp"

#include "cli.hpp"
#include "report.hpp"
#include "settings.hpp"
#include "reserved_watch.hpp"
#include "stress_target.hpp"
#include "svg.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <latch>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

namespace streampool::bench {

const char* const stress_description =
    "Threads, two streams each, share one pool; each iteration allocates a buffer, writes a tag "
    "into it with a kernel that first spins 0-60 us, checks the tag with a second kernel (a third "
    "of the time on the second stream, ordered by an event, with record_stream) and drops the "
    "buffer while both may still run. Exits with 1 on a corrupted word, a race (fake device), a "
    "failed allocation, stats peaks above the truth plus their slack, or growth (--max-growth).";

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t hot_sizes = 8;
constexpr std::size_t kept_errors = 5;
constexpr std::uint64_t timing_period = 16;  // time every 16th allocation and drop
constexpr std::uint32_t max_spin_ns = 60'000;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::uint32_t nanoseconds_since(Clock::time_point start) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  return static_cast<std::uint32_t>(
      std::min<std::int64_t>(ns, std::numeric_limits<std::uint32_t>::max()));
}

// The defaults, then STREAMPOOL_CONF, then the configuration's --config (settings.hpp); the pool
// does not read the environment again, so --config keeps the last word.
PoolOptions pool_options_of(const std::string& conf) { return user_settings(conf).options; }

// What a configuration's workers share. The live counters are the truth the pool's stats are
// checked against: raised before an allocation and lowered after its drop, so that they are never
// below the pool's own count and their peaks never below the pool's true peaks. Every thread
// writes them on every iteration: they have a cache line of their own, away from `stop`, which
// every thread reads on every iteration.
struct Shared {
  explicit Shared(MemoryPool& p, unsigned threads) : pool(p), start(threads + 1) {}

  MemoryPool& pool;
  std::latch start;
  alignas(64) std::atomic<bool> stop{false};
  alignas(64) std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> live_peak{0};
  std::atomic<std::int64_t> requested{0};
  std::atomic<std::int64_t> requested_peak{0};
  alignas(64) std::atomic<std::uint64_t> failed_allocations{0};

  std::mutex error_mutex;
  std::uint64_t error_count = 0;
  std::vector<std::string> errors;

  static void raise(std::atomic<std::int64_t>& peak, std::int64_t value) {
    std::int64_t seen = peak.load(std::memory_order_relaxed);
    while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
  }
  void count_allocation(std::int64_t bytes) {
    raise(live_peak, live.fetch_add(1, std::memory_order_relaxed) + 1);
    raise(requested_peak, requested.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  }
  void count_drop(std::int64_t bytes) {
    live.fetch_sub(1, std::memory_order_relaxed);
    requested.fetch_sub(bytes, std::memory_order_relaxed);
  }
  // Any failure ends the configuration's run: after a failed allocation or device call the
  // figures no longer describe the workload.
  void fail(std::string what) {
    {
      std::lock_guard lock(error_mutex);
      ++error_count;
      if (errors.size() < kept_errors) errors.push_back(std::move(what));
    }
    stop = true;
  }
};

// One worker's figures, apart from the others' (no shared cache line on the loop's path).
struct alignas(64) WorkerState {
  std::atomic<std::uint64_t> buffers{0};
  std::vector<std::uint32_t> allocate_ns;
  std::vector<std::uint32_t> drop_ns;
  std::vector<std::uint32_t> launch_ns;  // the lane's calls of an iteration, record_stream's too
  std::vector<std::uint32_t> in_flight;  // the lane's checks not yet complete
};

// The sizes every worker draws from: the hot set is the same for all of them.
struct Workload {
  std::vector<std::size_t> hot_words;  // 4-32 KiB
  unsigned threads = 0;
  std::uint64_t churn = 0;
  std::uint64_t seed = 0;
  bool release_before_renew = false;  // StreamChecks::none: the contract asks for release_stream
  std::uint64_t max_in_flight = 0;    // StressOptions::max_in_flight
  bool mark_drops = false;            // StressOptions::mark_drops
  std::uint64_t host_work_ns = 0;     // StressOptions::host_work_ns

  static Workload make(const StressOptions& options, unsigned threads, const PoolOptions& pool) {
    Workload w;
    std::mt19937_64 random(options.seed);
    std::uniform_int_distribution<std::size_t> hot(1024, 8192);  // words
    for (std::size_t i = 0; i < hot_sizes; ++i) w.hot_words.push_back(hot(random));
    w.threads = threads;
    w.churn = options.churn;
    w.seed = options.seed;
    w.release_before_renew = pool.stream_checks == StreamChecks::none;
    w.max_in_flight = options.max_in_flight;
    w.mark_drops = options.mark_drops;
    w.host_work_ns = options.host_work_ns;
    return w;
  }

  std::size_t words(std::mt19937_64& random) const {
    if (random() % 2 == 0) return hot_words[random() % hot_words.size()];
    // 1 KiB to just under 8 MiB, an odd number of words: sizes no class or rounding fits exactly.
    constexpr std::size_t least = 256, most = (std::size_t{8} << 20) / sizeof(unsigned) - 1;
    return (least + random() % (most - least)) | 1;
  }

  // Unique per iteration of any thread (until 2^32 iterations in all): an odd multiplier is a
  // bijection modulo 2^32, and scatters the tags of neighbouring iterations.
  std::uint32_t tag(std::uint64_t iteration, unsigned thread) const {
    const auto n = static_cast<std::uint32_t>(iteration * threads + thread + 1);
    return n * 0x9E3779B1u;
  }
};

void run_worker(Shared& shared, StressLane& lane, WorkerState& me, const Workload& workload,
                unsigned index) {
  shared.start.arrive_and_wait();
  try {
    lane.enter_thread();
    std::mt19937_64 random(workload.seed * 0x100000001B3ull + index + 1);
    std::uniform_int_distribution<std::uint32_t> spin(0, max_spin_ns);
    for (std::uint64_t i = 0; !shared.stop.load(std::memory_order_relaxed); ++i) {
      if (workload.max_in_flight != 0) {
        // Not timed: the wait is the application's pacing, not the pool's.
        while (lane.checks_in_flight() > workload.max_in_flight &&
               !shared.stop.load(std::memory_order_relaxed)) {
          std::this_thread::yield();
        }
      }
      const std::size_t words = workload.words(random);
      const auto bytes = static_cast<std::int64_t>(words * sizeof(unsigned));
      const std::uint32_t tag = workload.tag(i, index);
      const bool on_second = random() % 3 == 0;
      const bool timed = i % timing_period == 0;
      const cudaStream_t first = lane.first();

      shared.count_allocation(bytes);
      std::error_code error;
      auto started = Clock::now();
      auto buffer = PooledBuffer<unsigned>::try_alloc_async(shared.pool, words, first, error);
      if (timed) me.allocate_ns.push_back(nanoseconds_since(started));
      if (error || buffer.is_empty()) {
        shared.count_drop(bytes);
        shared.failed_allocations.fetch_add(1, std::memory_order_relaxed);
        shared.fail(fmt::format("thread {}: allocation of {} bytes failed: {}", index, bytes,
                                error ? error.message() : "an empty buffer and no error"));
        return;
      }
      if (timed) started = Clock::now();
      lane.write_tag(buffer.data(), words, tag, spin(random));
      lane.check_tag(buffer.data(), words, tag, on_second);
      if (on_second) buffer.record_stream(lane.second());
      if (timed) {
        me.launch_ns.push_back(nanoseconds_since(started));
        me.in_flight.push_back(static_cast<std::uint32_t>(
            std::min<std::uint64_t>(lane.checks_in_flight(), std::numeric_limits<std::uint32_t>::max())));
      }
      started = Clock::now();
      buffer.reset();  // both kernels may still run
      if (timed) me.drop_ns.push_back(nanoseconds_since(started));
      if (workload.mark_drops) lane.mark_first();
      shared.count_drop(bytes);
      if (workload.host_work_ns != 0) {
        // The application's own work, after the buffer is gone: in none of the latencies, but in
        // the run's seconds. A busy loop, as CPU work is, not a sleep.
        const auto until = Clock::now() + std::chrono::nanoseconds(workload.host_work_ns);
        while (Clock::now() < until) {
        }
      }
      me.buffers.store(i + 1, std::memory_order_relaxed);

      if (workload.churn != 0 && (i + 1) % workload.churn == 0) {
        // Every buffer used on the first stream is dropped, as the contract asks.
        if (workload.release_before_renew) shared.pool.release_stream(first);
        lane.renew_first();
      }
    }
  } catch (const std::exception& e) {
    shared.fail(fmt::format("thread {}: {}", index, e.what()));
  }
}

std::unique_ptr<StressTarget> make_target(bool fake, const PoolOptions& options,
                                          std::uint64_t seed) {
  return fake ? make_fake_stress_target(options, seed) : make_gpu_stress_target();
}

std::string label_of(const std::string& conf) { return conf.empty() ? "default" : conf; }

// Stops the target's completer on every way out of a run, so that it never outlives the lanes.
struct Started {
  StressTarget& target;
  bool stopped = false;
  void stop() {
    stopped = true;
    target.stop();
  }
  ~Started() {
    if (stopped) return;
    try {
      target.stop();
    } catch (const std::exception&) {
      // Already failing: the first error is the one reported.
    }
  }
};

StressResult run_one(const StressOptions& options, const std::string& conf, bool fake,
                     unsigned threads, std::ostream& log) {
  const PoolOptions pool_options = pool_options_of(conf);
  const Workload workload = Workload::make(options, threads, pool_options);
  StressResult result;
  result.label = label_of(conf);
  result.config = pool_options.to_conf();
  result.threads = threads;
  result.churn = options.churn;
  result.max_in_flight = options.max_in_flight;
  result.mark_drops = options.mark_drops;
  result.host_work_ns = options.host_work_ns;
  result.streams_alive = std::int64_t{2} * threads;
  result.stats_granule = pool_options.stats_granule;
  result.window_seconds = window_seconds(options.seconds);

  std::unique_ptr<StressTarget> target = make_target(fake, pool_options, options.seed);
  result.target = target->description();
  log << fmt::format("stress [{}] on {}: {} thread{}, {}, {} s\n  STREAMPOOL_CONF={}\n",
                     result.label, result.target, threads, threads == 1 ? "" : "s",
                     options.churn ? fmt::format("churn every {} buffers", options.churn)
                                   : std::string("no churn"),
                     options.seconds, result.config)
      << std::flush;

  auto counts = std::make_shared<CallCounts>(target->device());
  auto watch = std::make_shared<ReservedWatch>(counts);
  std::vector<std::unique_ptr<StressLane>> lanes;
  for (unsigned t = 0; t < threads; ++t) lanes.push_back(target->make_lane());
  auto pool = std::make_unique<MemoryPool>(watch, pool_options);
  const LockContention contention_before = lock_contention();
  Shared shared(*pool, threads);
  std::vector<WorkerState> workers(threads);
  Started started{*target};
  target->start();

  std::vector<std::thread> running;
  try {
    running.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
      running.emplace_back(run_worker, std::ref(shared), std::ref(*lanes[t]), std::ref(workers[t]),
                           std::cref(workload), t);
    }
  } catch (const std::exception& e) {
    // The run stops before it starts; the workers made see `stop` once the latch opens.
    shared.fail(fmt::format("cannot create worker thread {} of {}: {}", running.size() + 1,
                            threads, e.what()));
    shared.start.count_down(static_cast<std::ptrdiff_t>(threads - running.size()));
  }
  const auto buffers_now = [&] {
    std::uint64_t n = 0;
    for (const WorkerState& w : workers) n += w.buffers.load(std::memory_order_relaxed);
    return n;
  };
  std::uint64_t last_buffers = 0;
  double last_seconds = 0;
  const auto bytes_of = [](std::int64_t bytes) {
    return human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(0, bytes)));
  };
  const auto sample = [&](double now) {
    const PoolStats stats = pool->stats();
    const PoolBreakdown parts = pool->breakdown();
    const std::uint64_t buffers = buffers_now();
    StressSample s;
    s.seconds = now;
    s.buffers_per_second =
        now > last_seconds ? double(buffers - last_buffers) / (now - last_seconds) : 0;
    s.reserved_bytes = stats.reserved_bytes.current;
    s.device_allocations = stats.device_allocations;
    s.fences = stats.fences_recorded;
    s.parked_bytes = parts.parked_bytes;
    s.free_owned_bytes = parts.free_owned_bytes;
    s.free_clean_bytes = parts.free_clean_bytes;
    s.slab_bytes = parts.slab_bytes;
    s.shelved_bytes = parts.shelved_bytes;
    result.samples.push_back(s);
    last_buffers = buffers;
    last_seconds = now;
    log << fmt::format(
               "  [{}] {:7.1f} s {:>10.0f} buffers/s  reserved {:>10}  device allocations "
               "{:>6}  fences {:>9}  parked {:>10}  free owned {:>10}  free clean {:>10}\n",
               result.label, s.seconds, s.buffers_per_second, bytes_of(s.reserved_bytes),
               s.device_allocations, s.fences, bytes_of(s.parked_bytes),
               bytes_of(s.free_owned_bytes), bytes_of(s.free_clean_bytes))
        << std::flush;
  };

  // The main thread watches: progress lines, and the two windows' peaks.
  shared.start.arrive_and_wait();
  const Clock::time_point begin = Clock::now();
  const double window = result.window_seconds;
  bool first_window_taken = false;
  bool last_window_begun = false;
  double next_sample = options.interval;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const double now = seconds_since(begin);
    if (!first_window_taken && now >= window) {
      result.first_window_peak = watch->take_peak();
      first_window_taken = true;
    }
    if (first_window_taken && !last_window_begun && now >= options.seconds - window) {
      watch->take_peak();
      last_window_begun = true;
    }
    if (now >= options.seconds || shared.stop.load()) break;
    if (now >= next_sample) {
      sample(now);
      next_sample += options.interval;
    }
  }
  shared.stop = true;
  for (std::thread& t : running) t.join();
  result.seconds = seconds_since(begin);
  result.last_window_peak = watch->take_peak();
  if (!first_window_taken) result.first_window_peak = result.last_window_peak;  // ended early
  if (result.seconds - last_seconds > 0.05 * options.interval) sample(result.seconds);

  try {
    started.stop();  // all work complete from here on
    for (auto& lane : lanes) result.corrupted_words += lane->finish();
  } catch (const std::exception& e) {
    shared.fail(fmt::format("after the run: {}", e.what()));
  }
  result.stats = pool->stats();
  pool.reset();
  {
    const LockContention now = lock_contention();
    const auto since = [](LockWaits after, LockWaits before) {
      return LockWaits{after.waits - before.waits, after.ns - before.ns};
    };
    const LockContention& b = contention_before;
    result.contention = {since(now.stream, b.stream), since(now.revocation, b.revocation),
                         since(now.arena, b.arena), since(now.growth, b.growth),
                         since(now.events, b.events)};
  }
  result.device_calls = counts->counts();
  result.buffers = buffers_now();
  result.failed_allocations = shared.failed_allocations.load();
  result.error_count = shared.error_count;
  result.errors = shared.errors;
  if (watch->lost()) {
    result.errors.push_back(
        "(the window peaks may read high: the bench lost track of a device "
        "allocation's size)");
  }
  const std::vector<std::string> hazards = target->hazards();
  result.hazard_count = hazards.size();
  for (std::size_t i = 0; i < hazards.size() && i < kept_errors; ++i) {
    result.hazards.push_back(hazards[i]);
  }
  result.true_live_peak = shared.live_peak.load();
  result.true_requested_peak = shared.requested_peak.load();

  std::vector<std::uint32_t> allocate_ns, drop_ns, launch_ns, in_flight;
  for (WorkerState& w : workers) {
    allocate_ns.insert(allocate_ns.end(), w.allocate_ns.begin(), w.allocate_ns.end());
    drop_ns.insert(drop_ns.end(), w.drop_ns.begin(), w.drop_ns.end());
    launch_ns.insert(launch_ns.end(), w.launch_ns.begin(), w.launch_ns.end());
    in_flight.insert(in_flight.end(), w.in_flight.begin(), w.in_flight.end());
  }
  result.allocate = summarize_latency(std::move(allocate_ns));
  result.drop = summarize_latency(std::move(drop_ns));
  result.launch = summarize_latency(std::move(launch_ns));
  result.in_flight = summarize_latency(std::move(in_flight));
  return result;
}

std::string bytes_text(std::int64_t bytes) {
  return human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(0, bytes)));
}

}  // namespace

void add_stress_options(CLI::App& app, StressOptions& o) {
  constexpr std::uint64_t any = std::numeric_limits<std::uint64_t>::max();
  app.add_option("--seconds", o.seconds, "seconds per configuration")
      ->check(positive_number())->capture_default_str();
  app.add_option("--threads", o.threads,
                 "worker threads (default 12 on the GPU, 4 on the fake device, where 12 threads "
                 "on two cores starve the completer that plays the GPU)")
      ->check(whole_number(1, 1024));
  app.add_option("--churn", o.churn,
                 "every N buffers a thread destroys its first stream and creates a new one")
      ->check(whole_number(0, any));
  app.add_option("--config", o.configs,
                 "pool options as STREAMPOOL_CONF, on top of the environment's; repeat to compare "
                 "configurations in one run, each for S seconds with a fresh pool (\"\": the "
                 "environment's settings or the defaults)")
      ->take_all();
  app.add_flag("--fake", o.fake, "the fake device even where there is a GPU (the default without one)");
  app.add_option("--out", o.out, "write stress.csv (the progress samples) and stress-reserved.svg there");
  app.add_option("--interval", o.interval, "seconds between progress lines")
      ->check(positive_number())->capture_default_str();
  app.add_option("--max-growth", o.max_growth,
                 "fail when the last window's peak reserved is above X times the first's (windows: "
                 "60 s for runs of 5 minutes or more, else a fifth of the run), or when the pool "
                 "ran the device out of memory")
      ->check(positive_number());
  app.add_option("--seed", o.seed, "seed of the sizes, spins and tags")
      ->check(whole_number(0, any))->capture_default_str();
  app.add_option("--max-in-flight", o.max_in_flight,
                 "before each allocation a thread waits while more than N of its checks have not "
                 "completed (0: never; the thread runs as far ahead of the GPU as its launch queue "
                 "lets it, and memory waiting for fences grows with that backlog)")
      ->check(whole_number(0, any))->capture_default_str();
  app.add_flag("--mark-drops", o.mark_drops,
               "after each drop the thread records an event of its own on the first stream (GPU "
               "only): the events fence_every_free adds to the GPU's queues, without its fences");
  app.add_option("--host-work-ns", o.host_work_ns,
                 "after each drop a thread busies itself for N ns without calling CUDA (in no "
                 "latency, but in the run's time), as an application works between allocations "
                 "(0: none; at most 1 s)")
      ->check(whole_number(0, 1'000'000'000))->capture_default_str();
}

void check_stress_options(StressOptions& o) {
  if (o.configs.empty()) o.configs = {""};
  for (const std::string& conf : o.configs) {
    try {
      (void)pool_options_of(conf);
    } catch (const SettingsError& e) {
      std::string why = e.what();
      if (const std::string own = "--config: "; why.starts_with(own)) why.erase(0, own.size());
      throw StressUsageError(fmt::format("--config '{}': {}", conf, why));
    }
  }
}

StressOptions parse_stress_options(const std::vector<std::string>& args) {
  StressOptions o;
  o.configs.clear();
  CLI::App app{"", "stress"};
  add_stress_options(app, o);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    o.help = true;
    return o;
  } catch (const CLI::ParseError& e) {
    throw StressUsageError(e.what());
  }
  check_stress_options(o);
  return o;
}

Latency summarize_latency(std::vector<std::uint32_t> ns) {
  Latency l;
  l.samples = ns.size();
  if (ns.empty()) return l;
  double sum = 0;
  for (std::uint32_t v : ns) sum += v;
  l.mean_ns = sum / double(ns.size());
  const std::size_t rank = (ns.size() - 1) * 99 / 100;
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(rank), ns.end());
  l.p99_ns = ns[rank];
  return l;
}

double StressResult::growth() const { return growth_ratio(first_window_peak, last_window_peak); }

StatsSlack stats_slack(std::size_t stats_granule, std::int64_t streams) {
  const auto granule = static_cast<std::int64_t>(stats_granule);
  if (granule == 0) return {};
  return {streams * 2 * granule, streams * 2 * std::max<std::int64_t>(1, granule >> 14)};
}

double growth_ratio(std::int64_t first_window_peak, std::int64_t last_window_peak) {
  if (first_window_peak <= 0) {
    return last_window_peak <= 0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
  return double(last_window_peak) / double(first_window_peak);
}

double window_seconds(double run_seconds) { return run_seconds >= 300 ? 60 : run_seconds / 5; }

std::vector<std::string> stress_failures(const StressResult& r, double max_growth) {
  std::vector<std::string> failures;
  const auto fail = [&](std::string what) {
    failures.push_back(fmt::format("[{}] {}", r.label, what));
  };
  if (r.corrupted_words > 0) {
    fail(
        fmt::format("{} corrupted words: a check kernel found another iteration's tag, so a block "
                    "was handed out while work of its previous owner was pending",
                    r.corrupted_words));
  }
  if (r.hazard_count > 0) {
    fail(fmt::format("{} hazards on the fake device; the first: {}", r.hazard_count,
                     r.hazards.empty() ? std::string("?") : r.hazards.front()));
  }
  if (r.failed_allocations > 0) {
    fail(fmt::format("{} failed allocations", r.failed_allocations));
  }
  if (r.error_count > 0) {
    fail(fmt::format("{} errors ended the run; the first: {}", r.error_count,
                     r.errors.empty() ? std::string("?") : r.errors.front()));
  }
  if (max_growth > 0 && r.growth() > max_growth) {
    fail(
        fmt::format("reserved memory grew {:.2f}x: peak {} in the last {:.0f} s against {} in the "
                    "first, above --max-growth {}",
                    r.growth(), bytes_text(r.last_window_peak), r.window_seconds,
                    bytes_text(r.first_window_peak), max_growth));
  }
  if (max_growth > 0 && r.stats.oom_retries > 0) {
    // The device's capacity caps both windows' peaks: a pool that fills it within the first
    // window shows no growth, however unbounded its appetite.
    fail(
        fmt::format("the pool ran out of device memory ({} out-of-memory retries, peak reserved "
                    "{}) with at most {} requested at once: memory is not bounded",
                    r.stats.oom_retries, bytes_text(r.stats.reserved_bytes.peak),
                    bytes_text(r.true_requested_peak)));
  }
  const StatsSlack slack = stats_slack(r.stats_granule, r.streams_alive);
  if (r.stats.live_allocations.peak > r.true_live_peak + slack.allocations) {
    fail(
        fmt::format("stats: live_allocations.peak {} is above the true peak {} plus the slack {} "
                    "({} streams alive, stats_granule {})",
                    r.stats.live_allocations.peak, r.true_live_peak, slack.allocations,
                    r.streams_alive, r.stats_granule));
  }
  if (r.stats.requested_bytes.peak > r.true_requested_peak + slack.bytes) {
    fail(
        fmt::format("stats: requested_bytes.peak {} is above the true peak {} plus the slack {} "
                    "({} streams alive, stats_granule {})",
                    r.stats.requested_bytes.peak, r.true_requested_peak, slack.bytes,
                    r.streams_alive, r.stats_granule));
  }
  return failures;
}

std::vector<StressResult> run_stress(const StressOptions& options, std::ostream& log) {
  const bool fake = options.fake || CudaDevice::count() == 0;
  if (!fake && !gpu_stress_built()) make_gpu_stress_target();  // throws, saying why
  const unsigned threads = options.threads != 0 ? options.threads
                           : fake               ? fake_default_threads
                                                : gpu_default_threads;
  if (fake && !options.fake) log << "no GPU: running on the fake device\n";
  std::vector<StressResult> results;
  for (const std::string& conf : options.configs) {
    try {
      results.push_back(run_one(options, conf, fake, threads, log));
    } catch (const std::exception& e) {
      // The run could not be set up (streams, events, the pool): a result that fails its checks,
      // and the next configuration still runs.
      StressResult failed;
      failed.label = label_of(conf);
      failed.config = pool_options_of(conf).to_conf();
      failed.threads = threads;
      failed.churn = options.churn;
      failed.error_count = 1;
      failed.errors.push_back(fmt::format("setting up the run: {}", e.what()));
      results.push_back(std::move(failed));
    }
  }
  return results;
}

Table stress_table(const StressResult& r) {
  Table t;
  t.title = fmt::format(
      "stress [{}]: {}, {} thread{}, {}{}{}{}, {:.1f} s", r.label, r.target, r.threads,
      r.threads == 1 ? "" : "s",
      r.churn ? fmt::format("churn every {} buffers", r.churn) : std::string("no churn"),
      r.max_in_flight ? fmt::format(", at most {} checks in flight", r.max_in_flight)
                      : std::string(),
      r.mark_drops ? ", an event recorded after every drop (on a GPU)" : "",
      r.host_work_ns ? fmt::format(", {} ns of host work after every drop", r.host_work_ns)
                     : std::string(),
      r.seconds);
  t.note = "STREAMPOOL_CONF=" + r.config;
  t.header = {"figure", "value"};
  const auto row = [&t](std::string name, std::string value) {
    t.rows.push_back({std::move(name), std::move(value)});
  };
  const auto latency = [](const Latency& l) {
    return l.samples == 0
               ? std::string("n/a")
               : fmt::format("{:.0f} / {:.0f} ({} samples)", l.mean_ns, l.p99_ns, l.samples);
  };
  row("buffers", fmt::format("{}", r.buffers));
  row("buffers / s", fmt::format("{:.0f}", r.buffers_per_second()));
  row("fences / buffer", fmt::format("{:.3f}", r.fences_per_buffer()));
  row("device allocations", fmt::format("{}", r.stats.device_allocations));
  row("peak reserved", bytes_text(r.stats.reserved_bytes.peak));
  row(fmt::format("peak reserved, first {:.0f} s", r.window_seconds),
      bytes_text(r.first_window_peak));
  row(fmt::format("peak reserved, last {:.0f} s", r.window_seconds),
      bytes_text(r.last_window_peak));
  row("growth (last / first)", fmt::format("{:.3f}", r.growth()));
  row("allocate ns, mean / p99", latency(r.allocate));
  row("drop ns, mean / p99", latency(r.drop));
  row("launches ns, mean / p99", latency(r.launch));
  row("buffers in flight per thread, mean / p99",
      r.in_flight.samples == 0 ? std::string("n/a")
                               : fmt::format("{:.1f} / {:.0f}", r.in_flight.mean_ns,
                                             r.in_flight.p99_ns));
  row("cache misses / buffer", fmt::format("{:.3f}", r.buffers ? double(r.stats.cache_misses) /
                                                                      double(r.buffers)
                                                                : 0.0));
  row("cross-stream reuses", fmt::format("{}", r.stats.cross_stream_reuses));
  row("blocking fallbacks", fmt::format("{}", r.stats.blocking_fallbacks));
  row("out-of-memory retries", fmt::format("{}", r.stats.oom_retries));
  row("growth waits", fmt::format("{}", r.stats.growth_waits));
  row(r.target == "fake device" ? "corrupted words (3 checked per buffer)" : "corrupted words",
      fmt::format("{}", r.corrupted_words));
  row("live allocations peak: stats / true",
      fmt::format("{} / {}", r.stats.live_allocations.peak, r.true_live_peak));
  row("requested bytes peak: stats / true",
      fmt::format("{} / {}", bytes_text(r.stats.requested_bytes.peak),
                  bytes_text(r.true_requested_peak)));
  if (r.target == "fake device") row("hazards", fmt::format("{}", r.hazard_count));
  row("failed allocations", fmt::format("{}", r.failed_allocations));
  // How often a thread waited for one of the pool's locks, per buffer, and for how long a wait.
  const auto waits = [&](const char* lock, LockWaits w) {
    row(fmt::format("{} waits per buffer (mean ns a wait)", lock),
        fmt::format("{:.3f} ({:.0f})", r.buffers ? double(w.waits) / double(r.buffers) : 0.0,
                    w.waits ? double(w.ns) / double(w.waits) : 0.0));
  };
  waits("stream lock", r.contention.stream);
  waits("stream lock revocation", r.contention.revocation);
  waits("arena lock", r.contention.arena);
  waits("growth lock", r.contention.growth);
  waits("event pool lock", r.contention.events);
  // What the pool asked of the device per buffer, and the mean CPU time of each call.
  for (const DeviceCallCount& c : r.device_calls) {
    row(fmt::format("{} calls per buffer (mean ns a call)", c.call),
        fmt::format("{:.3f} ({:.0f})", r.buffers ? double(c.calls) / double(r.buffers) : 0.0,
                    c.calls ? double(c.ns) / double(c.calls) : 0.0));
  }
  return t;
}

Table stress_samples_table(const std::vector<StressResult>& results) {
  Table t;
  t.title = "stress: progress samples";
  t.header = {"config",  "seconds",          "buffers_per_second", "reserved_bytes",
              "device_allocations", "fences", "parked_bytes", "free_owned_bytes",
              "free_clean_bytes", "slab_bytes", "shelved_bytes"};
  for (const StressResult& r : results) {
    for (const StressSample& s : r.samples) {
      t.rows.push_back({r.label, fmt::format("{:.3f}", s.seconds),
                        fmt::format("{:.0f}", s.buffers_per_second),
                        fmt::format("{}", s.reserved_bytes),
                        fmt::format("{}", s.device_allocations), fmt::format("{}", s.fences),
                        fmt::format("{}", s.parked_bytes), fmt::format("{}", s.free_owned_bytes),
                        fmt::format("{}", s.free_clean_bytes), fmt::format("{}", s.slab_bytes),
                        fmt::format("{}", s.shelved_bytes)});
    }
  }
  return t;
}

std::string stress_plot(const std::vector<StressResult>& results) {
  static const char* const colours[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e",
                                        "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  std::vector<Series> series;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const StressResult& r = results[i];
    Series s{r.label, colours[i % std::size(colours)], {0.0}, {0.0}};  // a fresh pool holds nothing
    for (const StressSample& sample : r.samples) {
      s.x.push_back(sample.seconds);
      s.y.push_back(double(sample.reserved_bytes));
    }
    series.push_back(std::move(s));
  }
  const std::string churn = !results.empty() && results.front().churn
                                ? fmt::format(", churn every {} buffers", results.front().churn)
                                : std::string();
  PlotOptions plot;
  plot.title = "Reserved memory under stress" + churn;
  plot.x_label = "seconds";
  plot.y_label = "reserved bytes";
  plot.x_unit = Unit::ratio;
  plot.y_unit = Unit::bytes;
  return svg_plot(series, plot);
}

int stress_command(const StressOptions& options, std::ostream& out, std::ostream& err) {
  std::vector<StressResult> results;
  try {
    results = run_stress(options, out);
  } catch (const std::exception& e) {
    err << "streampool-bench: stress: " << e.what() << "\n";
    return 1;
  }
  out << "\n";
  for (const StressResult& r : results) out << stress_table(r).markdown() << "\n";

  if (!options.out.empty()) {
    try {
      const std::filesystem::path dir(options.out);
      write_file(dir / "stress.csv", stress_samples_table(results).csv());
      write_file(dir / "stress-reserved.svg", stress_plot(results));
      out << "wrote " << (dir / "stress.csv").string() << " and "
                << (dir / "stress-reserved.svg").string() << "\n\n";
    } catch (const std::exception& e) {
      err << "streampool-bench: stress: writing " << options.out << ": " << e.what() << "\n";
      return 1;
    }
  }

  std::vector<std::string> failures;
  for (const StressResult& r : results) {
    for (std::string& f : stress_failures(r, options.max_growth)) failures.push_back(std::move(f));
  }
  if (failures.empty()) {
    out << "checks: all passed\n";
    return 0;
  }
  out << "checks: " << failures.size() << " failed\n";
  for (const std::string& f : failures) out << "  FAILED " << f << "\n";
  out << std::flush;
  err << "streampool-bench: stress: " << failures.size() << " check"
            << (failures.size() == 1 ? "" : "s") << " failed\n";
  return 1;
}

}  // namespace streampool::bench
