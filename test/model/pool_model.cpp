// The model check of pool_model.hpp. Three parts: the byte source and the operation decoder
// (Model::step), the shadow model and its checks (Model::check), and the drivers (run_model,
// reduce, run_churn, run_concurrent).
//
// How the model keeps its own operations legal, so that every failure is the pool's:
//   - Work that touches a buffer on a stream other than the last one to touch it is ordered after
//     that stream with an event first, as the contract asks of callers; a buffer is used only on
//     its own stream and the streams record_stream named.
//   - Memory that a CapturePool's graphs use (its private pieces, and shared buffers its captures
//     touched) forms the pool's "domain": every use of it, graph replays included, is ordered
//     after every earlier one through events the model records after each use ("graphs sharing
//     a pool replay in stream order"). A shared buffer a capture touched is kept alive for the
//     graph: dropped during the capture on its stream (the pool adopts it), or handed to the
//     CapturePool with record_buffer when the capture ends.
//   - Nothing the model does names a capturing stream except what the capture captures: work
//     launched into it, allocations and drops on it, record_stream naming it for a buffer of its
//     own, release_stream, and the pool calls under test.
//   - A stream is destroyed only after every buffer used on it was dropped (the model drops them
//     first), and under StreamChecks::none only after release_stream.
//   - An injected fault is armed just before one pool call and disarmed just after it, so that
//     the model's own device calls never meet it.
#include "../coverage.hpp"
#include "../live_ranges.hpp"
#include "pool_model.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>
#include <streampool/pooled_buffer.hpp>
#include <streampool/size_classes.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <exception>
#include <iostream>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <utility>

namespace pool_model {

using streampool::CapturedGraph;
using streampool::CaptureMode;
using streampool::CapturePool;
using streampool::CaptureStatus;
using streampool::Errc;
using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PoolBreakdown;
using streampool::PoolOptions;
using streampool::PoolStats;
using streampool::StreamChecks;
using Bytes = streampool::PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

// splitmix64: a full-period generator whose every seed, 0 included, gives a good stream.
std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

std::string size_text(std::size_t bytes) {
  if (bytes >= MiB && bytes % KiB == 0) return fmt::format("{:.2f}M", double(bytes) / double(MiB));
  if (bytes >= 16 * KiB) return fmt::format("{:.1f}K", double(bytes) / double(KiB));
  return std::to_string(bytes);
}

const char* mode_name(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::global: return "global";
    case CaptureMode::thread_local_: return "thread-local";
    case CaptureMode::relaxed: return "relaxed";
  }
  return "?";
}

std::string error_text(const std::error_code& error) {
  return fmt::format("{} ({})", error.message(), error.value());
}

// A second thread that runs one task at a time while its caller waits: the model stays
// deterministic, and still makes calls from a thread that did not begin a capture, or on that
// thread's own per-thread default stream.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void run(const std::function<void()>& task) {
    std::unique_lock<std::mutex> lock(mutex_);
    task_ = &task;
    wake_.notify_all();
    wake_.wait(lock, [&] { return task_ == nullptr; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || task_ != nullptr; });
      if (task_ == nullptr) return;
      const std::function<void()>* task = task_;
      lock.unlock();
      std::exception_ptr error;
      try {
        (*task)();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      task_ = nullptr;
      wake_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void()>* task_ = nullptr;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

// Set by the body of a unit of work when it completes.
using Flag = std::shared_ptr<std::atomic<bool>>;

bool all_done(const std::vector<Flag>& work) {
  return std::all_of(work.begin(), work.end(), [](const Flag& f) { return f->load(); });
}

}  // namespace

// --- ByteSource ---------------------------------------------------------------------------------

ByteSource::ByteSource(std::uint64_t seed) : seeded_(true), state_(seed) {}

ByteSource::ByteSource(std::span<const std::uint8_t> bytes) : bytes_(bytes.begin(), bytes.end()) {}

std::uint8_t ByteSource::byte() {
  if (seeded_) {
    const auto b = static_cast<std::uint8_t>(splitmix(state_) >> 56);
    bytes_.push_back(b);
    return b;
  }
  if (at_ >= bytes_.size()) {
    exhausted_ = true;
    return 0;
  }
  return bytes_[at_++];
}

std::uint32_t ByteSource::below(std::uint32_t n) {
  if (n <= 1) return 0;
  std::uint32_t value = byte();
  if (n > 256) value = value << 8 | byte();
  if (n > 65536) value = value << 16 | std::uint32_t{byte()} << 8 | byte();
  return value % n;
}

std::size_t ByteSource::position() const noexcept { return seeded_ ? bytes_.size() : at_; }

std::vector<std::uint8_t> ByteSource::drawn() const {
  return {bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(position())};
}

// --- the model ----------------------------------------------------------------------------------

namespace {

// The operations a step may decode. Each has a weight, drawn per run ("swarm testing": a run
// that never trims or never completes work finds what a run doing everything hides).
enum class Op {
  alloc,
  alloc_raw,
  drop,
  free_elsewhere,
  record_stream,
  launch,
  complete,
  complete_all,
  release_stream,
  trim,
  stream_create,
  stream_destroy,
  capture_begin,
  capture_end,
  capture_misuse,
  graph_launch,
  graph_destroy,
  capture_pool,
  raw_capture,
  fault,
  scratch_pool,
  count
};
constexpr int op_count = static_cast<int>(Op::count);

constexpr const char* op_name[op_count] = {
    "alloc",         "alloc_raw",      "drop",          "free_elsewhere", "record_stream",
    "launch",        "complete",       "complete_all",  "release_stream", "trim",
    "stream_create", "stream_destroy", "capture_begin", "capture_end",    "capture_misuse",
    "graph_launch",  "graph_destroy",  "capture_pool",  "raw_capture",    "fault",
    "scratch_pool",
};
// Variants of operations that RunOptions::without can leave out too.
constexpr const char* variant_name[] = {
    "record_captured",         // record_stream naming a capturing stream
    "release_captured",        // release_stream of a capturing stream
    "release_in_capture",      // release_stream while a capture with a pool is under way
    "trim_in_capture",         // trim while a capture with a pool is under way
    "free_captured",           // a raw deallocate on a capturing stream
    "helper",                  // calls from a second thread
    "orphan_teardown",         // teardowns that destroy the MemoryPool first
    "orphan_mid_capture",      // ... while a capture is under way
    "free_private_elsewhere",  // a private piece freed through the raw API on another stream
    "release_live",            // release_stream of a stream with live buffers
    "pending_release",         // a graph's release still queued when the MemoryPool goes (else the
                               // teardown reaches a safe point first)
    "join",                    // a created stream joins a capture under way, and is joined back
    "framework",               // captures begun and ended as a framework does (prepare, attach,
                               // detach around its own begin and end), detached early at times
    // and "fault:<call>" (FakeDevice::call_name) for each call a fault may be injected into
};

bool in_basic(Op op) {
  switch (op) {
    case Op::alloc:
    case Op::alloc_raw:
    case Op::drop:
    case Op::free_elsewhere:
    case Op::record_stream:
    case Op::launch:
    case Op::complete:
    case Op::complete_all:
    case Op::trim: return true;
    default: return false;
  }
}

// The calls a fault may be injected into: every seam call the pool and the capture layer make.
constexpr Call fault_calls[] = {Call::malloc,
                                Call::free,
                                Call::event_create,
                                Call::event_record,
                                Call::event_query,
                                Call::event_synchronize,
                                Call::stream_wait_event,
                                Call::stream_synchronize,
                                Call::device_synchronize,
                                Call::stream_id,
                                Call::capture_info,
                                Call::begin_capture,
                                Call::end_capture,
                                Call::graph_instantiate,
                                Call::graph_launch,
                                Call::graph_exec_destroy,
                                Call::graph_destroy,
                                Call::user_object_create,
                                Call::graph_retain_user_object};

struct Slot {
  enum class Kind { legacy, per_thread, created };
  Kind kind = Kind::created;
  int thread = 0;  // per-thread streams: the thread whose default stream it is
  cudaStream_t handle = nullptr;
  bool alive = false;
  int generation = 0;
  int capture = -1;                      // the CapturePool (index) capturing it
  bool joined = false;  // a member of that capture by an event wait, not the stream that began it
  cudaEvent_t before_capture = nullptr;  // recorded just before its capture began (or it joined)
};

struct Buffer {
  int id = 0;
  Bytes pooled;
  void* raw = nullptr;
  std::uintptr_t begin = 0;
  std::size_t bytes = 0;
  std::size_t footprint = 0;   // what the pool must set aside for it, rounded
  int slot = 0;                // the stream it was allocated on
  int thread = 0;              // the thread that allocated it
  std::vector<int> uses;       // the streams that used it: its own first, then recorded ones
  int pool = -1;               // the CapturePool whose domain it is in
  bool private_piece = false;  // allocated during a capture, from the pool's private memory
  std::vector<Flag> work;      // the work that touched it
  bool is_raw() const { return raw != nullptr; }
};

// Memory a CapturePool keeps for its graphs: buffers it holds (record_buffer, still live
// allocations) and buffers it adopted (dropped during its capture).
struct Held {
  int id = 0;
  std::uintptr_t begin = 0;
  std::size_t bytes = 0;
  std::size_t footprint = 0;
  int pool = -1;
  bool live = false;
  std::vector<int> uses;
};

struct PoolSlot {
  std::shared_ptr<CapturePool> handle;  // the model's reference
  std::weak_ptr<CapturePool> weak;
  bool sealed = false;
  int capturing = -1;  // the stream slot it captures
  CaptureMode mode = CaptureMode::global;
  // Begun as a framework begins it (prepare, its own cudaStreamBeginCapture, attach), to be ended
  // likewise (its own cudaStreamEndCapture, detach; capture_pool.hpp).
  bool framework = false;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> private_ranges;
  std::map<std::pair<int, int>, cudaEvent_t> domain;  // (slot, generation) -> after its last use
  bool expired = false;
  std::size_t most_private = 0;  // the most private memory it held
};

struct GraphSlot {
  int id = 0;
  CapturedGraph graph;
  cudaGraphExec_t exec = nullptr;  // after release(), or a framework's: the model destroys it
  int pool = -1;
  // A framework's graph: nothing of the library keeps its CapturePool, the model does, until the
  // graph's last replay has completed (capture_pool.hpp).
  std::shared_ptr<CapturePool> keep;
};

struct Dropped {
  std::size_t footprint = 0;
  std::vector<Flag> work;
};

class Model {
 public:
  Model(ByteSource& source, const RunOptions& options, RunResult& result)
      : src_(source), run_(options), result_(result) {}
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  void setup();
  void step();
  void teardown();
  bool failed() const { return result_.failure.has_value(); }
  // After a failure the pool may be broken: the model's objects are leaked, not dropped.
  void abandon();

 private:
  // --- decoding -------------------------------------------------------------------------------
  Op pick_op();
  std::size_t pick_size();
  template <class Pred>
  int pick(int count, Pred pred);
  int pick_slot_for_alloc();
  int pick_thread(int slot);

  // --- the model's own device calls -----------------------------------------------------------
  void on(int thread, const std::function<void()>& call);
  cudaStream_t handle(int slot);
  std::string name(int slot) const;
  cudaEvent_t record_event(int slot);
  void wait_event(int slot, cudaEvent_t event);
  void order_after(int waiter, int awaited);
  void domain_wait(int pool, int slot);
  void domain_note(int pool, int slot);
  void launch_ordinary(Buffer& b, int slot, bool write);
  bool usable_now(const Buffer& b) const;
  bool legacy_refused() const;
  bool uses_refused_legacy(const Buffer& b) const;
  bool idle_now(int slot) const;
  CaptureStatus status_of(int slot);

  // --- pool calls -----------------------------------------------------------------------------
  template <class F>
  void pool_call(F&& call);
  void note(const std::string& text);
  void fail(std::string kind, std::string what);
  bool restricted_here(int thread) const;
  bool capture_active() const;
  std::int64_t deferred_scratch_ = 0;  // device bytes of scratch pools whose end a capture deferred
  bool limited() const;
  std::size_t footprint_of(std::size_t bytes) const;

  // --- operations -----------------------------------------------------------------------------
  void op_alloc(bool raw);
  void alloc_on(int slot, int thread, std::size_t bytes, bool raw, bool write);
  void judge_alloc_error(const std::error_code& error, int slot, int thread, std::size_t bytes);
  void op_drop();
  void drop(std::size_t index, int thread);
  void op_free_elsewhere();
  void op_record_stream();
  void op_launch();
  void op_complete();
  void op_complete_all();
  void op_release_stream();
  void release_stream(int slot, int thread);
  void op_trim();
  void op_stream_create();
  void op_stream_destroy();
  void op_capture_begin();
  void join_capture();
  void join_back_all(int pool);
  void op_capture_end();
  void end_capture(int pool, int thread);
  bool end_as_framework(int pool, int thread, cudaGraphExec_t& exec);
  void op_capture_misuse();
  void op_graph_launch();
  void op_graph_destroy();
  void op_capture_pool();
  int new_capture_pool();
  void op_raw_capture();
  void op_fault();
  void op_scratch_pool();
  void run_op(Op op);

  // --- checks ---------------------------------------------------------------------------------
  void prune();
  void check();
  void check_hazards();
  void check_captures();
  void check_overlaps();
  void check_pinned(const Buffer& b, int capturing_pool);
  void check_stats();
  void check_breakdown();
  void check_bounds();
  void note_allocation(std::size_t bytes);
  std::size_t live_count() const;
  std::size_t live_bytes() const;
  int streams_now() const;

  ByteSource& src_;
  RunOptions run_;
  RunResult& result_;
  std::string line_;  // the operation being decoded

  PoolOptions options_;
  streampool::SizeClasses classes_;
  std::size_t capacity_ = 0;
  std::array<int, op_count> weight_{};
  bool threads_ = false;
  int max_created_ = 0;

  std::shared_ptr<FakeDevice> fake_;
  std::shared_ptr<streampool::Device> device_;
  std::unique_ptr<MemoryPool> pool_;
  std::unique_ptr<Worker> worker_;

  std::vector<Slot> slots_;
  std::vector<Buffer> buffers_;
  std::vector<Held> held_;
  std::vector<PoolSlot> pools_;
  std::vector<GraphSlot> graphs_;
  // The CapturePools of destroyed framework graphs, kept until their replays have completed.
  std::vector<std::shared_ptr<CapturePool>> retired_;
  std::vector<Dropped> dropped_;
  std::vector<cudaEvent_t> events_;  // the model's own, destroyed at the end
  int next_id_ = 1;

  // What the statistics must say.
  std::int64_t total_allocations_ = 0;
  std::int64_t total_bytes_ = 0;
  std::int64_t peak_count_ = 0;
  std::int64_t peak_bytes_ = 0;
  std::int64_t peak_bound_ = 0;  // the highest the requested-bytes peak may read (granules)
  bool capture_memory_ = false;  // a CapturePool took memory: its ranges count in the stats
  std::size_t peak_active_ = 0;  // the most memory the model's buffers could need at once
  std::size_t largest_request_ = 0;

  // Whether a buffer of the stream is alive (the model's, or one a CapturePool holds).
  bool live_on(int slot) const {
    return std::any_of(buffers_.begin(), buffers_.end(),
                       [&](const Buffer& b) { return b.slot == slot; }) ||
           std::any_of(held_.begin(), held_.end(),
                       [&](const Held& h) { return h.live && h.uses.front() == slot; });
  }
  bool allowed(std::string_view what) const {
    return std::find(run_.without.begin(), run_.without.end(), what) == run_.without.end();
  }

  std::optional<Call> pending_fault_;
  bool fault_in_op_ = false;
  int current_step_ = 0;
  std::vector<unsigned> classes_used_;
};

Model::~Model() = default;

// --- decoding -----------------------------------------------------------------------------------

template <class Pred>
int Model::pick(int count, Pred pred) {
  std::vector<int> candidates;
  for (int i = 0; i < count; ++i) {
    if (pred(i)) candidates.push_back(i);
  }
  if (candidates.empty()) return -1;
  return candidates[src_.below(static_cast<std::uint32_t>(candidates.size()))];
}

Op Model::pick_op() {
  int total = 0;
  for (int w : weight_) total += w;
  int at = static_cast<int>(src_.below(static_cast<std::uint32_t>(total)));
  for (int i = 0; i < op_count; ++i) {
    if (at < weight_[static_cast<std::size_t>(i)]) return static_cast<Op>(i);
    at -= weight_[static_cast<std::size_t>(i)];
  }
  return Op::alloc;
}

std::size_t Model::pick_size() {
  const std::size_t largest = classes_.max_block_size();
  const std::size_t smallest = options_.size_classes.smallest;
  switch (src_.below(20)) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4:
    case 5: return 1 + src_.below(static_cast<std::uint32_t>(smallest + 100));
    case 6:
    case 7:
    case 8:
    case 9:
    case 10: return 1 + src_.below(16 * KiB);
    case 11:
    case 12:
    case 13: return 1 + src_.below(static_cast<std::uint32_t>(largest));
    case 14: {
      const std::size_t edges[] = {smallest, smallest + 1, largest - 1, largest, largest + 1};
      return edges[src_.below(5)];
    }
    default: {
      const std::size_t cap = options_.max_reserved_bytes != 0 || capacity_ < (std::size_t{1} << 30)
                                  ? 3 * MiB
                                  : 6 * MiB;
      return largest + 1 + src_.below(static_cast<std::uint32_t>(cap));
    }
  }
}

int Model::pick_slot_for_alloc() {
  return pick(static_cast<int>(slots_.size()),
              [&](int i) { return slots_[static_cast<std::size_t>(i)].alive; });
}

int Model::pick_thread(int slot) {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  if (s.kind == Slot::Kind::per_thread) return s.thread;
  if (!threads_) return 0;
  return src_.one_in(5) ? 1 : 0;
}

void Model::setup() {
  // Byte 0: stream checks and the fence policies.
  const std::uint8_t b0 = src_.byte();
  const StreamChecks checks[] = {StreamChecks::full, StreamChecks::full, StreamChecks::identity,
                                 StreamChecks::none};
  options_.read_environment = false;
  options_.stream_checks = checks[b0 & 3];
  options_.fence_every_free = ((b0 >> 2) & 3) == 0;
  options_.cross_stream_wait = ((b0 >> 4) & 3) == 0;
  // Byte 1: statistics, slabs, size classes, large rounding, segments expandable or cudaMalloc's.
  const std::uint8_t b1 = src_.byte();
  const std::size_t granules[] = {0, 0, 64 * KiB, 1 * MiB};
  const std::size_t slabs[] = {1 * MiB, 1 * MiB, 4 * KiB, 64 * KiB};
  const std::size_t largest[] = {256 * KiB, 256 * KiB, 256 * KiB, 64 * KiB};
  options_.stats_granule = granules[b1 & 3];
  options_.slab_bytes = slabs[(b1 >> 2) & 3];
  options_.size_classes.largest = largest[(b1 >> 4) & 3];
  options_.large_rounding = ((b1 >> 6) & 1) != 0 ? 4 * KiB : 128 * KiB;
  options_.expandable_segments = ((b1 >> 7) & 1) == 0;
  // Byte 2: segments, the reserved limit, the device's capacity.
  const std::uint8_t b2 = src_.byte();
  const std::size_t segments[] = {20 * MiB, 2 * MiB, 4 * MiB, 20 * MiB};
  const std::size_t limits[] = {0, 0, 48 * MiB, 96 * MiB};
  const std::size_t capacities[] = {std::size_t{80} << 30, std::size_t{80} << 30,
                                    std::size_t{80} << 30, 160 * MiB};
  options_.segment_bytes = segments[b2 & 3];
  options_.max_reserved_bytes = limits[(b2 >> 2) & 3];
  capacity_ = capacities[(b2 >> 4) & 3];
  // Byte 3: threads and streams.
  const std::uint8_t b3 = src_.byte();
  const bool full = run_.profile == Profile::full;
  threads_ = full && (b3 & 3) != 0 && allowed("helper");
  max_created_ = 2 + ((b3 >> 2) & 3);
  // Then one byte per operation: its weight in this run.
  const int weights[] = {1, 1, 2, 3, 4, 6, 8, 0};
  for (int i = 0; i < op_count; ++i) {
    const auto op = static_cast<Op>(i);
    int w = weights[src_.byte() & 7];
    if (op == Op::alloc || op == Op::drop || op == Op::launch) w = std::max(w, 2);
    if (op == Op::alloc) w *= 2;
    if ((!full && !in_basic(op)) || !allowed(op_name[i])) w = 0;
    weight_[static_cast<std::size_t>(i)] = w;
  }
  if (!options_.validate().empty()) options_ = PoolOptions{};
  classes_ = streampool::SizeClasses(options_.size_classes);
  result_.header_bytes = src_.position();

  FakeDevice::Options device_options;
  device_options.capacity = capacity_;
  fake_ = std::make_shared<FakeDevice>(device_options);
  device_ = run_.wrap_device ? run_.wrap_device(fake_) : fake_;
  pool_ = std::make_unique<MemoryPool>(device_, options_);
  if (threads_) worker_ = std::make_unique<Worker>();

  Slot legacy;
  legacy.kind = Slot::Kind::legacy;
  legacy.alive = true;
  slots_.push_back(legacy);
  Slot main_thread;
  main_thread.kind = Slot::Kind::per_thread;
  main_thread.handle = cudaStreamPerThread;
  main_thread.alive = true;
  slots_.push_back(main_thread);
  if (threads_) {
    Slot helper = main_thread;
    helper.thread = 1;
    slots_.push_back(helper);
  }
  const int initial = full ? 2 : 3;
  for (int i = 0; i < max_created_; ++i) {
    Slot created;
    if (i < initial) {
      created.handle = fake_->create_stream();
      created.alive = true;
    }
    slots_.push_back(created);
  }

  std::string weights_text;
  for (int i = 0; i < op_count; ++i) {
    weights_text += fmt::format("{}{}", i == 0 ? "" : ",", weight_[static_cast<std::size_t>(i)]);
  }
  result_.setup =
      fmt::format("{}; capacity={}; threads={}; streams={}; weights={}", options_.to_conf(),
                  size_text(capacity_), threads_ ? 2 : 1, max_created_, weights_text);
  if (run_.trace) {
    run_.trace('S', result_.setup);
    run_.trace('H', std::to_string(result_.header_bytes));
  }
}

// --- the model's own device calls ---------------------------------------------------------------

void Model::on(int thread, const std::function<void()>& call) {
  if (thread == 0 || worker_ == nullptr) {
    call();
  } else {
    worker_->run(call);
  }
}

cudaStream_t Model::handle(int slot) {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  if (s.kind == Slot::Kind::legacy) return src_.one_in(2) ? nullptr : cudaStreamLegacy;
  return s.handle;
}

std::string Model::name(int slot) const {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  switch (s.kind) {
    case Slot::Kind::legacy: return "legacy";
    case Slot::Kind::per_thread: return s.thread == 0 ? "ptd" : "ptd@helper";
    case Slot::Kind::created: break;
  }
  return s.generation == 0 ? fmt::format("s{}", slot) : fmt::format("s{}.{}", slot, s.generation);
}

int thread_of(const Slot& s) { return s.kind == Slot::Kind::per_thread ? s.thread : 0; }

cudaEvent_t Model::record_event(int slot) {
  cudaEvent_t event = nullptr;
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  const cudaStream_t h = handle(slot);
  on(thread_of(s), [&] {
    fake_->event_create(&event);
    fake_->event_record(event, h);
  });
  return event;
}

void Model::wait_event(int slot, cudaEvent_t event) {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  const cudaStream_t h = handle(slot);
  on(thread_of(s), [&] { fake_->stream_wait_event(h, event); });
}

void Model::order_after(int waiter, int awaited) {
  if (waiter == awaited) return;
  cudaEvent_t event = record_event(awaited);
  wait_event(waiter, event);
  fake_->event_destroy(event);
}

void Model::domain_wait(int pool, int slot) {
  if (pool < 0 || pools_[static_cast<std::size_t>(pool)].expired) return;
  for (const auto& [key, event] : pools_[static_cast<std::size_t>(pool)].domain) {
    if (key.first != slot || key.second != slots_[static_cast<std::size_t>(slot)].generation) {
      wait_event(slot, event);
    }
  }
}

void Model::domain_note(int pool, int slot) {
  if (pool < 0 || pools_[static_cast<std::size_t>(pool)].expired) return;
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  // A capturing stream did no work since its capture began (captured work is ordered by the
  // graph's launches): the event recorded before the capture covers it.
  cudaEvent_t event = s.capture >= 0 ? s.before_capture : record_event(slot);
  if (s.capture < 0) events_.push_back(event);
  pools_[static_cast<std::size_t>(pool)].domain[{slot, s.generation}] = event;
}

// While a per-thread stream (a blocking one) captures, CUDA refuses every call naming the legacy
// stream (cudaErrorStreamCaptureImplicit), and a record or wait there invalidates the capture:
// the model's own work stays off the legacy stream meanwhile, and the pool's answers for it are
// judged as refusals.
bool Model::legacy_refused() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) {
    return s.kind == Slot::Kind::per_thread && s.capture >= 0;
  });
}

// Whether the buffer was used on the legacy stream while CUDA refuses it: noting its uses in a
// CapturePool's domain would record an event there.
bool Model::uses_refused_legacy(const Buffer& b) const {
  return legacy_refused() && std::any_of(b.uses.begin(), b.uses.end(), [&](int u) {
           return slots_[static_cast<std::size_t>(u)].kind == Slot::Kind::legacy;
         });
}

// Whether the model may enqueue work on `slot`, record an event or wait there: alive, not
// capturing, and not the legacy stream while CUDA refuses it.
bool Model::idle_now(int slot) const {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  return s.alive && s.capture < 0 && !(s.kind == Slot::Kind::legacy && legacy_refused());
}

bool Model::usable_now(const Buffer& b) const {
  return std::all_of(b.uses.begin(), b.uses.end(), [&](int u) { return idle_now(u); });
}

// Work on `slot` (not capturing) that reads or writes the buffer, ordered after every earlier use.
void Model::launch_ordinary(Buffer& b, int slot, bool write) {
  for (int u : b.uses) order_after(slot, u);
  domain_wait(b.pool, slot);
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::size_t offset = 0;
  std::size_t bytes = b.bytes;
  if (b.bytes > 1 && src_.one_in(4)) {
    offset = src_.below(static_cast<std::uint32_t>(std::min<std::size_t>(b.bytes, 1u << 24)));
    bytes = b.bytes - offset;
  }
  const FakeDevice::Access access{reinterpret_cast<const void*>(b.begin + offset), bytes, write};
  const cudaStream_t h = handle(slot);
  on(thread_of(slots_[static_cast<std::size_t>(slot)]),
     [&] { fake_->launch(h, {access}, [done] { done->store(true); }); });
  b.work.push_back(done);
  if (std::find(b.uses.begin(), b.uses.end(), slot) == b.uses.end()) b.uses.push_back(slot);
  domain_note(b.pool, slot);
}

CaptureStatus Model::status_of(int slot) {
  CaptureStatus status = CaptureStatus::none;
  const cudaStream_t h = handle(slot);
  on(thread_of(slots_[static_cast<std::size_t>(slot)]),
     [&] { fake_->capture_info(h, &status, nullptr); });
  return status;
}

// --- pool calls ---------------------------------------------------------------------------------

template <class F>
void Model::pool_call(F&& call) {
  if (!pending_fault_) {
    call();
    return;
  }
  const Call kind = *pending_fault_;
  pending_fault_.reset();
  fake_->fail_next(kind, 1);
  try {
    call();
  } catch (...) {
    fake_->fail_next(kind, 0);
    throw;
  }
  fake_->fail_next(kind, 0);
}

void Model::note(const std::string& text) {
  if (!line_.empty()) line_ += "; ";
  line_ += text;
}

void Model::fail(std::string kind, std::string what) {
  if (result_.failure) return;
  result_.failure = Failure{std::move(kind), std::move(what), current_step_};
}

// Whether a call CUDA refuses during capture is refused to `thread` now, by a pool capture.
bool Model::restricted_here(int thread) const {
  for (const PoolSlot& p : pools_) {
    if (p.capturing < 0) continue;
    if (p.mode == CaptureMode::global) return true;
    if (p.mode == CaptureMode::thread_local_ && thread == 0) return true;  // captures begin on 0
  }
  return false;
}

bool Model::capture_active() const {
  return std::any_of(pools_.begin(), pools_.end(),
                     [](const PoolSlot& p) { return p.capturing >= 0; });
}

bool Model::limited() const {
  return options_.max_reserved_bytes != 0 || capacity_ < (std::size_t{1} << 30);
}

std::size_t Model::footprint_of(std::size_t bytes) const {
  if (!classes_.is_large(bytes)) return classes_.block_size(classes_.class_of(bytes));
  const std::size_t r = options_.large_rounding;
  return (bytes + r - 1) / r * r;
}

// --- operations ---------------------------------------------------------------------------------

void Model::op_alloc(bool raw) {
  const int slot = pick_slot_for_alloc();
  if (slot < 0) return;
  const int thread = pick_thread(slot);
  std::size_t bytes = pick_size();
  // During a capture, now and then what the CapturePool has left: its edge.
  const int capturing = slots_[static_cast<std::size_t>(slot)].capture;
  if (capturing >= 0 && src_.one_in(4)) {
    const std::size_t left = pools_[static_cast<std::size_t>(capturing)].handle->free_bytes();
    if (left > 0) bytes = left - std::min<std::size_t>(left - 1, src_.below(512));
  }
  alloc_on(slot, thread, bytes, raw, !src_.one_in(4));
}

void Model::alloc_on(int slot, int thread, std::size_t bytes, bool raw, bool write) {
  Slot& s = slots_[static_cast<std::size_t>(slot)];
  const int capturing = s.capture;
  std::error_code error;
  Bytes pooled;
  void* ptr = nullptr;
  const cudaStream_t h = handle(slot);
  try {
    pool_call([&] {
      on(thread, [&] {
        if (raw) {
          ptr = pool_->try_allocate(bytes, h, error);
        } else {
          pooled = Bytes::try_alloc_async(*pool_, bytes, h, error);
        }
      });
    });
  } catch (const std::exception& e) {
    note(fmt::format("{}alloc {} on {}{} threw", raw ? "raw " : "", size_text(bytes), name(slot),
                     thread == 1 ? " (helper)" : ""));
    fail("unexpected exception", fmt::format("a non-throwing allocation threw: {}", e.what()));
    return;
  }
  const std::string what = fmt::format("{}alloc {} on {}{}", raw ? "raw " : "", size_text(bytes),
                                       name(slot), thread == 1 ? " (helper)" : "");
  if (error) {
    note(fmt::format("{} -> {}", what, error_text(error)));
    judge_alloc_error(error, slot, thread, bytes);
    return;
  }
  void* got = raw ? ptr : static_cast<void*>(pooled.data());
  if (got == nullptr) {
    note(what + " -> null");
    fail("empty allocation", "an allocation returned no memory and no error");
    return;
  }
  if (!raw && pooled.byte_size() != bytes) {
    fail("wrong size",
         fmt::format("asked {} bytes, got a buffer of {}", bytes, pooled.byte_size()));
  }
  Buffer b;
  b.id = next_id_++;
  b.pooled = std::move(pooled);
  b.raw = raw ? ptr : nullptr;
  b.begin = address(got);
  b.bytes = bytes;
  b.footprint = footprint_of(bytes);
  b.slot = slot;
  b.thread = thread;
  b.uses = {slot};
  if (capturing >= 0) {
    b.pool = capturing;
    b.private_piece = true;
  }
  note(fmt::format("{} -> b{} @+{:#x}{}", what, b.id, b.begin - 0x7f0000000000,
                   b.private_piece ? " (private)" : ""));
  prune();
  check_pinned(b, capturing);
  if (capturing >= 0) {
    pools_[static_cast<std::size_t>(capturing)].private_ranges.emplace_back(b.begin,
                                                                            b.begin + bytes);
    capture_memory_ = true;
  }
  largest_request_ = std::max(largest_request_, b.footprint);
  buffers_.push_back(std::move(b));
  note_allocation(bytes);
  if (write) {
    Buffer& nb = buffers_.back();
    if (capturing >= 0) {
      const FakeDevice::Access access{reinterpret_cast<const void*>(nb.begin), nb.bytes, true};
      on(thread, [&] { fake_->launch(h, {access}); });
      note("captured write");
    } else {
      launch_ordinary(nb, slot, true);
      note("write");
    }
  }
}

void Model::judge_alloc_error(const std::error_code& error, int slot, int thread,
                              std::size_t bytes) {
  if (fault_in_op_) return;  // an injected fault may surface as any error
  if (error.category() != streampool::category()) {
    fail("unexpected error",
         "an allocation failed with a code of another category: " + error_text(error));
    return;
  }
  const auto code = static_cast<Errc>(error.value());
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  if (s.kind == Slot::Kind::legacy && legacy_refused()) {
    // CUDA's refusal of the status query, passed on (Failure::of: device_error).
    if (code != Errc::device_error) {
      fail("unexpected error", "an allocation on the legacy stream while a per-thread stream "
                               "captures failed with " + error_text(error));
    }
    return;
  }
  if (s.capture >= 0) {
    const PoolSlot& p = pools_[static_cast<std::size_t>(s.capture)];
    if (p.sealed) {
      if (code != Errc::capture_pool_sealed) {
        fail("unexpected error", "an allocation from a sealed CapturePool failed with " +
                                     error_text(error) + " instead of capture_pool_sealed");
      }
      return;
    }
    if (code == Errc::capture_pool_exhausted) return;
    fail("unexpected error",
         fmt::format("an allocation during a {} capture with an unsealed CapturePool failed "
                     "with {}",
                     mode_name(p.mode), error_text(error)));
    return;
  }
  if (code == Errc::capture_forbids_call && restricted_here(thread)) return;
  if (code == Errc::out_of_memory && (limited() || restricted_here(thread))) {
    if (capture_active()) return;  // the ladder may not synchronize: anything may be stuck
    // With the limits and what is live, pinned and held, could this allocation have failed?
    // Every live or pinned thing may pin a whole segment; everything else can be reclaimed.
    const std::size_t unit =
        std::max({options_.segment_bytes, largest_request_, footprint_of(bytes)});
    std::size_t pinned = 0;
    std::size_t things = buffers_.size() + held_.size();
    for (const PoolSlot& p : pools_) {
      if (p.expired) continue;
      if (auto alive = p.weak.lock()) pinned += alive->reserved_bytes();
      things += 1;
    }
    const std::size_t limit = std::min(
        options_.max_reserved_bytes != 0 ? options_.max_reserved_bytes : capacity_, capacity_);
    const std::size_t need = (things + 2) * unit + pinned;
    if (need <= limit && std::none_of(buffers_.begin(), buffers_.end(),
                                      [](const Buffer& b) { return b.private_piece; })) {
      fail("spurious out_of_memory",
           fmt::format("{} bytes refused with {} live or held buffers: at most {} bytes could "
                       "be pinned, under the limit of {}",
                       bytes, things, need, limit));
    }
    return;
  }
  fail("unexpected error",
       fmt::format("an allocation on {} failed with {}", name(slot), error_text(error)));
}

void Model::op_drop() {
  const int i = pick(static_cast<int>(buffers_.size()), [&](int k) {
    const Buffer& b = buffers_[static_cast<std::size_t>(k)];
    // A buffer of a CapturePool's domain: its drop notes its uses with events on their streams
    // (domain_note), which the legacy stream cannot take while CUDA refuses it.
    if (b.pool >= 0 && uses_refused_legacy(b)) return false;
    return !b.is_raw() || slots_[static_cast<std::size_t>(b.slot)].capture < 0 ||
           allowed("free_captured");
  });
  if (i < 0) return;
  const Buffer& b = buffers_[static_cast<std::size_t>(i)];
  drop(static_cast<std::size_t>(i), pick_thread(b.slot));
}

// Drops buffer `index` on its own stream (a PooledBuffer's reset, or deallocate on its stream).
void Model::drop(std::size_t index, int thread) {
  Buffer b = std::move(buffers_[index]);
  buffers_.erase(buffers_.begin() + static_cast<std::ptrdiff_t>(index));
  const Slot& home = slots_[static_cast<std::size_t>(b.slot)];
  if (home.kind == Slot::Kind::per_thread) thread = home.thread;
  // The buffer's domain learns of its last uses: the graphs may use its memory again.
  if (b.pool >= 0) {
    for (int u : b.uses) domain_note(b.pool, u);
  }
  const bool adopted = home.capture >= 0 && !b.private_piece;
  const cudaStream_t h = handle(b.slot);
  pool_call([&] {
    on(thread, [&] {
      if (b.is_raw()) {
        pool_->deallocate(b.raw, b.bytes, h);
      } else {
        b.pooled.reset();
      }
    });
  });
  note(fmt::format("drop b{}{}{}", b.id, thread == 1 ? " (helper)" : "",
                   adopted ? " (adopted)" : ""));
  if (adopted) {
    Held held;
    held.id = b.id;
    held.begin = b.begin;
    held.bytes = b.bytes;
    held.footprint = b.footprint;
    held.pool = home.capture;
    held.live = false;
    held.uses = b.uses;
    held_.push_back(held);
  } else if (!all_done(b.work)) {
    dropped_.push_back({b.footprint, b.work});
  }
}

void Model::op_free_elsewhere() {
  const int i = pick(static_cast<int>(buffers_.size()), [&](int k) {
    const Buffer& b = buffers_[static_cast<std::size_t>(k)];
    return b.is_raw() && usable_now(b) && (!b.private_piece || allowed("free_private_elsewhere"));
  });
  if (i < 0) return;
  Buffer& b = buffers_[static_cast<std::size_t>(i)];
  const int to = pick(static_cast<int>(slots_.size()), [&](int k) {
    return k != b.slot && idle_now(k);
  });
  if (to < 0) return;
  // The caller's side of cudaFreeAsync on another stream: that stream follows every use (and,
  // often, uses the memory last: freed on the stream of last use).
  if (src_.one_in(2)) {
    launch_ordinary(b, to, src_.one_in(2));
  } else {
    for (int u : b.uses) order_after(to, u);
    domain_wait(b.pool, to);
    if (b.pool >= 0) domain_note(b.pool, to);
  }
  const Buffer gone = std::move(b);
  buffers_.erase(buffers_.begin() + i);
  const cudaStream_t h = handle(to);
  const int thread = thread_of(slots_[static_cast<std::size_t>(to)]);
  pool_call([&] { on(thread, [&] { pool_->deallocate(gone.raw, gone.bytes, h); }); });
  note(fmt::format("free b{} (of {}) on {}", gone.id, name(gone.slot), name(to)));
  if (!all_done(gone.work)) dropped_.push_back({gone.footprint, gone.work});
}

void Model::op_record_stream() {
  const int i = pick(static_cast<int>(buffers_.size()),
                     [&](int k) { return !buffers_[static_cast<std::size_t>(k)].is_raw(); });
  if (i < 0) return;
  Buffer& b = buffers_[static_cast<std::size_t>(i)];
  const Slot& home = slots_[static_cast<std::size_t>(b.slot)];
  if (home.capture >= 0) {
    if (!allowed("record_captured")) return;
    // Naming the capturing stream itself, for a buffer of its own: legal, and needs no order.
    const cudaStream_t h = handle(b.slot);
    try {
      pool_call([&] { on(thread_of(home), [&] { b.pooled.record_stream(h); }); });
      note(fmt::format("record_stream b{} on its capturing stream {}", b.id, name(b.slot)));
    } catch (const std::exception& e) {
      note(fmt::format("record_stream b{} on its capturing stream {} threw: {}", b.id, name(b.slot),
                       e.what()));
    }
    return;
  }
  if (!usable_now(b)) return;
  const int other = pick(static_cast<int>(slots_.size()), [&](int k) {
    return k != b.slot && idle_now(k);
  });
  if (other < 0) return;
  const bool record_first = src_.one_in(2);
  const cudaStream_t h = handle(other);
  const int thread = thread_of(slots_[static_cast<std::size_t>(other)]);
  // Recorded there before: a record that fails now leaves that one standing.
  const bool known = std::find(b.uses.begin(), b.uses.end(), other) != b.uses.end();
  bool recorded = true;
  const auto record = [&] {
    try {
      pool_call([&] { on(thread, [&] { b.pooled.record_stream(h); }); });
    } catch (const std::exception& e) {
      recorded = false;
      if (!fault_in_op_)
        fail("unexpected exception", fmt::format("record_stream threw: {}", e.what()));
    }
    if (std::find(b.uses.begin(), b.uses.end(), other) == b.uses.end()) b.uses.push_back(other);
  };
  for (int u : b.uses) order_after(other, u);
  if (record_first) record();
  launch_ordinary(b, other, src_.one_in(2));
  if (!record_first) record();
  // Not recorded (a fault): the pool cannot know of the other stream's work, so the buffer's own
  // stream waits for it, its drop there then follows that work, and the other stream uses the
  // buffer no more, unless an earlier record named it (the pool still counts that use, and the
  // stream may not be destroyed before the drop).
  if (!recorded) {
    order_after(b.slot, other);
    if (!known) std::erase(b.uses, other);
  }
  note(fmt::format("record_stream b{} on {}, used there{}", b.id, name(other),
                   recorded ? "" : " (not recorded: its stream waits for it)"));
}

void Model::op_launch() {
  const int i = pick(static_cast<int>(buffers_.size()), [](int) { return true; });
  if (i < 0) return;
  Buffer& b = buffers_[static_cast<std::size_t>(i)];
  const int slot = b.uses[src_.below(static_cast<std::uint32_t>(b.uses.size()))];
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  const bool write = !src_.one_in(3);
  if (s.capture >= 0) {
    // Captured work: only on the buffer's own stream, only memory the graph may keep using (the
    // pool's own private pieces, or a PooledBuffer of the stream, which joins the pool's domain).
    const int p = s.capture;
    const bool own_piece = b.private_piece && b.pool == p;
    const bool shared = !b.private_piece && !b.is_raw() && (b.pool < 0 || b.pool == p);
    if (slot != b.slot || !(own_piece || shared)) return;
    if (shared && b.pool < 0 && uses_refused_legacy(b)) return;
    if (shared && b.pool < 0) {
      b.pool = p;
      for (int u : b.uses) domain_note(p, u);
    }
    const FakeDevice::Access access{reinterpret_cast<const void*>(b.begin), b.bytes, write};
    const cudaStream_t h = handle(slot);
    on(thread_of(s), [&] { fake_->launch(h, {access}); });
    note(fmt::format("captured {} of b{} on {}", write ? "write" : "read", b.id, name(slot)));
    return;
  }
  if (!usable_now(b)) return;
  launch_ordinary(b, slot, write);
  note(fmt::format("{} b{} on {}", write ? "write" : "read", b.id, name(slot)));
}

void Model::op_complete() {
  const int slot = pick(static_cast<int>(slots_.size()),
                        [&](int k) { return slots_[static_cast<std::size_t>(k)].alive; });
  if (slot < 0) return;
  const cudaStream_t h = handle(slot);
  on(thread_of(slots_[static_cast<std::size_t>(slot)]), [&] { fake_->complete(h); });
  note("complete " + name(slot));
}

void Model::op_complete_all() {
  fake_->complete_all();
  note("complete all");
  if (!retired_.empty()) {
    pool_call([&] { retired_.clear(); });
    note("drop the CapturePools of destroyed framework graphs");
  }
}

void Model::op_release_stream() {
  const int slot = pick(static_cast<int>(slots_.size()),
                        [&](int k) { return slots_[static_cast<std::size_t>(k)].alive; });
  if (slot < 0) return;
  release_stream(slot, pick_thread(slot));
}

void Model::release_stream(int slot, int thread) {
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  if (s.capture >= 0 && !allowed("release_captured")) return;
  if (capture_active() && !allowed("release_in_capture")) return;
  if (live_on(slot) && !allowed("release_live")) return;
  const cudaStream_t h = handle(slot);
  try {
    pool_call([&] { on(thread, [&] { pool_->release_stream(h); }); });
    note(fmt::format("release_stream {}{}", name(slot), thread == 1 ? " (helper)" : ""));
  } catch (const std::exception& e) {
    note(fmt::format("release_stream {} threw: {}", name(slot), e.what()));
    // The contract says nothing of a capturing stream; a fault may surface here.
    const bool refused = s.kind == Slot::Kind::legacy && legacy_refused();
    if (!fault_in_op_ && s.capture < 0 && !refused) {
      fail("unexpected exception", fmt::format("release_stream threw: {}", e.what()));
    }
  }
}

void Model::op_trim() {
  if (capture_active() && !allowed("trim_in_capture")) return;
  const std::size_t keep = src_.one_in(2) ? 0 : src_.below(64) * MiB;
  const int thread = threads_ && src_.one_in(3) ? 1 : 0;
  try {
    pool_call([&] { on(thread, [&] { pool_->trim(keep); }); });
    note(fmt::format("trim {}{}", size_text(keep), thread == 1 ? " (helper)" : ""));
  } catch (const std::exception& e) {
    note(fmt::format("trim threw: {}", e.what()));
    if (!fault_in_op_) fail("unexpected exception", fmt::format("trim threw: {}", e.what()));
  }
}

void Model::op_stream_create() {
  const int slot = pick(static_cast<int>(slots_.size()), [&](int k) {
    const Slot& s = slots_[static_cast<std::size_t>(k)];
    return s.kind == Slot::Kind::created && !s.alive;
  });
  if (slot < 0) return;
  Slot& s = slots_[static_cast<std::size_t>(slot)];
  s.handle = fake_->create_stream();
  s.alive = true;
  ++s.generation;
  note(fmt::format("create {} (handle {})", name(slot), static_cast<const void*>(s.handle)));
}

void Model::op_stream_destroy() {
  const int slot = pick(static_cast<int>(slots_.size()), [&](int k) {
    const Slot& s = slots_[static_cast<std::size_t>(k)];
    if (s.kind != Slot::Kind::created || !s.alive || s.capture >= 0) return false;
    // Buffers a CapturePool holds are alive: their streams must stay.
    return std::none_of(held_.begin(), held_.end(), [&](const Held& h) {
      return h.live && std::find(h.uses.begin(), h.uses.end(), k) != h.uses.end();
    });
  });
  if (slot < 0) return;
  // Under StreamChecks::none, release_stream first: where the model may not call it now, the
  // stream stays.
  const bool release = options_.stream_checks == StreamChecks::none || src_.one_in(2);
  if (release && ((capture_active() && !allowed("release_in_capture")) ||
                  (live_on(slot) && !allowed("release_live")))) {
    return;
  }
  // The contract: every buffer used on the stream is dropped first.
  for (std::size_t i = buffers_.size(); i-- > 0;) {
    const Buffer& b = buffers_[i];
    if (std::find(b.uses.begin(), b.uses.end(), slot) == b.uses.end()) continue;
    if (b.slot != slot && slots_[static_cast<std::size_t>(b.slot)].capture >= 0 &&
        !b.private_piece) {
      // Its own stream is capturing: dropping it there would hand it to the graph. Keep the
      // stream instead.
      note(fmt::format("keep {}: b{} is needed by a capture", name(slot), b.id));
      return;
    }
    if (b.pool >= 0 && uses_refused_legacy(b)) return;  // its drop could not be noted (op_drop)
  }
  for (std::size_t i = buffers_.size(); i-- > 0;) {
    const Buffer& b = buffers_[i];
    if (std::find(b.uses.begin(), b.uses.end(), slot) == b.uses.end()) continue;
    drop(i, pick_thread(b.slot));
  }
  if (release) release_stream(slot, 0);
  Slot& s = slots_[static_cast<std::size_t>(slot)];
  fake_->destroy_stream(s.handle);
  s.alive = false;
  note("destroy " + name(slot));
}

int Model::new_capture_pool() {
  PoolSlot p;
  p.handle = std::make_shared<CapturePool>(*pool_);
  p.weak = p.handle;
  pools_.push_back(std::move(p));
  const int index = static_cast<int>(pools_.size()) - 1;
  note(fmt::format("new CapturePool p{}", index));
  if (src_.one_in(2)) {
    const std::size_t bytes = 1 + src_.below(static_cast<std::uint32_t>(4 * MiB));
    try {
      pool_call([&] { pools_.back().handle->reserve(bytes); });
      note(fmt::format("p{} reserve {}", index, size_text(bytes)));
      capture_memory_ = true;
    } catch (const streampool::Error& e) {
      note(fmt::format("p{} reserve {} threw: {}", index, size_text(bytes), e.what()));
      const bool expected = e.errc() == Errc::out_of_memory
                                ? limited() || restricted_here(0)
                                : e.errc() == Errc::capture_forbids_call && restricted_here(0);
      if (!fault_in_op_ && !expected) {
        fail("unexpected exception", fmt::format("CapturePool::reserve threw: {}", e.what()));
      }
    }
  }
  if (src_.one_in(4)) {
    pools_.back().handle->seal();
    pools_.back().sealed = true;
    note(fmt::format("p{} sealed", index));
  }
  return index;
}

void Model::op_capture_begin() {
  // The variant "join" decodes here, and only while a capture is under way, so that inputs found
  // without it decode as they did.
  if (capture_active() && allowed("join") && src_.one_in(2)) {
    join_capture();
    return;
  }
  const int slot = pick(static_cast<int>(slots_.size()), [&](int k) {
    const Slot& s = slots_[static_cast<std::size_t>(k)];
    const bool capturable =
        s.kind == Slot::Kind::created || (s.kind == Slot::Kind::per_thread && s.thread == 0);
    return capturable && s.alive && s.capture < 0;
  });
  if (slot < 0) return;
  int p = pick(static_cast<int>(pools_.size()), [&](int k) {
    const PoolSlot& pool = pools_[static_cast<std::size_t>(k)];
    return pool.handle != nullptr && pool.capturing < 0;
  });
  if (p < 0 || src_.one_in(3)) p = new_capture_pool();
  if (failed()) return;
  const CaptureMode modes[] = {CaptureMode::global, CaptureMode::thread_local_,
                               CaptureMode::relaxed};
  const CaptureMode mode = modes[src_.below(3)];
  // The variant "framework" decodes here, so that inputs found without it decode as they did.
  const bool framework = allowed("framework") && src_.one_in(3);
  PoolSlot& pool = pools_[static_cast<std::size_t>(p)];
  // What the stream did before the capture: the graph's replays follow it.
  domain_note(p, slot);
  slots_[static_cast<std::size_t>(slot)].before_capture =
      pool.domain[{slot, slots_[static_cast<std::size_t>(slot)].generation}];
  const cudaStream_t h = handle(slot);
  try {
    pool_call([&] {
      if (!framework) {
        streampool::begin_capture_with_pool(pool.handle, h, mode);
        return;
      }
      streampool::prepare_capture_with_pool(pool.handle, h, mode);
      const cudaError_t begun = fake_->begin_capture(h, mode);
      if (begun != cudaSuccess) {
        streampool::detach_capture_with_pool(pool.handle);  // the framework gives up
        throw streampool::Error(begun, "the framework's cudaStreamBeginCapture");
      }
      if (!streampool::attach_capture_with_pool(pool.handle)) {
        fail("framework capture", "attach found the stream not capturing after its begin");
      }
    });
  } catch (const std::exception& e) {
    note(fmt::format("begin {} capture of {} with p{}{} threw: {}", mode_name(mode), name(slot),
                     p, framework ? " (framework)" : "", e.what()));
    if (!fault_in_op_)
      fail("unexpected exception", fmt::format("begin_capture_with_pool threw: {}", e.what()));
    return;
  }
  pool.capturing = slot;
  pool.mode = mode;
  pool.framework = framework;
  slots_[static_cast<std::size_t>(slot)].capture = p;
  capture_memory_ = true;  // what it adopts counts as live as long as it lives
  note(fmt::format("begin {} capture of {} with p{}{}", mode_name(mode), name(slot), p,
                   framework ? " (framework)" : ""));
}

// A created stream joins a capture under way: it waits on an event recorded on the capture's
// stream, and is a member of the capture until the capture ends. Its work meanwhile is the
// graph's, its allocations the CapturePool's, its drops adopted. Per-thread streams stay out: the
// gate cannot see another thread's, and a joined one cannot allocate from the CapturePool
// (capture_pool.hpp).
void Model::join_capture() {
  const int p = pick(static_cast<int>(pools_.size()),
                     [&](int k) { return pools_[static_cast<std::size_t>(k)].capturing >= 0; });
  const int slot = pick(static_cast<int>(slots_.size()), [&](int k) {
    const Slot& s = slots_[static_cast<std::size_t>(k)];
    return s.kind == Slot::Kind::created && s.alive && s.capture < 0;
  });
  if (p < 0 || slot < 0) return;
  // What the stream did before it joined: the graph's replays follow it, as the work before a
  // capture began.
  domain_note(p, slot);
  Slot& s = slots_[static_cast<std::size_t>(slot)];
  s.before_capture = pools_[static_cast<std::size_t>(p)].domain[{slot, s.generation}];
  order_after(slot, pools_[static_cast<std::size_t>(p)].capturing);
  s.capture = p;
  s.joined = true;
  note(fmt::format("{} joins the capture of {} with p{}", name(slot),
                   name(pools_[static_cast<std::size_t>(p)].capturing), p));
}

// Just before the capture of `pool` ends, however it ends: its stream waits on each stream that
// joined it (CUDA ends a capture only then: cudaErrorStreamCaptureUnjoined otherwise), and the
// end takes every member out of capture.
void Model::join_back_all(int pool) {
  const int origin = pools_[static_cast<std::size_t>(pool)].capturing;
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    Slot& s = slots_[k];
    if (!s.joined || s.capture != pool) continue;
    order_after(origin, static_cast<int>(k));
    note(fmt::format("{} joined back", name(static_cast<int>(k))));
    s.capture = -1;
    s.joined = false;
  }
}

void Model::op_capture_end() {
  const int p = pick(static_cast<int>(pools_.size()),
                     [&](int k) { return pools_[static_cast<std::size_t>(k)].capturing >= 0; });
  if (p < 0) return;
  const PoolSlot& pool = pools_[static_cast<std::size_t>(p)];
  if (src_.one_in(6) && pool.handle.use_count() == 1) {
    // Abandoned: the last reference goes mid-capture, which ends it and discards the graph.
    join_back_all(p);
    const int slot = pool.capturing;
    for (Buffer& b : buffers_) {
      if (b.pool == p && !b.private_piece) b.pool = -1;
    }
    pools_[static_cast<std::size_t>(p)].capturing = -1;
    slots_[static_cast<std::size_t>(slot)].capture = -1;
    pool_call([&] { pools_[static_cast<std::size_t>(p)].handle.reset(); });
    note(fmt::format("abandon the capture of {}: drop p{}", name(slot), p));
    return;
  }
  // A relaxed capture may end on another thread (not a per-thread stream's: that names another
  // stream there).
  const bool elsewhere =
      pool.mode == CaptureMode::relaxed && threads_ &&
      slots_[static_cast<std::size_t>(pool.capturing)].kind == Slot::Kind::created;
  end_capture(p, elsewhere && src_.one_in(3) ? 1 : 0);
}

void Model::end_capture(int p, int thread) {
  join_back_all(p);
  PoolSlot& pool = pools_[static_cast<std::size_t>(p)];
  const int slot = pool.capturing;
  const cudaStream_t h = handle(slot);
  CapturedGraph graph;
  cudaGraphExec_t exec = nullptr;  // a framework's
  bool ended = true;
  if (pool.framework) {
    ended = end_as_framework(p, thread, exec);
  } else {
    try {
      pool_call(
          [&] { on(thread, [&] { graph = streampool::end_capture_with_pool(h, pool.handle); }); });
      note(fmt::format("end the capture of {} with p{}{}", name(slot), p,
                       thread == 1 ? " (helper)" : ""));
    } catch (const std::exception& e) {
      ended = false;
      note(fmt::format("end the capture of {} threw: {}", name(slot), e.what()));
      if (!fault_in_op_)
        fail("unexpected exception", fmt::format("end_capture_with_pool threw: {}", e.what()));
    }
  }
  pool.capturing = -1;
  pool.framework = false;
  slots_[static_cast<std::size_t>(slot)].capture = -1;
  // Shared buffers the capture touched: the graph keeps using them, so the pool keeps them.
  for (std::size_t i = buffers_.size(); i-- > 0;) {
    Buffer& b = buffers_[i];
    if (b.pool != p || b.private_piece) continue;
    if (!ended) {
      b.pool = -1;
      continue;
    }
    Held held;
    held.id = b.id;
    held.begin = b.begin;
    held.bytes = b.bytes;
    held.footprint = b.footprint;
    held.pool = p;
    held.live = true;
    held.uses = b.uses;
    pool.handle->record_buffer(std::move(b.pooled));
    held_.push_back(held);
    note(fmt::format("p{} keeps b{}", p, b.id));
    buffers_.erase(buffers_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (ended) {
    GraphSlot g;
    g.id = next_id_++;
    g.graph = std::move(graph);
    g.exec = exec;
    if (exec != nullptr) g.keep = pool.handle;
    g.pool = p;
    graphs_.push_back(std::move(g));
    note(fmt::format("-> g{}{}", graphs_.back().id, exec != nullptr ? " (the framework's)" : ""));
  }
}

// A framework's end: its own cudaStreamEndCapture (tried again where it fails, as
// end_capture_with_pool does), then detach; or, at times, detach first (a framework giving up
// on an error path), with a trim on the helper thread before the end, which the capture must
// survive. True with `exec` the instantiated graph.
bool Model::end_as_framework(int p, int thread, cudaGraphExec_t& exec) {
  PoolSlot& pool = pools_[static_cast<std::size_t>(p)];
  const int slot = pool.capturing;
  const cudaStream_t h = handle(slot);
  const bool early = src_.one_in(3);
  // (On the main thread only: the helper runs the trim. Not once the MemoryPool is gone.)
  const bool trim_between =
      early && threads_ && thread == 0 && pool_ != nullptr && src_.one_in(2);
  cudaError_t ended = cudaErrorUnknown;
  cudaGraph_t graph = nullptr;
  pool_call([&] {
    on(thread, [&] {
      if (early) streampool::detach_capture_with_pool(pool.handle);
      if (trim_between) {
        try {
          on(1, [&] { pool_->trim(0); });
        } catch (const std::exception& e) {
          note(fmt::format("trim threw: {}", e.what()));
        }
      }
      for (int attempt = 0; attempt < 4 && ended != cudaSuccess; ++attempt) {
        ended = fake_->end_capture(h, &graph);
        if (ended != cudaSuccess && status_of(slot) == CaptureStatus::none) break;
      }
      if (!early) streampool::detach_capture_with_pool(pool.handle);
    });
  });
  note(fmt::format("end the capture of {} as a framework{}{}{}", name(slot),
                   early ? ", detached before" : "", trim_between ? ", a trim between" : "",
                   thread == 1 ? " (helper)" : ""));
  if (ended != cudaSuccess) {
    note(fmt::format("its end: error {}", static_cast<int>(ended)));
    // An invalidated capture is the pool's doing even with a fault injected (check_captures fails
    // on one after any operation; the framework's own calls that a fault may meet leave the
    // capture as it was): only the other errors may be the fault's.
    if (!fault_in_op_ || ended == cudaErrorStreamCaptureInvalidated) {
      fail(ended == cudaErrorStreamCaptureInvalidated ? "capture invalidated"
                                                      : "unexpected exception",
           fmt::format("the framework's cudaStreamEndCapture failed: error {}",
                       static_cast<int>(ended)));
    }
    if (graph != nullptr) fake_->graph_destroy(graph);
    return false;
  }
  const cudaError_t made = fake_->graph_instantiate(&exec, graph);
  fake_->graph_destroy(graph);
  if (made != cudaSuccess) {
    exec = nullptr;
    if (!fault_in_op_) fail("unexpected exception", "cudaGraphInstantiate failed");
    return false;
  }
  return true;
}

void Model::op_capture_misuse() {
  switch (src_.below(3)) {
    case 0: {
      // The legacy stream cannot be captured: refused, and nothing changes.
      int p = pick(static_cast<int>(pools_.size()), [&](int k) {
        return pools_[static_cast<std::size_t>(k)].handle != nullptr &&
               pools_[static_cast<std::size_t>(k)].capturing < 0;
      });
      if (p < 0) return;
      try {
        pool_call([&] {
          streampool::begin_capture_with_pool(pools_[static_cast<std::size_t>(p)].handle,
                                              handle(0));
        });
        fail("misuse accepted", "begin_capture_with_pool on the legacy stream did not throw");
      } catch (const streampool::Error&) {
        note(fmt::format("begin a capture of legacy with p{}: refused", p));
      }
      return;
    }
    case 1: {
      // A pool already capturing, on another stream: capture_mismatch.
      const int p = pick(static_cast<int>(pools_.size()),
                         [&](int k) { return pools_[static_cast<std::size_t>(k)].capturing >= 0; });
      const int slot = pick(static_cast<int>(slots_.size()), [&](int k) {
        const Slot& s = slots_[static_cast<std::size_t>(k)];
        return s.kind == Slot::Kind::created && s.alive && s.capture < 0;
      });
      if (p < 0 || slot < 0 || pools_[static_cast<std::size_t>(p)].handle == nullptr) return;
      try {
        pool_call([&] {
          streampool::begin_capture_with_pool(pools_[static_cast<std::size_t>(p)].handle,
                                              handle(slot));
        });
        fail("misuse accepted",
             "begin_capture_with_pool with a pool already capturing did not throw");
        slots_[static_cast<std::size_t>(slot)].capture = p;  // as far as the model can tell
      } catch (const streampool::Error& e) {
        note(fmt::format("begin a capture of {} with p{}, which captures already: {}", name(slot),
                         p, e.what()));
      }
      return;
    }
    default: {
      // A captured stream, begun again or ended with another pool: capture_mismatch.
      const int p = pick(static_cast<int>(pools_.size()),
                         [&](int k) { return pools_[static_cast<std::size_t>(k)].capturing >= 0; });
      if (p < 0) return;
      const int slot = pools_[static_cast<std::size_t>(p)].capturing;
      const int other = new_capture_pool();
      const bool begin = src_.one_in(2);
      try {
        pool_call([&] {
          if (begin) {
            streampool::begin_capture_with_pool(pools_[static_cast<std::size_t>(other)].handle,
                                                handle(slot));
          } else {
            streampool::end_capture_with_pool(handle(slot),
                                              pools_[static_cast<std::size_t>(other)].handle);
          }
        });
        fail("misuse accepted", "a captured stream was begun again, or ended with another pool");
      } catch (const streampool::Error& e) {
        note(fmt::format("{} {} with p{}: {}",
                         begin ? "begin a capture of captured" : "end the capture of", name(slot),
                         other, e.what()));
      }
      return;
    }
  }
}

void Model::op_graph_launch() {
  const int g = pick(static_cast<int>(graphs_.size()), [](int) { return true; });
  if (g < 0) return;
  const int slot = pick(static_cast<int>(slots_.size()), [&](int k) { return idle_now(k); });
  if (slot < 0) return;
  GraphSlot& graph = graphs_[static_cast<std::size_t>(g)];
  domain_wait(graph.pool, slot);
  const cudaStream_t h = handle(slot);
  const bool upload = src_.one_in(5);
  try {
    pool_call([&] {
      on(thread_of(slots_[static_cast<std::size_t>(slot)]), [&] {
        if (graph.exec != nullptr) {
          fake_->graph_launch(graph.exec, h);
        } else if (upload) {
          graph.graph.upload(h);
        } else {
          graph.graph.launch(h);
        }
      });
    });
    note(fmt::format("{} g{}{} on {}", upload && graph.exec == nullptr ? "upload" : "launch",
                     graph.id, graph.exec != nullptr ? " (raw)" : "", name(slot)));
  } catch (const std::exception& e) {
    note(fmt::format("launch g{} threw: {}", graph.id, e.what()));
    if (!fault_in_op_)
      fail("unexpected exception", fmt::format("CapturedGraph::launch threw: {}", e.what()));
  }
  domain_note(graph.pool, slot);
}

void Model::op_graph_destroy() {
  const int g = pick(static_cast<int>(graphs_.size()), [](int) { return true; });
  if (g < 0) return;
  GraphSlot& graph = graphs_[static_cast<std::size_t>(g)];
  if (graph.exec == nullptr && graph.keep == nullptr && src_.one_in(3)) {
    graph.exec = graph.graph.release();
    note(fmt::format("release g{}: the model owns its executable graph", graph.id));
    return;
  }
  const int id = graph.id;
  bool destroyed = true;
  pool_call([&] {
    if (graph.exec != nullptr) {
      // The model's own handle: a destroy that CUDA refuses leaves it the model's, to destroy
      // again later, as a careful program would (the pool cannot know of it).
      destroyed = fake_->graph_exec_destroy(graph.exec) == cudaSuccess;
    } else {
      graph.graph = CapturedGraph();
    }
  });
  if (!destroyed) {
    note(fmt::format("destroy g{} refused: the model keeps it", id));
    return;
  }
  if (graph.keep != nullptr) retired_.push_back(std::move(graph.keep));  // until complete all
  graphs_.erase(graphs_.begin() + g);
  note(fmt::format("destroy g{}", id));
}

void Model::op_capture_pool() {
  switch (src_.below(5)) {
    case 0: new_capture_pool(); return;
    case 1: {  // drop the model's reference (not mid-capture: end_capture needs it)
      const int p = pick(static_cast<int>(pools_.size()), [&](int k) {
        return pools_[static_cast<std::size_t>(k)].handle != nullptr &&
               pools_[static_cast<std::size_t>(k)].capturing < 0;
      });
      if (p < 0) return;
      pool_call([&] { pools_[static_cast<std::size_t>(p)].handle.reset(); });
      note(fmt::format("drop p{}", p));
      return;
    }
    case 2: {  // seal or unseal, at any time
      const int p = pick(static_cast<int>(pools_.size()), [&](int k) {
        return pools_[static_cast<std::size_t>(k)].handle != nullptr;
      });
      if (p < 0) return;
      PoolSlot& pool = pools_[static_cast<std::size_t>(p)];
      pool.sealed = !pool.sealed;
      if (pool.sealed)
        pool.handle->seal();
      else
        pool.handle->unseal();
      note(fmt::format("p{} {}", p, pool.sealed ? "sealed" : "unsealed"));
      return;
    }
    case 3: {  // reserve more, outside its capture
      const int p = pick(static_cast<int>(pools_.size()), [&](int k) {
        return pools_[static_cast<std::size_t>(k)].handle != nullptr &&
               pools_[static_cast<std::size_t>(k)].capturing < 0;
      });
      if (p < 0) return;
      const std::size_t bytes = 1 + src_.below(static_cast<std::uint32_t>(3 * MiB));
      try {
        pool_call([&] { pools_[static_cast<std::size_t>(p)].handle->reserve(bytes); });
        capture_memory_ = true;
        note(fmt::format("p{} reserve {}", p, size_text(bytes)));
      } catch (const streampool::Error& e) {
        note(fmt::format("p{} reserve {} threw: {}", p, size_text(bytes), e.what()));
        const bool expected = (e.errc() == Errc::out_of_memory && limited()) ||
                              (e.errc() == Errc::capture_forbids_call && restricted_here(0));
        if (!fault_in_op_ && !expected) {
          fail("unexpected exception", fmt::format("CapturePool::reserve threw: {}", e.what()));
        }
      }
      return;
    }
    default: {  // clear_buffers, once no graph of the pool can replay into them
      const int p = pick(static_cast<int>(pools_.size()), [&](int k) {
        const PoolSlot& pool = pools_[static_cast<std::size_t>(k)];
        if (pool.handle == nullptr || pool.capturing >= 0) return false;
        if (std::any_of(graphs_.begin(), graphs_.end(),
                        [&](const GraphSlot& g) { return g.pool == k; })) {
          return false;
        }
        // The drops are ordered after the replays on each stream that used the buffers: none may
        // be capturing, nor be the legacy stream while CUDA refuses it (the model's own waits
        // there would invalidate the capture: seed 5508, 2026-12-06).
        return std::none_of(held_.begin(), held_.end(), [&](const Held& h) {
          return h.pool == k && h.live && std::any_of(h.uses.begin(), h.uses.end(), [&](int u) {
                   return !idle_now(u) && slots_[static_cast<std::size_t>(u)].alive;
                 });
        });
      });
      if (p < 0) return;
      // Each drop follows the replays: order the buffers' streams after the pool's last uses.
      for (Held& h : held_) {
        if (h.pool == p && h.live) {
          for (int u : h.uses) domain_wait(p, u);
        }
      }
      pool_call([&] { pools_[static_cast<std::size_t>(p)].handle->clear_buffers(); });
      std::erase_if(held_, [&](const Held& h) { return h.pool == p && h.live; });
      note(fmt::format("p{} clear_buffers", p));
      return;
    }
  }
}

void Model::op_raw_capture() {
  // A capture begun without a pool: an allocation on it must fail with capture_without_pool and,
  // under full checks, leave the capture untouched. (Under none, capturing without a pool is
  // outside the contract; under identity the capture is lost, as documented.)
  if (options_.stream_checks == StreamChecks::none || capture_active()) return;
  const int slot = pick(static_cast<int>(slots_.size()), [&](int k) {
    const Slot& s = slots_[static_cast<std::size_t>(k)];
    return s.kind == Slot::Kind::created && s.alive;
  });
  if (slot < 0) return;
  const CaptureMode modes[] = {CaptureMode::global, CaptureMode::thread_local_,
                               CaptureMode::relaxed};
  const CaptureMode mode = modes[src_.below(3)];
  const cudaStream_t h = handle(slot);
  fake_->begin_capture(h, mode);
  const std::size_t bytes = pick_size();
  std::error_code error;
  Bytes refused;
  pool_call([&] { refused = Bytes::try_alloc_async(*pool_, bytes, h, error); });
  const CaptureStatus status = status_of(slot);
  cudaGraph_t graph = nullptr;
  fake_->end_capture(h, &graph);
  if (graph != nullptr) fake_->graph_destroy(graph);
  note(fmt::format("{} capture of {} without a pool; alloc {} -> {}", mode_name(mode), name(slot),
                   size_text(bytes), error ? error_text(error) : std::string("a buffer")));
  if (fault_in_op_) return;
  if (!refused.is_empty()) {
    fail("capture without pool", "an allocation on a stream captured without a pool succeeded");
    buffers_.push_back({});  // keep it alive until the model is abandoned
    buffers_.back().pooled = std::move(refused);
    return;
  }
  if (error != Errc::capture_without_pool) {
    fail("capture without pool",
         "an allocation on a stream captured without a pool failed with " + error_text(error));
  } else if (options_.stream_checks == StreamChecks::full && status != CaptureStatus::active) {
    fail("capture invalidated",
         "under full checks, an allocation on a stream captured without a "
         "pool invalidated the capture");
  }
}

void Model::op_fault() {
  const Call kind = fault_calls[src_.below(static_cast<std::uint32_t>(std::size(fault_calls)))];
  if (!allowed(std::string("fault:") + FakeDevice::call_name(kind))) return;
  const Op ops[] = {Op::alloc,          Op::alloc,         Op::drop,          Op::trim,
                    Op::release_stream, Op::record_stream, Op::capture_begin, Op::capture_end,
                    Op::graph_launch,   Op::graph_destroy, Op::capture_pool,  Op::free_elsewhere};
  const Op op = ops[src_.below(static_cast<std::uint32_t>(std::size(ops)))];
  pending_fault_ = kind;
  fault_in_op_ = true;
  note(fmt::format("with {} failing once:", FakeDevice::call_name(kind)));
  run_op(op);
  pending_fault_.reset();
  fault_in_op_ = false;
}

void Model::op_scratch_pool() {
  // Another MemoryPool on the same device, made, used and destroyed: it must leave the device
  // (and any capture under way) as it found them.
  const int slot = pick(static_cast<int>(slots_.size()), [&](int k) {
    return idle_now(k) && thread_of(slots_[static_cast<std::size_t>(k)]) == 0;
  });
  if (slot < 0) return;
  const std::size_t before = fake_->live_bytes();
  const std::size_t bytes = pick_size();
  std::error_code error;
  {
    PoolOptions options;
    options.read_environment = false;
    options.segment_bytes = 2 * MiB;
    MemoryPool scratch(device_, options);
    auto b = Bytes::try_alloc_async(scratch, bytes, handle(slot), error);
    if (!b.is_empty()) {
      fake_->launch(handle(slot), {{b.data(), b.byte_size(), true}});
    }
  }
  note(fmt::format("a second pool allocates {} on {} ({}) and goes", size_text(bytes), name(slot),
                   error ? error_text(error) : std::string("ok")));
  // While a capture is under way the pool may not synchronize or free: its destruction waits for
  // the next safe point (the capture's end), and teardown checks that everything came back. This
  // pool's calls may be that safe point for a scratch pool destroyed during an earlier capture:
  // what that one held comes back now.
  const std::int64_t change =
      static_cast<std::int64_t>(fake_->live_bytes()) - static_cast<std::int64_t>(before);
  if (change != 0) {
    if (capture_active()) {
      deferred_scratch_ += change;
    } else if (change < 0 && -change <= deferred_scratch_) {
      deferred_scratch_ += change;
    } else {
      fail("scratch pool leaked",
           fmt::format("a MemoryPool destroyed with nothing alive changed the device's bytes by "
                       "{} (scratch pools buried later: {} bytes)",
                       change, deferred_scratch_));
    }
  }
}

void Model::run_op(Op op) {
  switch (op) {
    case Op::alloc: op_alloc(false); break;
    case Op::alloc_raw: op_alloc(true); break;
    case Op::drop: op_drop(); break;
    case Op::free_elsewhere: op_free_elsewhere(); break;
    case Op::record_stream: op_record_stream(); break;
    case Op::launch: op_launch(); break;
    case Op::complete: op_complete(); break;
    case Op::complete_all: op_complete_all(); break;
    case Op::release_stream: op_release_stream(); break;
    case Op::trim: op_trim(); break;
    case Op::stream_create: op_stream_create(); break;
    case Op::stream_destroy: op_stream_destroy(); break;
    case Op::capture_begin: op_capture_begin(); break;
    case Op::capture_end: op_capture_end(); break;
    case Op::capture_misuse: op_capture_misuse(); break;
    case Op::graph_launch: op_graph_launch(); break;
    case Op::graph_destroy: op_graph_destroy(); break;
    case Op::capture_pool: op_capture_pool(); break;
    case Op::raw_capture: op_raw_capture(); break;
    case Op::fault: op_fault(); break;
    case Op::scratch_pool: op_scratch_pool(); break;
    case Op::count: break;
  }
}

void Model::step() {
  const std::size_t start = src_.position();
  line_.clear();
  current_step_ = static_cast<int>(result_.log.size());
  if (run_.trace) run_.trace('O', std::to_string(start));
  run_op(pick_op());
  if (line_.empty()) return;  // nothing applied: not logged, and its bytes fold into the next
  result_.op_start.push_back(start);
  result_.log.push_back(line_);
  if (run_.trace) run_.trace('L', line_);
  if (!failed()) check();
}

// --- checks -------------------------------------------------------------------------------------

// Forgets CapturePools that are gone: their memory is the pool's again.
void Model::prune() {
  for (std::size_t i = 0; i < pools_.size(); ++i) {
    PoolSlot& p = pools_[i];
    if (p.expired || !p.weak.expired()) continue;
    p.expired = true;
    const int index = static_cast<int>(i);
    std::erase_if(held_, [&](const Held& h) { return h.pool == index; });
    p.domain.clear();
    p.private_ranges.clear();
    for (Buffer& b : buffers_) {
      if (b.pool == index) b.pool = -1;
    }
  }
  std::erase_if(dropped_, [](const Dropped& d) { return all_done(d.work); });
}

void Model::check() {
  prune();
  check_hazards();
  if (!failed()) check_captures();
  if (!failed()) check_overlaps();
  if (!failed()) check_stats();
  if (!failed()) check_breakdown();
  if (!failed()) check_bounds();
}

void Model::check_hazards() {
  const std::vector<FakeDevice::Hazard> hazards = fake_->hazards();
  if (hazards.empty()) return;
  const char* kind = "race";
  switch (hazards.front().kind) {
    case FakeDevice::Hazard::Kind::race: kind = "race"; break;
    case FakeDevice::Hazard::Kind::out_of_bounds: kind = "access outside an allocation"; break;
    case FakeDevice::Hazard::Kind::call_in_user_object_destructor:
      kind = "CUDA call in a user object's destructor";
      break;
    case FakeDevice::Hazard::Kind::use_after_drop:
    case FakeDevice::Hazard::Kind::unordered_access:
    case FakeDevice::Hazard::Kind::unrecorded_use:
    case FakeDevice::Hazard::Kind::destroyed_stream:
    case FakeDevice::Hazard::Kind::unmapped_in_use:
    case FakeDevice::Hazard::Kind::destroyed_handle:
      kind = FakeDevice::hazard_name(hazards.front().kind);
      break;
  }
  fail(kind, hazards.size() == 1
                 ? hazards.front().what
                 : fmt::format("{} (and {} more)", hazards.front().what, hazards.size() - 1));
}

void Model::check_captures() {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].alive) continue;
    const int slot = static_cast<int>(i);
    const CaptureStatus status = status_of(slot);
    const int p = slots_[i].capture;
    if (p >= 0 && status == CaptureStatus::invalidated) {
      fail("capture invalidated",
           fmt::format("the {} capture of {} with p{} was invalidated: the pool made a call CUDA "
                       "refuses during capture",
                       mode_name(pools_[static_cast<std::size_t>(p)].mode), name(slot), p));
      return;
    }
    if (p >= 0 && status == CaptureStatus::none) {
      fail("capture ended", fmt::format("{} left its capture with p{} unasked", name(slot), p));
      return;
    }
    if (p < 0 && status != CaptureStatus::none) {
      fail("stream left capturing",
           fmt::format("{} is capturing, but no capture of it is under way", name(slot)));
      return;
    }
  }
}

void Model::check_overlaps() {
  struct Range {
    std::uintptr_t begin;
    std::uintptr_t end;
    std::string what;
  };
  std::vector<Range> ranges;
  for (const Buffer& b : buffers_)
    ranges.push_back({b.begin, b.begin + b.bytes, fmt::format("b{}", b.id)});
  for (const Held& h : held_) {
    ranges.push_back({h.begin, h.begin + h.bytes,
                      fmt::format("b{} ({} by p{})", h.id, h.live ? "held" : "adopted", h.pool)});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      fail("overlap", fmt::format("{} [{:#x}, {:#x}) overlaps {} [{:#x}, {:#x})", ranges[i].what,
                                  ranges[i].begin, ranges[i].end, ranges[i - 1].what,
                                  ranges[i - 1].begin, ranges[i - 1].end));
      return;
    }
  }
}

void Model::check_pinned(const Buffer& b, int capturing_pool) {
  const std::uintptr_t end = b.begin + b.bytes;
  for (const Held& h : held_) {
    if (b.begin < h.begin + h.bytes && h.begin < end) {
      fail(h.live ? "held memory handed out" : "adopted memory handed out",
           fmt::format("b{} [{:#x}, {:#x}) overlaps b{}, which p{} {} for its graphs", b.id,
                       b.begin, end, h.id, h.pool, h.live ? "holds" : "adopted"));
      return;
    }
  }
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    if (pools_[p].expired || static_cast<int>(p) == capturing_pool) continue;
    for (const auto& [lo, hi] : pools_[p].private_ranges) {
      if (b.begin < hi && lo < end) {
        fail("private memory handed out",
             fmt::format("b{} [{:#x}, {:#x}) overlaps [{:#x}, {:#x}), private memory of p{}, "
                         "which is alive",
                         b.id, b.begin, end, lo, hi, p));
        return;
      }
    }
  }
}

std::size_t Model::live_count() const {
  return buffers_.size() + static_cast<std::size_t>(std::count_if(
                               held_.begin(), held_.end(), [](const Held& h) { return h.live; }));
}

std::size_t Model::live_bytes() const {
  std::size_t bytes = 0;
  for (const Buffer& b : buffers_) bytes += b.bytes;
  for (const Held& h : held_) bytes += h.live ? h.bytes : 0;
  return bytes;
}

// The streams the pool may hold state for now: the created ones alive, the legacy stream, the
// per-thread streams, and the CapturePools' private memory, which is counted like a stream.
int Model::streams_now() const {
  int alive = 0;
  for (const Slot& s : slots_) alive += s.alive ? 1 : 0;
  return alive + 1;
}

void Model::note_allocation(std::size_t bytes) {
  ++total_allocations_;
  total_bytes_ += static_cast<std::int64_t>(bytes);
  peak_count_ = std::max(peak_count_, static_cast<std::int64_t>(live_count()));
  const auto now = static_cast<std::int64_t>(live_bytes());
  peak_bytes_ = std::max(peak_bytes_, now);
  peak_bound_ = std::max(
      peak_bound_, now + 2 * static_cast<std::int64_t>(options_.stats_granule) * streams_now());
  if (!classes_.is_large(bytes)) {
    const unsigned c = classes_.class_of(bytes);
    if (std::find(classes_used_.begin(), classes_used_.end(), c) == classes_used_.end()) {
      classes_used_.push_back(c);
    }
  }
}

void Model::check_stats() {
  const PoolStats s = pool_->stats();
  const auto count = static_cast<std::int64_t>(live_count());
  const auto bytes = static_cast<std::int64_t>(live_bytes());
  const bool pools_alive =
      std::any_of(pools_.begin(), pools_.end(), [](const PoolSlot& p) { return !p.expired; });
  const bool pieces = std::any_of(buffers_.begin(), buffers_.end(),
                                  [](const Buffer& b) { return b.private_piece; });
  // CapturePools' private ranges and adopted buffers count as live allocations of the pool: only
  // lower bounds hold while any may exist.
  const bool exact = !pieces && (!pools_alive || !capture_memory_);
  const auto expect = [&](const char* field, std::int64_t got, std::int64_t want, bool equal) {
    if (failed() || (equal ? got == want : got >= want)) return;
    fail(std::string("stats: ") + field,
         fmt::format("{} is {}, the model says {}{}", field, got, equal ? "" : "at least ", want));
  };
  expect("live_allocations.current", s.live_allocations.current, count, exact);
  expect("requested_bytes.current", s.requested_bytes.current, bytes, exact);
  expect("live_allocations.total", s.live_allocations.total, total_allocations_, !capture_memory_);
  expect("requested_bytes.total", s.requested_bytes.total, total_bytes_, !capture_memory_);
  const bool exact_peak = !capture_memory_ && options_.stats_granule == 0;
  expect("live_allocations.peak", s.live_allocations.peak, peak_count_, exact_peak);
  expect("requested_bytes.peak", s.requested_bytes.peak, peak_bytes_, exact_peak);
  if (!failed() && !capture_memory_ && options_.stats_granule != 0 &&
      s.requested_bytes.peak > peak_bound_) {
    fail("stats: requested_bytes.peak",
         fmt::format("requested_bytes.peak is {}: more than two granules ({} each) per stream "
                     "alive above the true peak {} (at most {})",
                     s.requested_bytes.peak, options_.stats_granule, peak_bytes_, peak_bound_));
  }
  // A scratch pool destroyed during a capture frees its memory at the next safe point; where the
  // device's synchronize fails there, it frees what needs none (cudaMalloc's segments, whose
  // cudaFree waits for the work) and keeps its expandable segments mapped until a later safe
  // point's synchronize succeeds (PoolCore::release_device_memory). So what the buried pools
  // still hold only goes down, to nothing: taken as what the device holds beyond this pool. The
  // safe point may be the begin of a capture (begin_capture_with_pool reaches one first), so this
  // holds during captures too (the model's seed 3591 of 2026-12-06: the scratch pool's memory
  // came back as a capture began, and the model still counted it buried).
  auto device_bytes = static_cast<std::int64_t>(fake_->live_bytes());
  if (deferred_scratch_ != 0) {
    const std::int64_t held = device_bytes - s.reserved_bytes.current;
    if (held >= 0 && held < deferred_scratch_) deferred_scratch_ = held;
  }
  expect("reserved_bytes.current", s.reserved_bytes.current, device_bytes - deferred_scratch_,
         true);
  expect("reserved_bytes.peak", s.reserved_bytes.peak, s.reserved_bytes.current, false);
  expect("reserved_bytes.total", s.reserved_bytes.total, s.reserved_bytes.peak, false);
}

void Model::check_breakdown() {
  // One thread at a time calls the pool here, so the walk's parts are one moment's and add up
  // (pool_stats.hpp: every reserved byte is in a segment; slabs and free ranges are ranges of
  // segments; free small blocks are pieces of slabs).
  const PoolBreakdown b = pool_->breakdown();
  const PoolStats s = pool_->stats();
  const auto expect = [&](bool holds, const char* what) {
    if (!failed() && !holds) fail("breakdown", fmt::format("{}: {}", what, streampool::to_string(b)));
  };
  const std::int64_t free_bytes = b.free_clean_bytes + b.free_owned_bytes;
  expect(b.segment_bytes == s.reserved_bytes.current,
         "the segments' bytes are not the reserved bytes of the stats");
  expect((b.segments == 0) == (b.segment_bytes == 0), "segments without bytes, or bytes without");
  expect(b.slab_bytes + free_bytes <= b.segment_bytes, "slabs and free ranges exceed the segments");
  expect(b.small_cached_bytes + b.small_depot_bytes <= b.slab_bytes,
         "free small blocks exceed the slabs");
  expect((b.free_ranges == 0) == (free_bytes == 0), "free ranges without bytes, or bytes without");
  expect(b.largest_free_range <= free_bytes, "the largest free range exceeds the free bytes");
  expect((b.parked_blocks == 0) == (b.parked_bytes == 0), "parked blocks without bytes");
  expect(b.parked_bytes <= b.segment_bytes, "parked blocks exceed the segments");
  expect((b.stranded_blocks == 0) == (b.stranded_bytes == 0), "stranded blocks without bytes");
  expect(b.parked_bytes + b.stranded_bytes <= b.segment_bytes,
         "parked and stranded blocks exceed the segments");
}

void Model::check_bounds() {
  // The pool's own memory: not what scratch pools destroyed during a capture still hold.
  const std::size_t reserved = fake_->live_bytes() - static_cast<std::size_t>(deferred_scratch_);
  if (options_.max_reserved_bytes != 0 && reserved > options_.max_reserved_bytes) {
    fail("max_reserved_bytes passed", fmt::format("{} bytes reserved under a limit of {}", reserved,
                                                  options_.max_reserved_bytes));
    return;
  }
  // The memory the model's buffers could need at once: live and held ones, and dropped ones
  // whose work is still pending (no stream but their own may have them yet).
  std::size_t active = 0;
  for (const Buffer& b : buffers_) active += b.footprint;
  for (const Held& h : held_) active += h.footprint;
  for (const Dropped& d : dropped_) active += d.footprint;
  peak_active_ = std::max(peak_active_, active);
  // CapturePools' private memory, at the most each held: it stays cached once they are gone.
  std::size_t private_bytes = 0;
  for (PoolSlot& p : pools_) {
    if (!p.expired) {
      if (auto alive = p.weak.lock())
        p.most_private = std::max(p.most_private, alive->reserved_bytes());
    }
    private_bytes += p.most_private;
  }
  // Every stream may cache what it dropped (until someone asks it for a fence), each size class
  // in use holds a slab, and the arena's segments round up.
  std::size_t slabs = 0;
  for (unsigned c : classes_used_) {
    const std::size_t block = classes_.block_size(c);
    const std::size_t per_slab = std::max<std::size_t>(1, options_.slab_bytes / block);
    const std::size_t r = options_.large_rounding;
    slabs += (per_slab * block + r - 1) / r * r;
  }
  const std::size_t unit = std::max(options_.segment_bytes, largest_request_);
  // With fixed segments a private piece lies within one device allocation and the arena grows
  // by a whole segment: a piece of more than half a segment leaves the rest to other requests,
  // so the pieces may take up to twice their bytes (reserves of 2.1 MiB in 4 MiB segments: one
  // segment each). Mapped pieces take their own bytes.
  const std::size_t private_room = options_.expandable_segments ? private_bytes : 2 * private_bytes;
  const std::size_t bound = static_cast<std::size_t>(streams_now() + 1) * (peak_active_ + slabs) +
                            private_room + 2 * unit;
  if (reserved > bound) {
    fail("reserved memory unbounded",
         fmt::format("{} bytes reserved; the model's buffers never needed more than {} at once "
                     "({} streams, {} in slabs, {} private): the bound is {}",
                     reserved, peak_active_, streams_now(), slabs, private_bytes, bound));
  }
}

// --- teardown -----------------------------------------------------------------------------------

void Model::teardown() {
  line_.clear();
  current_step_ = static_cast<int>(result_.log.size());
  result_.op_start.push_back(src_.position());
  if (run_.trace) run_.trace('O', std::to_string(src_.position()));
  // 0, 1: in order; 2: the MemoryPool goes first, before its buffers, CapturePools and graphs;
  // 3: it goes while a capture is still under way.
  std::uint32_t style = src_.below(4);
  if (style == 3 && !allowed("orphan_mid_capture")) style = 2;
  if (style == 2 && !allowed("orphan_teardown")) style = 0;
  note(style < 2    ? "teardown in order"
       : style == 2 ? "teardown, the MemoryPool first"
                    : "teardown, the MemoryPool mid-capture");
  const auto end_captures = [&] {
    for (std::size_t p = 0; p < pools_.size(); ++p) {
      if (pools_[p].capturing >= 0) end_capture(static_cast<int>(p), 0);
    }
  };
  // A raw buffer dropped on a capturing stream is a variant of its own.
  const bool raw_on_captured = std::any_of(buffers_.begin(), buffers_.end(), [&](const Buffer& b) {
    return b.is_raw() && slots_[static_cast<std::size_t>(b.slot)].capture >= 0;
  });
  if (style < 3 || (raw_on_captured && !allowed("free_captured"))) end_captures();
  if (style >= 2) {
    if (!allowed("pending_release")) {
      fake_->complete_all();
      streampool::complete_graph_releases();
    }
    // Raw allocations must be deallocated before the pool is destroyed; PooledBuffers need not.
    for (std::size_t i = buffers_.size(); i-- > 0;) {
      if (buffers_[i].is_raw()) drop(i, 0);
    }
    pool_.reset();
    note("destroy the MemoryPool");
    end_captures();
  }
  while (!buffers_.empty() || !graphs_.empty()) {
    if (!graphs_.empty() && (buffers_.empty() || src_.one_in(2))) {
      const std::size_t g = src_.below(static_cast<std::uint32_t>(graphs_.size()));
      const int id = graphs_[g].id;
      if (graphs_[g].exec != nullptr) fake_->graph_exec_destroy(graphs_[g].exec);
      if (graphs_[g].keep != nullptr) retired_.push_back(std::move(graphs_[g].keep));
      graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(g));
      note(fmt::format("destroy g{}", id));
    } else {
      drop(src_.below(static_cast<std::uint32_t>(buffers_.size())), 0);
    }
  }
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    if (pools_[p].handle != nullptr) {
      pools_[p].handle.reset();
      note(fmt::format("drop p{}", p));
    }
  }
  fake_->complete_all();
  if (!retired_.empty()) {
    retired_.clear();  // the framework graphs' replays have completed
    note("drop the CapturePools of destroyed framework graphs");
  }
  // A graph's release that arrives after its MemoryPool is gone (the pool went first, its graphs'
  // last replays completed since) waits for the library's next safe point anywhere: the
  // documented way to have it now is complete_graph_releases().
  if (!allowed("pending_release") || pool_ == nullptr) streampool::complete_graph_releases();
  if (pool_ != nullptr) {
    pool_.reset();
    note("destroy the MemoryPool");
  }
  fake_->complete_all();
  for (cudaEvent_t event : events_) fake_->event_destroy(event);
  events_.clear();
  check_hazards();
  const auto leaks = [&] {
    std::string what;
    if (fake_->live_bytes() != 0) what += fmt::format(" {} device bytes;", fake_->live_bytes());
    if (fake_->live_events() != 0) what += fmt::format(" {} events;", fake_->live_events());
    if (fake_->live_user_objects() != 0) {
      what += fmt::format(" {} user objects;", fake_->live_user_objects());
    }
    return what;
  };
  if (!failed()) {
    const std::string left = leaks();
    if (!left.empty()) {
      // A graph's release may wait for a safe point: does one help?
      streampool::complete_graph_releases();
      fake_->complete_all();
      const std::string after = leaks();
      fail(
          after.empty() ? "leak at teardown, until a safe point" : "leak at teardown",
          fmt::format("everything dropped and the pool destroyed, the device still holds{}{}", left,
                      after.empty() ? " (all back once complete_graph_releases() was called)"
                                    : " (still after complete_graph_releases():" + after + ")"));
    }
  }
  result_.log.push_back(line_);
  if (run_.trace) run_.trace('L', line_);
  worker_.reset();
}

void Model::abandon() {
  // The pool failed: dropping what is left could crash in it. Keep it all, and only end the
  // captures under way (the library counts them process-wide: later runs would see them) and
  // stop the helper thread.
  for (PoolSlot& p : pools_) {
    if (p.capturing < 0 || p.handle == nullptr) continue;
    if (p.framework) {
      cudaGraph_t graph = nullptr;
      if (fake_->end_capture(handle(p.capturing), &graph) == cudaSuccess && graph != nullptr) {
        fake_->graph_destroy(graph);
      }
      streampool::detach_capture_with_pool(p.handle);
      continue;
    }
    try {
      GraphSlot g;
      g.graph = streampool::end_capture_with_pool(handle(p.capturing), p.handle);
      graphs_.push_back(std::move(g));
    } catch (const std::exception&) {
    }
  }
  struct Kept {
    std::vector<Buffer> buffers;
    std::vector<GraphSlot> graphs;
    std::vector<PoolSlot> pools;
    std::unique_ptr<MemoryPool> pool;
    std::shared_ptr<streampool::Device> device;
    std::shared_ptr<FakeDevice> fake;
  };
  new Kept{std::move(buffers_), std::move(graphs_), std::move(pools_),
           std::move(pool_),    std::move(device_), std::move(fake_)};
  worker_.reset();
}

}  // namespace

// --- drivers ------------------------------------------------------------------------------------

std::vector<std::string> op_names() {
  std::vector<std::string> names(std::begin(op_name), std::end(op_name));
  names.insert(names.end(), std::begin(variant_name), std::end(variant_name));
  for (Call call : fault_calls)
    names.push_back(std::string("fault:") + FakeDevice::call_name(call));
  return names;
}

RunResult run_model(ByteSource& source, const RunOptions& options) {
  RunResult result;
  auto model = std::make_unique<Model>(source, options, result);
  try {
    model->setup();
    for (int i = 0; i < options.max_steps && !model->failed() && !source.exhausted(); ++i) {
      model->step();
    }
    if (!model->failed()) model->teardown();
  } catch (const std::exception& e) {
    if (!result.failure) {
      result.failure = Failure{"model error", fmt::format("the model itself threw: {}", e.what()),
                               static_cast<int>(result.log.size())};
    }
  }
  if (result.failure) {
    model->abandon();
    (void)model.release();  // holds nothing but references now
  }
  result.bytes = source.drawn();
  return result;
}

RunResult run_seed(std::uint64_t seed, const RunOptions& options) {
  ByteSource source(seed);
  return run_model(source, options);
}

RunResult run_bytes(std::span<const std::uint8_t> bytes, const RunOptions& options) {
  ByteSource source(bytes);
  return run_model(source, options);
}

namespace {

// Runs `run` in a child process that streams its trace, and its outcome, back through a pipe.
// Records are one line each: a tag, then text ('\n' in it escaped as '\1').
RunResult isolated(const std::function<RunResult(const RunOptions&)>& run, RunOptions options,
                   std::span<const std::uint8_t> input, std::optional<std::uint64_t> seed,
                   int timeout_s) {
  int fds[2];
  if (::pipe(fds) != 0) return run(options);
  // Nothing buffered may be written twice, by the child too.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return run(options);
  }
  if (child == 0) {
    ::close(fds[0]);
    // A crash ends the child as the signal does, not in the test framework's handler (which
    // would report and exit as the parent would).
    for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGALRM})
      std::signal(signal, SIG_DFL);
    ::alarm(static_cast<unsigned>(timeout_s));
    const auto send = [fd = fds[1]](char tag, const std::string& text) {
      std::string record(1, tag);
      for (char c : text) record += c == '\n' ? '\1' : c;
      record += '\n';
      for (std::size_t at = 0; at < record.size();) {
        const ssize_t n = ::write(fd, record.data() + at, record.size() - at);
        if (n <= 0) ::_exit(3);
        at += static_cast<std::size_t>(n);
      }
    };
    options.trace = send;
    const RunResult result = run(options);
    send('S', result.setup);
    if (result.failure) {
      send('K', result.failure->kind);
      send('W', result.failure->what);
      send('T', std::to_string(result.failure->step));
    }
    send('B', to_hex(result.bytes));
    flush_coverage();
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string data;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }

  RunResult result;
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::size_t pending = none;  // the offset of an operation begun and not logged
  std::optional<Failure> failure;
  bool complete = false;
  for (std::size_t at = 0; at < data.size();) {
    const std::size_t end = std::min(data.find('\n', at), data.size());
    std::string text = data.substr(at + 1, end - at - 1);
    std::replace(text.begin(), text.end(), '\1', '\n');
    switch (data[at]) {
      case 'S': result.setup = text; break;
      case 'H': result.header_bytes = std::stoull(text); break;
      case 'O': pending = std::stoull(text); break;
      case 'L':
        result.op_start.push_back(pending == none ? 0 : pending);
        result.log.push_back(text);
        pending = none;
        break;
      case 'K': failure = Failure{text, "", -1}; break;
      case 'W':
        if (failure) failure->what = text;
        break;
      case 'T':
        if (failure) failure->step = std::stoi(text);
        break;
      case 'B':
        result.bytes = from_hex(text);
        complete = true;
        break;
      default: break;
    }
    at = end + 1;
  }
  result.failure = failure;
  if (!complete || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    // It died mid-run: the operation it began last is where.
    if (pending != none) {
      result.op_start.push_back(pending);
      result.log.push_back("(the operation that was running)");
    }
    const std::string how = WIFSIGNALED(status)
                                ? (WTERMSIG(status) == SIGALRM
                                       ? fmt::format("no end after {} s: a hang", timeout_s)
                                       : fmt::format("killed by signal {} ({})", WTERMSIG(status),
                                                     ::strsignal(WTERMSIG(status))))
                                : fmt::format("exited with status {}", WEXITSTATUS(status));
    result.failure =
        Failure{"crash", how + " during the run", static_cast<int>(result.log.size()) - 1};
    // The input up to the crash: the given bytes, or the seed's, generously past the last
    // operation begun (a replay stops at the crash again).
    if (seed) {
      const std::size_t wanted = (result.op_start.empty() ? 0 : result.op_start.back()) + 4096;
      ByteSource source(*seed);
      while (source.position() < wanted) source.byte();
      result.bytes = source.drawn();
    } else {
      result.bytes.assign(input.begin(), input.end());
    }
  }
  return result;
}

}  // namespace

RunResult run_seed_isolated(std::uint64_t seed, const RunOptions& options, int timeout_s) {
  return isolated([seed](const RunOptions& o) { return run_seed(seed, o); }, options, {}, seed,
                  timeout_s);
}

RunResult run_bytes_isolated(std::span<const std::uint8_t> bytes, const RunOptions& options,
                             int timeout_s) {
  return isolated([bytes](const RunOptions& o) { return run_bytes(bytes, o); }, options, bytes,
                  std::nullopt, timeout_s);
}

RunResult reduce(const RunResult& failing, const RunOptions& options, int max_runs, bool isolate) {
  RunResult best = failing;
  const std::string kind = failing.failure->kind;
  int runs = 0;
  // Runs `bytes`; keeps them when they fail the same way in no more operations.
  const auto attempt = [&](const std::vector<std::uint8_t>& bytes, bool fewer_bytes) {
    if (runs >= max_runs) return false;
    ++runs;
    RunResult r = isolate ? run_bytes_isolated(bytes, options, 20) : run_bytes(bytes, options);
    const bool shorter =
        r.log.size() < best.log.size() ||
        (r.log.size() == best.log.size() && (!fewer_bytes || r.bytes.size() < best.bytes.size()));
    if (!r.failure || r.failure->kind != kind || !shorter) return false;
    best = std::move(r);
    return true;
  };
  // Removes runs of operations, halving their length down to one (ddmin, roughly).
  const auto remove_operations = [&] {
    std::size_t granularity = std::max<std::size_t>(1, best.op_start.size() / 2);
    for (;;) {
      bool progress = false;
      for (std::size_t at = 0; at < best.op_start.size() && runs < max_runs;) {
        const std::size_t n = best.op_start.size();
        const std::size_t last = std::min(n, at + granularity);
        const std::size_t cut_begin = best.op_start[at];
        const std::size_t cut_end = last < n ? best.op_start[last] : best.bytes.size();
        std::vector<std::uint8_t> bytes(
            best.bytes.begin(), best.bytes.begin() + static_cast<std::ptrdiff_t>(cut_begin));
        bytes.insert(bytes.end(), best.bytes.begin() + static_cast<std::ptrdiff_t>(cut_end),
                     best.bytes.end());
        if (attempt(bytes, true)) {
          progress = true;
          continue;  // the same position now holds the next operations
        }
        at = last;
      }
      if (runs >= max_runs) return;
      if (!progress) {
        if (granularity == 1) return;
        granularity = std::max<std::size_t>(1, granularity / 2);
      }
    }
  };
  // A crash leaves unread bytes after the operation it happened in: cut them.
  const auto cut_tail = [&] {
    if (best.op_start.empty()) return;
    for (std::size_t keep : {8u, 32u, 128u, 512u}) {
      const std::size_t end = best.op_start.back() + keep;
      if (end >= best.bytes.size()) return;
      if (attempt({best.bytes.begin(), best.bytes.begin() + static_cast<std::ptrdiff_t>(end)},
                  true)) {
        return;
      }
    }
  };
  remove_operations();
  cut_tail();
  // Then fewer kinds of operation: no helper thread (byte 3), and each operation's weight set to
  // 0 (its byte to 7), one at a time; each success is followed by more removals.
  for (bool changed = true; changed && runs < max_runs;) {
    changed = false;
    for (std::size_t i = 3; i < best.header_bytes && i < best.bytes.size(); ++i) {
      std::vector<std::uint8_t> bytes = best.bytes;
      const std::uint8_t simpler = i == 3 ? static_cast<std::uint8_t>(bytes[i] & ~3u)
                                          : static_cast<std::uint8_t>(bytes[i] | 7u);
      if (simpler == bytes[i]) continue;
      bytes[i] = simpler;
      if (attempt(bytes, false)) {
        changed = true;
        remove_operations();
      }
    }
  }
  return best;
}

std::string describe(const RunResult& result, std::size_t tail) {
  std::string text = "setup: " + result.setup + "\n";
  const std::size_t first = tail == 0 || result.log.size() <= tail ? 0 : result.log.size() - tail;
  if (first > 0) text += fmt::format("  ... {} operations before\n", first);
  for (std::size_t i = first; i < result.log.size(); ++i) {
    text += fmt::format("  #{}: {}\n", i, result.log[i]);
  }
  if (result.failure) {
    text += fmt::format("FAILED after #{}: {}: {}\n", result.failure->step, result.failure->kind,
                        result.failure->what);
  }
  text += fmt::format("input ({} bytes): {}\n", result.bytes.size(), to_hex(result.bytes));
  return text;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) text += fmt::format("{:02x}", b);
  return text;
}

std::vector<std::uint8_t> from_hex(std::string_view hex) {
  std::vector<std::uint8_t> bytes;
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    const int hi = digit(hex[i]);
    const int lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) break;
    bytes.push_back(static_cast<std::uint8_t>(hi << 4 | lo));
  }
  return bytes;
}

// --- stream churn -------------------------------------------------------------------------------

RunResult run_churn(std::uint64_t seed, PoolOptions options, int rounds) {
  RunResult result;
  options.read_environment = false;
  result.setup = fmt::format("churn, seed {}, {} rounds: {}", seed, rounds, options.to_conf());
  const auto fail = [&](std::string kind, std::string what) {
    if (!result.failure) {
      result.failure =
          Failure{std::move(kind), std::move(what), static_cast<int>(result.log.size()) - 1};
    }
  };
  std::mt19937_64 random(seed);
  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<MemoryPool>(fake, options);
  cudaStream_t steady = fake->create_stream();
  const std::size_t hot[] = {4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB, 64 * KiB};
  const int warmup = std::max(4, rounds / 6);
  std::size_t baseline = 0;
  for (int round = 0; round < rounds && !result.failure; ++round) {
    fake->complete_all();  // a GPU finishes its kernels soon: only this round's work is pending
    cudaStream_t churned = fake->create_stream();
    std::vector<Bytes> kept;
    const int n = 4 + static_cast<int>(random() % 9);
    std::size_t requested = 0;
    for (int i = 0; i < n && !result.failure; ++i) {
      const std::size_t bytes = random() % 6 == 0
                                    ? 1 * MiB + random() % (3 * MiB)
                                    : hot[random() % 5] + random() % 2 * (random() % 4096);
      cudaStream_t s = random() % 4 == 0 ? steady : churned;
      std::error_code error;
      Bytes b = Bytes::try_alloc_async(*pool, bytes, s, error);
      if (error || b.is_empty()) {
        fail("unexpected error", fmt::format("allocating {} bytes: {}", bytes, error.message()));
        break;
      }
      fake->launch(s, {{b.data(), b.byte_size(), true}});
      requested += bytes;
      kept.push_back(std::move(b));
    }
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
    for (const Bytes& b : kept)
      ranges.emplace_back(address(b.data()), address(b.data()) + b.byte_size());
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) fail("overlap", "two live buffers overlap");
    }
    kept.clear();  // every buffer dropped before the stream goes, as the contract asks
    if (options.stream_checks == StreamChecks::none) pool->release_stream(churned);
    fake->destroy_stream(churned);
    const std::size_t reserved = fake->live_bytes();
    result.log.push_back(fmt::format("round {}: {} buffers, {} requested; reserved {}", round, n,
                                     size_text(requested), size_text(reserved)));
    if (!fake->hazards().empty()) fail("race", fake->hazards().front().what);
    if (round < warmup) {
      baseline = std::max(baseline, reserved);
    } else if (reserved > baseline + baseline / 2 + options.segment_bytes) {
      fail("reserved memory grows under churn",
           fmt::format("{} bytes reserved after {} rounds; at most {} during the first {}",
                       reserved, round + 1, baseline, warmup));
    }
  }
  if (result.failure) {
    (void)pool.release();  // the pool failed: leave it be
    (void)new std::shared_ptr<FakeDevice>(fake);
    return result;
  }
  fake->complete_all();
  pool.reset();
  if (fake->live_bytes() != 0 || fake->live_events() != 0) {
    result.log.push_back("destroy the pool");
    fail("leak at teardown", fmt::format("{} device bytes and {} events left", fake->live_bytes(),
                                         fake->live_events()));
  }
  return result;
}

// --- the concurrent variant ---------------------------------------------------------------------

namespace {

struct Concurrent {
  Concurrent(MemoryPool& p, FakeDevice& f, const PoolOptions& o, cudaStream_t shared)
      : pool(p), fake(f), options(o), common(shared) {}

  MemoryPool& pool;
  FakeDevice& fake;
  const PoolOptions& options;
  cudaStream_t common;
  LiveRanges live;
  std::mutex mutex;
  std::string first_failure;
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> served{0};  // allocations that returned a buffer

  void fail(std::string what) {
    std::lock_guard<std::mutex> lock(mutex);
    if (failures++ == 0) first_failure = std::move(what);
  }
};

void order_after(FakeDevice& fake, cudaStream_t waiter, cudaStream_t awaited) {
  if (waiter == awaited) return;
  cudaEvent_t event = nullptr;
  fake.event_create(&event);
  fake.event_record(event, awaited);
  fake.stream_wait_event(waiter, event);
  fake.event_destroy(event);
}

void concurrent_worker(Concurrent& c, std::uint64_t seed, const ConcurrentOptions& co,
                       std::latch& start) {
  const auto allowed = [&](const char* what) {
    return std::find(co.without.begin(), co.without.end(), what) == co.without.end();
  };
  const int steps = co.steps_per_thread;
  std::mt19937_64 random(seed);
  std::vector<cudaStream_t> own{c.fake.create_stream(), c.fake.create_stream()};
  const auto streams = [&] {
    std::vector<cudaStream_t> all = own;
    all.push_back(cudaStreamPerThread);
    all.push_back(c.common);
    return all;
  };
  const auto pick = [&](const std::vector<cudaStream_t>& from) {
    return from[random() % from.size()];
  };
  struct Kept {
    Bytes buffer;
    std::vector<cudaStream_t> uses;  // its own stream first
  };
  std::vector<Kept> kept;
  const auto drop = [&](std::size_t i) {
    c.live.remove(kept[i].buffer.data());  // before the drop: it may go out at once
    kept[i] = std::move(kept.back());
    kept.pop_back();
  };
  const bool limited = c.options.max_reserved_bytes != 0;
  start.arrive_and_wait();
  try {
    for (int step = 0; step < steps && c.failures == 0; ++step) {
      const auto op = random() % 100;
      if (op < 45 || kept.empty()) {
        cudaStream_t s = pick(streams());
        const std::size_t bytes = random() % 10 == 0  ? 256 * KiB + random() % (3 * MiB)
                                  : random() % 3 == 0 ? 1 + random() % (256 * KiB)
                                                      : 1 + random() % (16 * KiB);
        std::error_code error;
        Bytes b = Bytes::try_alloc_async(c.pool, bytes, s, error);
        if (error || b.is_empty()) {
          if (!(limited && error == Errc::out_of_memory)) {
            c.fail(fmt::format("allocating {} bytes: {}", bytes,
                               error ? error.message() : "an empty buffer and no error"));
          }
          continue;
        }
        c.served.fetch_add(1, std::memory_order_relaxed);
        c.live.add(b.data(), b.byte_size());
        c.fake.launch(s, {{b.data(), b.byte_size(), true}});
        kept.push_back({std::move(b), {s}});
      } else if (op < 75) {
        drop(random() % kept.size());
      } else if (op < 83) {
        if (!allowed("record_stream")) continue;
        Kept& k = kept[random() % kept.size()];
        cudaStream_t other = pick(streams());
        if (other == k.uses.front()) continue;
        for (cudaStream_t u : k.uses) order_after(c.fake, other, u);
        c.fake.launch(other, {{k.buffer.data(), k.buffer.byte_size(), false}});
        k.buffer.record_stream(other);
        if (std::find(k.uses.begin(), k.uses.end(), other) == k.uses.end()) k.uses.push_back(other);
      } else if (op < 90) {
        Kept& k = kept[random() % kept.size()];
        cudaStream_t on = k.uses[random() % k.uses.size()];
        for (cudaStream_t u : k.uses) order_after(c.fake, on, u);
        c.fake.launch(on, {{k.buffer.data(), k.buffer.byte_size(), true}});
      } else if (op < 94) {
        c.fake.complete(pick(streams()));
      } else if (op < 97) {
        if (allowed("release_stream")) c.pool.release_stream(pick(streams()));
      } else if (op < 99) {
        if (!allowed("stream_destroy")) continue;
        // Churn: drop what was used on one of its streams, release it, destroy it, make another
        // (which gets its handle back).
        cudaStream_t& old = own[random() % own.size()];
        for (std::size_t i = kept.size(); i-- > 0;) {
          if (std::find(kept[i].uses.begin(), kept[i].uses.end(), old) != kept[i].uses.end())
            drop(i);
        }
        if (c.options.stream_checks == StreamChecks::none ||
            (random() % 2 == 0 && allowed("release_stream"))) {
          c.pool.release_stream(old);
        }
        c.fake.destroy_stream(old);
        old = c.fake.create_stream();
      } else if (allowed("trim")) {
        c.pool.trim(random() % 2 == 0 ? 0 : random() % (8 * MiB));
      }
    }
  } catch (const std::exception& e) {
    c.fail(fmt::format("a worker's call threw: {}", e.what()));
  }
  while (!kept.empty()) drop(kept.size() - 1);
}

int reclaimer_count(const ConcurrentOptions& co) {
  const auto without = [&](const char* what) {
    return std::find(co.without.begin(), co.without.end(), what) != co.without.end();
  };
  return without("reclaimers")           ? 0
         : without("concurrent_reclaim") ? std::min(1, co.reclaimers)
                                         : co.reclaimers;
}

// The pool options of a concurrent run, and a line naming them.
PoolOptions concurrent_options(std::uint64_t seed, const ConcurrentOptions& co,
                               std::string& setup) {
  std::mt19937_64 random(seed);
  PoolOptions options;
  options.read_environment = false;
  const StreamChecks checks[] = {StreamChecks::full, StreamChecks::identity, StreamChecks::none};
  options.stream_checks = checks[random() % 3];
  options.fence_every_free = random() % 3 == 0;
  options.cross_stream_wait = random() % 3 == 0;
  options.stats_granule = random() % 2 == 0 ? 0 : 64 * KiB;
  // The defaults among the choices (the byte decoder above keeps its own, which its reduced
  // failures decode with).
  const std::size_t slabs[] = {PoolOptions{}.slab_bytes, 1 * MiB, 4 * KiB, 64 * KiB};
  options.slab_bytes = slabs[random() % 4];
  options.segment_bytes = random() % 2 == 0 ? 2 * MiB : 20 * MiB;
  const std::size_t roundings[] = {PoolOptions{}.large_rounding, 4 * KiB, 128 * KiB};
  options.large_rounding = roundings[random() % 3];
  // A limit makes allocations climb the out-of-memory ladder while other threads trim.
  options.max_reserved_bytes = random() % 2 == 0 ? 24 * MiB : 0;
  if (std::find(co.without.begin(), co.without.end(), "limit") != co.without.end()) {
    options.max_reserved_bytes = 0;
  }
  setup = fmt::format(
      "concurrent, seed {}, {} workers x {} steps, {} trimming{}: {}", seed, co.threads,
      co.steps_per_thread, reclaimer_count(co),
      co.without.empty() ? "" : ", without " + fmt::format("{}", fmt::join(co.without, ",")),
      options.to_conf());
  return options;
}

}  // namespace

RunResult run_concurrent(std::uint64_t seed, const ConcurrentOptions& co) {
  RunResult result;
  const PoolOptions options = concurrent_options(seed, co, result.setup);

  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<MemoryPool>(fake, options);
  Concurrent c(*pool, *fake, options, fake->create_stream());
  const int reclaimers_now = reclaimer_count(co);
  std::latch start(co.threads + reclaimers_now);
  std::vector<std::thread> workers;
  for (int t = 0; t < co.threads; ++t) {
    workers.emplace_back(concurrent_worker, std::ref(c),
                         seed * 1000003 + static_cast<std::uint64_t>(t), std::cref(co),
                         std::ref(start));
  }
  std::vector<std::thread> reclaimers;
  for (int t = 0; t < reclaimers_now; ++t) {
    reclaimers.emplace_back([&, t] {
      std::mt19937_64 r(seed * 7 + static_cast<std::uint64_t>(t));
      start.arrive_and_wait();
      try {
        while (!c.done.load()) {
          c.pool.trim(r() % 2 == 0 ? 0 : r() % (16 * MiB));
          if (t == 0 && r() % 2 == 0) c.fake.complete_all();
          std::this_thread::yield();
        }
      } catch (const std::exception& e) {
        c.fail(fmt::format("trim threw: {}", e.what()));
      }
    });
  }
  for (std::thread& w : workers) w.join();
  c.done = true;
  for (std::thread& r : reclaimers) r.join();
  result.log.push_back(fmt::format("{} {}", concurrent_served, c.served.load()));

  const auto fail = [&](std::string kind, std::string what) {
    if (!result.failure) result.failure = Failure{std::move(kind), std::move(what), 0};
  };
  if (c.failures != 0) fail("unexpected error", c.first_failure);
  if (!c.live.first_overlap().empty()) fail("overlap", c.live.first_overlap());
  fake->complete_all();
  const auto hazards = fake->hazards();
  if (!hazards.empty()) {
    fail(hazards.front().kind == FakeDevice::Hazard::Kind::race ? "race"
                                                                : "access outside an allocation",
         fmt::format("{} (and {} more)", hazards.front().what, hazards.size() - 1));
  }
  const PoolStats stats = pool->stats();
  if (stats.live_allocations.current != 0 || stats.requested_bytes.current != 0) {
    fail("stats: current",
         fmt::format("everything dropped, yet {} allocations of {} bytes live",
                     stats.live_allocations.current, stats.requested_bytes.current));
  }
  if (stats.reserved_bytes.current != static_cast<std::int64_t>(fake->live_bytes())) {
    fail("stats: reserved_bytes.current",
         fmt::format("{} reserved, the device holds {}", stats.reserved_bytes.current,
                     fake->live_bytes()));
  }
  if (result.failure) {
    (void)pool.release();
    (void)new std::shared_ptr<FakeDevice>(fake);
    return result;
  }
  pool.reset();
  if (fake->live_bytes() != 0 || fake->live_events() != 0) {
    fail("leak at teardown", fmt::format("{} device bytes and {} events left", fake->live_bytes(),
                                         fake->live_events()));
  }
  return result;
}

RunResult run_concurrent_isolated(std::uint64_t seed, const ConcurrentOptions& options,
                                  int timeout_s) {
  // The log comes back through the pipe, as a sequential run's does.
  const auto run = [&](const RunOptions& piped) {
    RunResult r = run_concurrent(seed, options);
    if (piped.trace) {
      for (const std::string& line : r.log) piped.trace('L', line);
    }
    return r;
  };
  RunResult result = isolated(run, {}, {}, std::nullopt, timeout_s);
  if (result.setup.empty()) concurrent_options(seed, options, result.setup);
  result.bytes.clear();
  return result;
}

std::size_t operations_of(const RunResult& result) {
  return static_cast<std::size_t>(
      std::count_if(result.log.begin(), result.log.end(),
                    [](const std::string& line) { return line.rfind("teardown", 0) != 0; }));
}

std::optional<std::uint64_t> served_by(const RunResult& result) {
  for (const std::string& line : result.log) {
    if (line.size() <= concurrent_served.size() || line.rfind(concurrent_served, 0) != 0) continue;
    std::uint64_t n = 0;
    const char* first = line.data() + concurrent_served.size() + 1;
    const auto [end, error] = std::from_chars(first, line.data() + line.size(), n);
    if (error == std::errc{} && end == line.data() + line.size()) return n;
  }
  return std::nullopt;
}

}  // namespace pool_model
