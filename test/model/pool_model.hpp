// A randomized model check of MemoryPool on the fake device.
//
// A run decodes operations from a byte source and applies them to one MemoryPool over a
// FakeDevice, keeping a shadow model of its own: the buffers alive now (address range, stream,
// size, the streams that used them), the CapturePools and graphs and the memory pinned to them,
// the streams and their captures (and the streams that join them), and what the statistics must
// say. Every operation is legal under the contract of memory_pool.hpp, pooled_buffer.hpp and
// capture_pool.hpp at the moment it is made (the model decides which are), so that a failure is
// the pool's fault. After every step it checks:
//
//   overlap     no two live buffers overlap; none overlaps memory pinned to a live CapturePool
//               (buffers it adopted or holds, and, outside its own captures, its private pieces)
//   races       FakeDevice::hazards() is empty: a race means a block reached another stream
//               before the work of its last owner was done
//   captures    every capture the model began is still active (the pool made no call CUDA
//               refuses during capture), and no stream captures that the model did not begin
//   stats       pool_stats.hpp's counters agree with the model: exact where no CapturePool holds
//               memory (peaks exact with stats_granule 0, within two granules per live stream
//               otherwise), lower bounds where one does; reserved bytes are the fake's live bytes
//   breakdown   MemoryPool::breakdown() adds up: its segments hold the reserved bytes, and the
//               slabs, free ranges, free small blocks and parked blocks fit in them
//   bounds      reserved memory never passes max_reserved_bytes, nor a generous multiple of the
//               memory the model's buffers could need at once; an allocation the limits allow
//               with room to spare does not fail with out_of_memory
//   teardown    once everything is dropped, every graph destroyed and the pool destroyed, every
//               device byte, event and user object is back
//
// The byte source is a seeded PRNG (the tests) or a byte string (a fuzzer's input, or a replay):
// both decode the same way, and a seeded run records the bytes it drew, so any failure replays as
// a byte string and can be reduced to a short operation sequence by removing operations.
//
// run_concurrent is the multi-threaded variant: threads with streams of their own and one shared
// stream allocate, drop, launch, record_stream and churn streams while others trim and complete
// work at once; overlaps are checked as they happen and races at the end.
#pragma once

#include <streampool/device.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/pool_options.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pool_model {

// The decisions of a run: drawn from a PRNG seeded once (endless), or read from a byte string
// (exhausted at its end; every draw then reads 0).
class ByteSource {
 public:
  explicit ByteSource(std::uint64_t seed);
  explicit ByteSource(std::span<const std::uint8_t> bytes);

  std::uint8_t byte();
  // Uniform enough in [0, n); 0 when n is 0 or 1 (and then draws nothing).
  std::uint32_t below(std::uint32_t n);
  bool one_in(std::uint32_t n) { return below(n) == 0; }
  bool exhausted() const noexcept { return exhausted_; }
  // Bytes drawn so far: the input that replays this run.
  std::size_t position() const noexcept;
  std::vector<std::uint8_t> drawn() const;

 private:
  bool seeded_ = false;
  std::uint64_t state_ = 0;
  std::vector<std::uint8_t> bytes_;  // seeded: every byte drawn; else the input
  std::size_t at_ = 0;
  bool exhausted_ = false;
};

// Which operations a run may decode.
enum class Profile {
  full,   // everything: captures, graphs, stream churn, faults, threads, a second pool
  basic,  // allocate, drop, raw API, launches, record_stream, completions, trim on fixed streams
};

struct RunOptions {
  int max_steps = 250;
  Profile profile = Profile::full;
  // The device the pool is given, made from the fake the model drives (by default the fake
  // itself): a decorator lets a test check that the model catches a pool that misbehaves.
  std::function<std::shared_ptr<streampool::Device>(std::shared_ptr<streampool::FakeDevice>)>
      wrap_device;
  // Operations (op_names()) and variants of them never decoded: to look past a failure that
  // hides others.
  std::vector<std::string> without;
  // Called as the run goes: 'O' with the byte offset where an operation begins, 'L' with its
  // log line once it is done (so that a run that crashes still tells how far it got).
  std::function<void(char tag, const std::string& text)> trace;
};

// The names RunOptions::without accepts.
std::vector<std::string> op_names();

struct Failure {
  std::string kind;  // what was violated, coarse: reductions keep it
  std::string what;  // the details
  int step = -1;     // index in the log of the operation after which it was seen
};

struct RunResult {
  std::optional<Failure> failure;
  std::string setup;                  // the options decoded
  std::vector<std::string> log;       // one line per operation, teardown included
  std::vector<std::size_t> op_start;  // the byte offset where each logged operation began
  std::size_t header_bytes = 0;       // the bytes that decoded the setup
  std::vector<std::uint8_t> bytes;    // the input that replays the run
};

RunResult run_model(ByteSource& source, const RunOptions& options = {});
RunResult run_seed(std::uint64_t seed, const RunOptions& options = {});
RunResult run_bytes(std::span<const std::uint8_t> bytes, const RunOptions& options = {});

// The same runs in a child process (fork): a crash or a hang (past `timeout_s`) of the pool is
// then a failure like any other ("crash"), with the log up to the operation it happened in.
RunResult run_seed_isolated(std::uint64_t seed, const RunOptions& options = {}, int timeout_s = 60);
RunResult run_bytes_isolated(std::span<const std::uint8_t> bytes, const RunOptions& options = {},
                             int timeout_s = 60);

// A shorter input that fails with the same kind of failure: operations are removed while the
// failure stays (at most `max_runs` runs, each isolated when `isolated`). `failing` must have
// failed.
RunResult reduce(const RunResult& failing, const RunOptions& options = {}, int max_runs = 3000,
                 bool isolated = true);

// The operations a run applied: its log's lines but the teardown's (which begins "teardown").
std::size_t operations_of(const RunResult& result);

// The setup, the log (every line, or the last `tail` lines when tail > 0) and the failure.
std::string describe(const RunResult& result, std::size_t tail = 0);
std::string to_hex(std::span<const std::uint8_t> bytes);
std::vector<std::uint8_t> from_hex(std::string_view hex);

// Stream churn: a stream made, used and destroyed over and over (every buffer dropped first, as
// the contract asks) while another stream works on, and work completing soon after it is
// launched, as on a GPU. Fails when reserved memory does not stay flat: after the warm-up rounds
// it may not grow past 1.5 times its highest during them, plus a segment.
RunResult run_churn(std::uint64_t seed, streampool::PoolOptions options, int rounds = 120);

struct ConcurrentOptions {
  int threads = 3;  // workers, each with two streams of its own
  int steps_per_thread = 1500;
  int reclaimers = 2;  // threads that trim (two at once: concurrent reclaim)
  // Worker operations left out, to tell which one a failure needs: "record_stream",
  // "release_stream", "stream_destroy", "trim"; "limit" (no max_reserved_bytes, so no
  // out-of-memory ladder); "concurrent_reclaim" (one reclaimer: with "trim" and "limit", no two
  // reclaims at once); "reclaimers" (none at all).
  std::vector<std::string> without;
};

// Returns the failure, if any, and a line naming the options. Not deterministic: the threads
// interleave as they will, so a seed may pass once and fail the next time.
RunResult run_concurrent(std::uint64_t seed, const ConcurrentOptions& options = {});
// The same in a child process (a crash is a failure, "crash").
RunResult run_concurrent_isolated(std::uint64_t seed, const ConcurrentOptions& options = {},
                                  int timeout_s = 120);
// A concurrent run logs one line, after its threads end: this, then the number of allocations
// that returned a buffer. served_by reads it back (none: the run logged no such line).
inline constexpr std::string_view concurrent_served = "allocations served:";
std::optional<std::uint64_t> served_by(const RunResult& result);

}  // namespace pool_model
