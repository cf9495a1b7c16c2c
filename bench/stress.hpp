// `stress`: real multi-stream work as a test of the pool (issue 8, the workload of the GPU
// machine's README, "Seen on 2026-12-01").
//
// T threads, two streams each, share one MemoryPool. Each iteration allocates a
// PooledBuffer<unsigned> on the thread's first stream (half the requests from a hot set of small
// sizes shared by all threads, half random odd sizes from 1 KiB to 8 MiB), launches a kernel
// that spins a random 0-60 us and writes a tag unique to the iteration into the buffer, then a
// kernel that counts the words without the tag (a third of the time on the second stream,
// ordered after the write by an event, with record_stream), and drops the buffer while both may
// still run. A buffer handed out while its last owner's work is pending shows as corrupted
// words (and, on the fake device, as a race). With churn, every N buffers a thread destroys its
// first stream and creates another, which CUDA usually gives the old handle.
//
// Each configuration (a STREAMPOOL_CONF line) runs in turn with a fresh pool and fresh streams,
// so that policies are compared in one process. The checks are pure functions of a result, so
// that tests can give them numbers directly.
#pragma once

#include "call_counts.hpp"
#include "compare.hpp"

#include <streampool/pool_stats.hpp>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace streampool::bench {

struct StressOptions {
  double seconds = 30;      // per configuration
  unsigned threads = 0;     // 0: 12 on the GPU, fake_default_threads on the fake device
  std::uint64_t churn = 0;  // renew the first stream every this many buffers per thread; 0: never
  // --config lines, each on top of STREAMPOOL_CONF, run in turn ("": the environment's settings,
  // or the defaults)
  std::vector<std::string> configs{""};
  bool fake = false;                     // the fake device even where there is a GPU
  std::string out;      // directory for stress.csv and stress-reserved.svg; empty: none
  double interval = 5;  // seconds between progress lines
  std::uint64_t seed = 1;
  double max_growth = 0;  // fail when the last window's peak reserved exceeds the first's by
                          // more than this factor, or the device ran out; 0: not checked
  // Before each allocation a thread waits while more than this many of its checks are not
  // complete, as an application bounds how far it runs ahead of the GPU; 0: never waits.
  std::uint64_t max_in_flight = 0;
  // After each drop the lane records an event of its own on the first stream (GPU only): the
  // events fence_every_free adds to the GPU's queues, without the fences (an experiment).
  bool mark_drops = false;
  // After each drop a thread spends this many nanoseconds on work of its own (a busy loop that
  // makes no CUDA call; in none of the latencies, but in the run's time), as an application does
  // between its allocations: on the H200 the rate of the GPU's work depends on how fast the
  // threads submit it (bench/results/stress-h200.md).
  std::uint64_t host_work_ns = 0;
  bool help = false;
};

constexpr unsigned gpu_default_threads = 12;
constexpr unsigned fake_default_threads = 4;

// What `stress --help` says the command does, above its options.
extern const char* const stress_description;

// A bad command line; the message says what is wrong.
class StressUsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The command's options, on `app` (the `stress` subcommand of cli.cpp), their values into `o`.
// Each --config adds a configuration; none leaves `o.configs` empty (check_stress_options).
void add_stress_options(CLI::App& app, StressOptions& o);
// After parsing: no --config stands for one configuration, "" (the environment's settings or the
// defaults); each is parsed on top of STREAMPOOL_CONF (settings.hpp) and validated here, so that a
// bad one stops the command before anything runs. Throws StressUsageError.
void check_stress_options(StressOptions& o);
// Parses the arguments after `stress` with the options above (--help sets `help`). Throws
// StressUsageError.
StressOptions parse_stress_options(const std::vector<std::string>& args);

// Nanoseconds of the sampled calls, timed on the CPU around each.
struct Latency {
  double mean_ns = 0;
  double p99_ns = 0;
  std::uint64_t samples = 0;
};
Latency summarize_latency(std::vector<std::uint32_t> ns);

// One progress line: figures at `seconds` into the configuration's run.
struct StressSample {
  double seconds = 0;
  double buffers_per_second = 0;  // over the interval that ended here
  std::int64_t reserved_bytes = 0;
  std::uint64_t device_allocations = 0;
  std::uint64_t fences = 0;
  // Where the reserved memory was (MemoryPool::breakdown()).
  std::int64_t parked_bytes = 0;
  std::int64_t free_owned_bytes = 0;
  std::int64_t free_clean_bytes = 0;
  std::int64_t slab_bytes = 0;
  std::int64_t shelved_bytes = 0;
};

struct StressResult {
  std::string label;   // the --config text as given, or "default" for ""
  std::string config;  // the options' full STREAMPOOL_CONF line
  std::string target;  // "fake device" or the GPU's name
  unsigned threads = 0;
  std::uint64_t churn = 0;
  std::uint64_t max_in_flight = 0;  // StressOptions::max_in_flight
  bool mark_drops = false;          // StressOptions::mark_drops
  std::uint64_t host_work_ns = 0;   // StressOptions::host_work_ns
  double seconds = 0;  // measured from start to stop
  std::uint64_t buffers = 0;
  PoolStats stats;  // at the end, all work complete, before the pool went
  double window_seconds = 0;
  std::int64_t first_window_peak = 0;  // peak reserved bytes in the first window of the run
  std::int64_t last_window_peak = 0;   // and in the last
  Latency allocate;                    // PooledBuffer::try_alloc_async
  Latency drop;                        // PooledBuffer::reset
  Latency launch;                      // the lane's calls of an iteration (and record_stream)
  Latency in_flight;                   // the lane's checks not complete (a count, not ns)
  std::uint64_t corrupted_words = 0;   // on the fake, only three words of each buffer are checked
  std::uint64_t failed_allocations = 0;
  std::uint64_t error_count = 0;         // failed allocations and failed device calls
  std::vector<std::string> errors;       // the first few of them
  std::uint64_t hazard_count = 0;        // the fake's race detector
  std::vector<std::string> hazards;      // the first few
  std::int64_t true_live_peak = 0;       // the most buffers ever live at once, counted by the bench
  std::int64_t true_requested_peak = 0;  // and the most bytes
  std::int64_t streams_alive = 0;        // threads x 2
  std::size_t stats_granule = 0;
  std::vector<StressSample> samples;
  // The device calls the pool made (through its device: the lanes' own calls are not counted),
  // and the CPU time they took.
  std::vector<DeviceCallCount> device_calls;
  // The waits for the pool's locks during the run (lock_contention(): the process's, so one run
  // at a time).
  LockContention contention;

  double buffers_per_second() const { return seconds > 0 ? double(buffers) / seconds : 0.0; }
  double fences_per_buffer() const {
    return buffers > 0 ? double(stats.fences_recorded) / double(buffers) : 0.0;
  }
  double growth() const;
};

// How far above the truth the pool's published peaks may be (PoolOptions::stats_granule): per
// stream, two granules of bytes and 2 x max(1, granule >> 14) allocations; nothing when the
// granule is 0.
struct StatsSlack {
  std::int64_t bytes = 0;
  std::int64_t allocations = 0;
};
StatsSlack stats_slack(std::size_t stats_granule, std::int64_t streams);
// last / first; 0 when nothing was reserved in either, infinity when only the last window was.
double growth_ratio(std::int64_t first_window_peak, std::int64_t last_window_peak);
// 60 s for runs of at least 5 minutes, a fifth of the run otherwise.
double window_seconds(double run_seconds);

// What is wrong with a result, one message per failed check: corrupted words, hazards, failed
// allocations and device calls; when `max_growth` is non-zero, growth above it, or any
// out-of-memory retry (the device's capacity then caps both windows, hiding the growth); and
// peaks of live allocations or requested bytes above the true peak plus the documented slack
// over the streams alive.
std::vector<std::string> stress_failures(const StressResult& result, double max_growth);

// Runs every configuration in turn and returns their results; progress lines go to `log`.
// Throws StressError when the target cannot be made at all (no GPU kernels in this build).
std::vector<StressResult> run_stress(const StressOptions& options, std::ostream& log);

// The summary of one configuration: figure | value.
Table stress_table(const StressResult& result);
// Every progress sample of every configuration (the CSV of --out).
Table stress_samples_table(const std::vector<StressResult>& results);
// Reserved memory over time, one line per configuration.
std::string stress_plot(const std::vector<StressResult>& results);

// The whole command once parsed: runs, prints to `out`, writes --out, checks (failures to `err`
// too). Returns the exit code: 0 when every check passed, 1 when one failed or the run could not
// start.
int stress_command(const StressOptions& options, std::ostream& out, std::ostream& err);

}  // namespace streampool::bench
