// What the trace recorder costs: same-stream allocate + drop pairs of a PooledBuffer on the fake
// device, with the recorder off and on, on 1..T threads (each on a stream of its own), repeated
// with the modes interleaved so that a busy machine disturbs both alike. Prints the median and
// the fastest repeat in nanoseconds per pair.
//
//   streampool_trace_cost [pairs=N] [repeats=R] [threads=T] [size=BYTES|random] [checks=none|full]
//                         [modes=both|off] [device=fake|quiet] [streams=own|one]
//                         [stats_every=MICROSECONDS]
//
// size=random gives each pair a size of its own, 256 KiB to 8 MiB (a sequence of each thread's,
// the same in every run): the large tier's ranges, which its shelf (exact sizes) rarely serves,
// so that pairs go through the arena and its lock, as half of the stress's buffers do.
//
// device=quiet wraps the fake device in one that wants no notifications, as a real device does:
// the fake's bookkeeping of every block (its race detector) is then left out and the figures are
// the pool's own. streams=one puts every thread on one stream: the stream's lock then goes from
// thread to thread (lib/pool/biased_lock.hpp, the worst case for its bias). stats_every=U has one
// more thread call MemoryPool::stats() every U microseconds while the pairs run, and prints what
// a call took: stats() locks every stream's state in turn, each biased to its worker.
//
// Builds against a library without the recorder too (the "on" rows are then left out), so that
// the off cost can be measured against the code before the recorder existed (the command in
// docs/design.md, "The trace recorder"). Exits with 1 when a recording did not see every pair.
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>
#if __has_include(<streampool/trace_recorder.hpp>)
#include <streampool/trace_recorder.hpp>
#define STREAMPOOL_TRACE_COST_HAVE_RECORDER 1
#else
#define STREAMPOOL_TRACE_COST_HAVE_RECORDER 0
#endif

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using Bytes = streampool::PooledBuffer<std::byte>;
using Clock = std::chrono::steady_clock;

struct Settings {
  std::uint64_t pairs = 2'000'000;  // per thread and repeat
  int repeats = 7;
  int threads = 2;
  std::size_t size = 4096;
  bool random_sizes = false;  // size=random
  streampool::StreamChecks checks = streampool::StreamChecks::none;
  bool on = true;  // measure with the recorder on too (where the library has it)
  bool quiet = false;       // device=quiet
  bool one_stream = false;  // streams=one
  int stats_every_us = 0;   // stats_every: 0 for no stats() thread
};

// The stats() calls of one thread count's runs.
struct StatsCalls {
  std::uint64_t calls = 0;
  double total_ns = 0;
  double max_ns = 0;
};

// The fake device as a real one looks to the pool: no notifications.
class Quiet : public streampool::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  bool wants_notifications() const noexcept override { return false; }
};

// Nanoseconds per pair, the mean over the threads, for one pool.
double run(const Settings& settings, int threads, [[maybe_unused]] const std::string& trace_file,
           [[maybe_unused]] bool& complete, StatsCalls& stats_calls) {
  auto fake = std::make_shared<streampool::FakeDevice>();
  streampool::PoolOptions options;
  options.read_environment = false;
  options.stream_checks = settings.checks;
#if STREAMPOOL_TRACE_COST_HAVE_RECORDER
  options.trace_file = trace_file;
#endif
  std::vector<cudaStream_t> streams;
  for (int t = 0; t < threads; ++t) {
    streams.push_back(settings.one_stream && t > 0 ? streams.front() : fake->create_stream());
  }
  std::shared_ptr<streampool::Device> device = fake;
  if (settings.quiet) device = std::make_shared<Quiet>(fake);
  double total_ns = 0;
  {
    streampool::MemoryPool pool(device, options);
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> ns(threads, 0.0);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::uintptr_t sink = 0;
        for (int i = 0; i < 10000; ++i) {  // warm: the stream's state, the lists, the caches
          Bytes b = Bytes::alloc_async(pool, settings.size, streams[t]);
          sink += reinterpret_cast<std::uintptr_t>(b.data());
        }
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        std::uint64_t seed = 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(t + 1);
        const auto size_of = [&]() -> std::size_t {
          if (!settings.random_sizes) return settings.size;
          seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
          return (std::size_t{256} << 10) + (seed >> 33) % ((std::size_t{8} << 20) - (256 << 10));
        };
        const auto start = Clock::now();
        for (std::uint64_t i = 0; i < settings.pairs; ++i) {
          Bytes b = Bytes::alloc_async(pool, size_of(), streams[t]);
          sink += reinterpret_cast<std::uintptr_t>(b.data());
        }
        const auto stop = Clock::now();
        ns[t] = std::chrono::duration<double, std::nano>(stop - start).count() /
                static_cast<double>(settings.pairs);
        if (sink == 1) std::puts("");  // keeps the loop's work observable
      });
    }
    while (ready.load() != threads) std::this_thread::yield();
    go.store(true);
    std::atomic<int> finished{0};
    std::thread statistician;
    if (settings.stats_every_us > 0) {
      statistician = std::thread([&] {
        while (finished.load() == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(settings.stats_every_us));
          const auto start = Clock::now();
          const streampool::PoolStats seen = pool.stats();
          const double took = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
          if (seen.live_allocations.current < 0) std::puts("");  // keeps the call observable
          ++stats_calls.calls;
          stats_calls.total_ns += took;
          stats_calls.max_ns = std::max(stats_calls.max_ns, took);
        }
      });
    }
    for (auto& w : workers) w.join();
    finished.store(1);
    if (statistician.joinable()) statistician.join();
    for (double v : ns) total_ns += v;
#if STREAMPOOL_TRACE_COST_HAVE_RECORDER
    if (!trace_file.empty()) {
      const auto status = streampool::trace_status(pool);
      const std::uint64_t expected = (settings.pairs + 10000) * static_cast<std::uint64_t>(threads);
      complete = complete && status.allocations == expected && status.frees == expected &&
                 status.error_message.empty();
    }
#endif
  }
  return total_ns / threads;
}

bool parse(Settings& s, const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq == std::string::npos) return false;
  const std::string key = arg.substr(0, eq);
  const std::string value = arg.substr(eq + 1);
  if (key == "pairs") s.pairs = std::stoull(value);
  else if (key == "repeats") s.repeats = std::stoi(value);
  else if (key == "threads") s.threads = std::stoi(value);
  else if (key == "size" && value == "random") s.random_sizes = true;
  else if (key == "size") s.size = std::stoull(value);
  else if (key == "checks" && value == "none") s.checks = streampool::StreamChecks::none;
  else if (key == "checks" && value == "full") s.checks = streampool::StreamChecks::full;
  else if (key == "modes" && value == "off") s.on = false;
  else if (key == "modes" && value == "both") s.on = true;
  else if (key == "device" && value == "fake") s.quiet = false;
  else if (key == "device" && value == "quiet") s.quiet = true;
  else if (key == "streams" && value == "own") s.one_stream = false;
  else if (key == "streams" && value == "one") s.one_stream = true;
  else if (key == "stats_every") s.stats_every_us = std::stoi(value);
  else return false;
  return s.stats_every_us >= 0 && s.pairs > 0 && s.repeats > 0 && s.threads > 0 && s.size > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    if (!parse(settings, argv[i])) {
      std::fprintf(stderr,
                   "usage: %s [pairs=N] [repeats=R] [threads=T] [size=BYTES] "
                   "[checks=none|full] [modes=both|off] [device=fake|quiet] [streams=own|one] "
                   "[stats_every=MICROSECONDS]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string trace_file =
      (std::filesystem::temp_directory_path() /
       ("streampool_trace_cost." + std::to_string(::getpid()) + ".csv"))
          .string();
  std::vector<std::string> modes{"off"};
  if (STREAMPOOL_TRACE_COST_HAVE_RECORDER && settings.on) modes.push_back("on");
  std::map<std::pair<std::string, int>, std::vector<double>> samples;
  std::map<int, StatsCalls> stats_calls;
  bool complete = true;
  for (int r = 0; r < settings.repeats; ++r) {
    for (int threads = 1; threads <= settings.threads; ++threads) {
      for (const std::string& mode : modes) {
        samples[{mode, threads}].push_back(
            run(settings, threads, mode == "on" ? trace_file : std::string(), complete,
                stats_calls[threads]));
        std::filesystem::remove(trace_file);
      }
    }
  }
  std::printf("%s pairs of %s bytes per thread, %d repeats, stream_checks=%s, %s, %s\n",
              std::to_string(settings.pairs).c_str(),
              settings.random_sizes ? "256 KiB-8 MiB" : std::to_string(settings.size).c_str(),
              settings.repeats,
              settings.checks == streampool::StreamChecks::none ? "none" : "full",
              settings.quiet ? "fake device without notifications" : "fake device",
              settings.one_stream ? "one stream for all threads" : "a stream per thread");
  std::printf("%-8s %-8s %14s %14s\n", "recorder", "threads", "median ns/pair", "min ns/pair");
  for (auto& [key, values] : samples) {
    std::sort(values.begin(), values.end());
    std::printf("%-8s %-8d %14.1f %14.1f\n", key.first.c_str(), key.second,
                values[values.size() / 2], values.front());
  }
  if (settings.stats_every_us > 0) {
    std::printf("stats() every %d us while the pairs run:\n", settings.stats_every_us);
    std::printf("%-8s %10s %14s %14s\n", "threads", "calls", "mean us/call", "max us/call");
    for (const auto& [threads, c] : stats_calls) {
      std::printf("%-8d %10llu %14.2f %14.2f\n", threads, static_cast<unsigned long long>(c.calls),
                  c.calls == 0 ? 0.0 : c.total_ns / static_cast<double>(c.calls) / 1000.0,
                  c.max_ns / 1000.0);
    }
  }
  if (!complete) {
    std::fprintf(stderr, "a recording missed calls\n");
    return 1;
  }
  return 0;
}
