// The fault matrix (issue 9, item 3): every device call of scripted scenarios fails in turn.
//
// Each scenario runs once without a fault, counting its device calls by kind; then, for every
// kind and every position N up to that count, a fresh pool runs it again with the Nth call of
// that kind failing (with the error FakeDevice gives for it: cudaErrorMemoryAllocation for
// cudaMalloc, creation and instantiation, cudaErrorLaunchFailure for the rest). Every run must:
//
//   - hand out only good memory: each buffer inside a live device allocation, overlapping no
//     other live buffer, and no access race on the fake device (nothing reused early);
//   - report the fault clearly if it reports it at all: an Error escaping the scenario keeps the
//     failed call's cudaError_t (Error::cuda_error()) and names the call in what();
//   - leave no stream capturing;
//   - succeed when the same scenario runs again on the same pool, the fault cleared;
//   - leak nothing: once the pool is gone and the library's next safe point has passed, every
//     device byte, event and user object is back.
//
// A fault that the API cannot report (it comes in a destructor, a drop or a deallocate, which
// never throw, or the pool absorbs it) must leave the documented trace instead: a fence that
// could not be made falls back to a stream synchronize (PoolStats::blocking_fallbacks), a query
// that failed counts as "not yet", a free or destroy CUDA refused is tried again at the next safe
// point (memory_pool.hpp, capture_pool.hpp). The checks above hold for those runs as for any.
#include "fake_helpers.hpp"
#include "live_ranges.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <array>
#include <exception>
#include <functional>
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using streampool::CapturedGraph;
using streampool::CaptureMode;
using streampool::CapturePool;
using streampool::CaptureStatus;
using streampool::Errc;
using streampool::Error;
using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PoolOptions;
using Bytes = streampool::PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr int kinds = FakeDevice::call_kinds;

// The CUDA runtime call each seam call is, as an error message names it.
constexpr std::array<const char*, kinds> cuda_names{
    "cudaMalloc",           "cudaFree",
    "cudaDeviceEnablePeerAccess", "cudaMemGetInfo",
    "cuMemGetAllocationGranularity", "cuMemAddressReserve",
    "cuMemAddressFree",     "cuMemCreate",
    "cuMemRelease",         "cuMemMap",
    "cuMemSetAccess",       "cuMemUnmap",
    "cudaEventCreate",
    "cudaEventDestroy",     "cudaEventRecord",
    "cudaEventQuery",       "cudaEventSynchronize",
    "cudaStreamWaitEvent",  "cudaStreamSynchronize",
    "cudaDeviceSynchronize", "cudaStreamGetId",
    "cudaStreamGetCaptureInfo", "cudaStreamBeginCapture",
    "cudaStreamEndCapture", "cudaGraphInstantiate",
    "cudaGraphLaunch",      "cudaGraphUpload",
    "cudaGraphExecDestroy", "cudaGraphDestroy",
    "cudaUserObjectCreate", "cudaGraphRetainUserObject",
    "cudaUserObjectRelease"};
static_assert(cuda_names.size() == static_cast<std::size_t>(FakeDevice::call_kinds));
static_assert(std::find(cuda_names.begin(), cuda_names.end(), nullptr) == cuda_names.end(),
              "a name for every call");

// A device over a FakeDevice that counts the calls reaching it by kind, fails one chosen call,
// and keeps the device allocations live now (a returned buffer must lie inside one).
class FaultAt final : public streampool::ForwardingDevice {
 public:
  using StreamId = streampool::StreamId;
  using CaptureId = streampool::CaptureId;
  using CaptureMode = streampool::CaptureMode;
  using CaptureStatus = streampool::CaptureStatus;

  explicit FaultAt(std::shared_ptr<FakeDevice> fake)
      : ForwardingDevice(fake), fake_(std::move(fake)) {}

  // From now on, the `position`th call of `call` (1: the next) fails; and, once it has, the next
  // call of `then` too, if given.
  void arm(Call call, std::uint64_t position, std::optional<Call> then = std::nullopt) {
    std::lock_guard<std::mutex> lock(mutex_);
    target_ = call;
    position_ = counts_[static_cast<int>(call)] + position;
    then_ = then;
    injected_ = cudaSuccess;
    followed_ = false;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    position_ = 0;
    then_.reset();
  }
  // Whether the follow-up call came (and failed).
  bool followed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return followed_;
  }
  // The error the failed call returned; cudaSuccess while it has not come.
  cudaError_t injected() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return injected_;
  }
  std::array<std::uint64_t, kinds> counts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }
  // Whether [ptr, ptr + bytes) lies inside live device memory: one allocation, or mappings side
  // by side whose access is set for this device.
  bool inside_live_memory(const void* ptr, std::size_t bytes) const {
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    const auto end = begin + bytes;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.upper_bound(begin);
    if (it != allocations_.begin()) {
      --it;
      if (begin >= it->first && end <= it->first + it->second) return true;
    }
    auto m = mappings_.upper_bound(begin);
    if (m == mappings_.begin()) return false;
    --m;
    for (std::uintptr_t at = begin; at < end; ++m) {
      if (m == mappings_.end() || m->first > at || m->first + m->second.bytes <= at ||
          !m->second.usable) {
        return false;
      }
      at = m->first + m->second.bytes;
    }
    return true;
  }

#define STREAMPOOL_DEVICE_CALL(name, params, args)          \
  cudaError_t name params noexcept override {               \
    const bool fail = enter(Call::name);                    \
    const cudaError_t result = inner().name args;           \
    const auto observe_call = [&](auto... a) noexcept {     \
      observe(Call::name, result, a...);                    \
    };                                                      \
    observe_call args;                                      \
    if (fail) record_injected(result);                      \
    return result;                                          \
  }
#include <streampool/device_calls.def>

 private:
  bool enter(Call call) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t n = ++counts_[static_cast<int>(call)];
    const bool fail = position_ != 0 && call == target_ && n == position_;
    const bool fired = position_ != 0 && counts_[static_cast<int>(target_)] >= position_;
    if (!fail && fired && then_ && call == *then_) {
      then_.reset();
      followed_ = true;
      fake_->fail_next(call, 1);
    }
    if (fail) fake_->fail_next(call, 1);  // FakeDevice's own error for the call, and no effect
    return fail;
  }
  void record_injected(cudaError_t result) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    injected_ = result;
  }
  // The calls that change which device memory is live; every other call changes none.
  void observe(Call call, cudaError_t result, void** ptr, std::size_t bytes) noexcept {
    if (result != cudaSuccess || call != Call::malloc) return;  // vm_reserve: no memory yet
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      allocations_[reinterpret_cast<std::uintptr_t>(*ptr)] = bytes;
    } catch (const std::bad_alloc&) {
    }
  }
  void observe(Call call, cudaError_t result, void* ptr) noexcept {
    if (result != cudaSuccess || call != Call::free) return;
    std::lock_guard<std::mutex> lock(mutex_);
    allocations_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  // A mapping is live memory once vm_set_access names this device (a peer's access alone is
  // not), until it is unmapped.
  void observe(Call call, cudaError_t result, void* ptr, std::size_t bytes,
               streampool::VmHandle) noexcept {
    if (result != cudaSuccess || call != Call::vm_map) return;
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      mappings_[reinterpret_cast<std::uintptr_t>(ptr)] = {bytes, false};
    } catch (const std::bad_alloc&) {
    }
  }
  void observe(Call call, cudaError_t result, void* ptr, std::size_t bytes,
               std::uint64_t devices) noexcept {
    if (result != cudaSuccess || call != Call::vm_set_access ||
        (devices & fake_->own_access()) == 0) {
      return;
    }
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto m = mappings_.lower_bound(begin); m != mappings_.end() && m->first < begin + bytes;
         ++m) {
      m->second.usable = true;
    }
  }
  void observe(Call call, cudaError_t result, void* ptr, std::size_t bytes) noexcept {
    if (result != cudaSuccess || call != Call::vm_unmap) return;
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    mappings_.erase(mappings_.lower_bound(begin), mappings_.lower_bound(begin + bytes));
  }
  template <class... Args>
  void observe(Call, cudaError_t, Args...) noexcept {}

  std::shared_ptr<FakeDevice> fake_;
  mutable std::mutex mutex_;
  struct Mapped {
    std::size_t bytes = 0;
    bool usable = false;  // vm_set_access named this device
  };
  std::map<std::uintptr_t, Mapped> mappings_;  // by address, until unmapped
  std::array<std::uint64_t, kinds> counts_{};
  Call target_ = Call::malloc;
  std::uint64_t position_ = 0;  // 0: no fault armed
  std::optional<Call> then_;
  bool followed_ = false;
  cudaError_t injected_ = cudaSuccess;
  std::map<std::uintptr_t, std::size_t> allocations_;
};

// One run's world: a fake device, the counting device over it, a pool, two streams.
struct World {
  std::shared_ptr<FakeDevice> fake;
  std::shared_ptr<FaultAt> device;
  std::unique_ptr<MemoryPool> pool;
  cudaStream_t a = nullptr;
  cudaStream_t b = nullptr;
  LiveRanges live;
  std::vector<std::string> bad;  // what the buffer checks found

  World(const PoolOptions& options, FakeDevice::Options device_options)
      : fake(std::make_shared<FakeDevice>(device_options)),
        device(std::make_shared<FaultAt>(fake)),
        pool(std::make_unique<MemoryPool>(device, options)),
        a(fake->create_stream()),
        b(fake->create_stream()) {}

  // A returned buffer must lie in live device memory and overlap no live buffer.
  void check(const void* ptr, std::size_t bytes) {
    if (ptr == nullptr) {
      bad.push_back("a null buffer returned without an error");
      return;
    }
    if (!device->inside_live_memory(ptr, bytes)) {
      bad.push_back(fmt::format("{} bytes at {} lie outside live device memory", bytes, ptr));
    }
    const int before = live.overlaps();
    live.add(ptr, bytes);
    if (live.overlaps() != before) bad.push_back(live.first_overlap());
  }
};

// A buffer of the scenario, checked when allocated and forgotten by the checks when dropped.
class Buffer {
 public:
  Buffer(World& w, MemoryPool& pool, std::size_t bytes, cudaStream_t stream)
      : w_(&w), bytes_(Bytes::alloc_async(pool, bytes, stream)) {
    w.check(bytes_.data(), bytes_.byte_size());
  }
  Buffer(World& w, std::size_t bytes, cudaStream_t stream) : Buffer(w, *w.pool, bytes, stream) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() {
    if (!bytes_.is_empty()) w_->live.remove(bytes_.data());
    bytes_.reset();
  }
  // Work on `stream` that writes the whole buffer.
  void write(cudaStream_t stream) {
    w_->fake->launch(stream, {{bytes_.data(), bytes_.byte_size(), true}});
  }
  Bytes& get() { return bytes_; }
  // Hands the buffer over (to a CapturePool): no longer checked for overlap.
  Bytes take() {
    w_->live.remove(bytes_.data());
    return std::move(bytes_);
  }

 private:
  World* w_;
  Bytes bytes_;
};

// A raw allocation of the scenario, checked the same way.
class Raw {
 public:
  Raw(World& w, std::size_t bytes, cudaStream_t stream)
      : w_(w), ptr_(w.pool->allocate(bytes, stream)), bytes_(bytes), stream_(stream) {
    w.check(ptr_, bytes_);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  ~Raw() { free_on(stream_); }
  void free_on(cudaStream_t stream) {
    if (ptr_ == nullptr) return;
    w_.live.remove(ptr_);
    w_.pool->deallocate(std::exchange(ptr_, nullptr), bytes_, stream);
  }
  void* get() const { return ptr_; }

 private:
  World& w_;
  void* ptr_;
  std::size_t bytes_;
  cudaStream_t stream_;
};

// Ends the capture on `stream` if the scenario left it capturing with `capture` when an error
// passed, discarding the graph, as a caller's handler would.
class EndCaptureOnError {
 public:
  EndCaptureOnError(std::shared_ptr<CapturePool> capture, cudaStream_t stream)
      : capture_(std::move(capture)), stream_(stream), exceptions_(std::uncaught_exceptions()) {}
  EndCaptureOnError(const EndCaptureOnError&) = delete;
  EndCaptureOnError& operator=(const EndCaptureOnError&) = delete;
  ~EndCaptureOnError() {
    if (std::uncaught_exceptions() == exceptions_ || !armed_) return;
    try {
      CapturedGraph discarded = streampool::end_capture_with_pool(stream_, capture_);
    } catch (const Error&) {
    }
  }
  void ended() { armed_ = false; }

 private:
  std::shared_ptr<CapturePool> capture_;
  cudaStream_t stream_;
  int exceptions_;
  bool armed_ = true;
};

// --- the scenarios -------------------------------------------------------------------------

PoolOptions matrix_options() {
  auto options = test_options();
  // No clock in the pool's decisions: every run makes the same calls in the same order.
  options.unfenced_us = 0;
  options.idle_ms = 0;
  options.segment_bytes = 4 * MiB;
  return options;
}

// Small and large allocations on one stream, through PooledBuffer and the raw API; reused.
void allocation(World& w) {
  for (int round = 0; round < 2; ++round) {
    Buffer small(w, 3000, w.a);
    Buffer large(w, 1 * MiB, w.a);
    Raw raw(w, 700 * KiB, w.a);
    small.write(w.a);
    large.write(w.a);
  }
}

// Allocations that each need a new segment or slab, all live at once.
void growth(World& w) {
  std::vector<std::unique_ptr<Buffer>> held;
  for (std::size_t i = 0; i < 5; ++i) {
    held.push_back(std::make_unique<Buffer>(w, 3 * MiB + i * 256 * KiB, w.a));
    held.push_back(std::make_unique<Buffer>(w, 1000 + i * 20 * KiB, w.a));
    held.back()->write(w.a);
  }
}

// A peer given access between two growths (MemoryPool::grant_access): the memory of both is
// the peer's too, mapped or from cudaMalloc.
void peer_access(World& w) {
  Buffer before(w, 3 * MiB, w.a);
  before.write(w.a);
  w.pool->grant_access(1);
  Buffer after(w, 5 * MiB, w.a);
  after.write(w.a);
  for (Buffer* buffer : {&before, &after}) {
    if (!w.fake->accessible_from(buffer->get().data(), 1)) {
      w.bad.push_back(fmt::format("a buffer at {} is not the peer's",
                                  static_cast<void*>(buffer->get().data())));
    }
  }
}

// One stream, expandable segments: a growth that finds a mapping the stream freed with its work
// pending (one stream records no fence) waits for the stream, then unmaps that mapping before it
// maps ("Waiting for one's own" in docs/design.md). With cudaMalloc segments, growths alone.
void growth_wait(World& w) {
  std::optional<Buffer> left(std::in_place, w, 20 * MiB, w.a);
  Buffer right(w, 20 * MiB, w.a);
  left->write(w.a);
  left.reset();
  Buffer big(w, 30 * MiB, w.a);
  big.write(w.a);
}

// Blocks dropped on A go to B once A's fence completes (small from A's list, large from the
// arena); with cross_stream_wait, B waits on A's fence instead of growing.
void cross_stream(World& w) {
  {
    Buffer small(w, 3000, w.a);
    Buffer large(w, 2 * MiB, w.a);
    small.write(w.a);
    large.write(w.a);
  }
  {
    Buffer small(w, 3000, w.b);  // A's are pending: B asks A for a fence
    Buffer large(w, 2 * MiB, w.b);
    small.write(w.b);
    large.write(w.b);
  }
  Buffer fenced(w, 3000, w.a);  // A's next call records the fence B asked for
  fenced.write(w.a);
  w.fake->complete_all();
  Buffer small(w, 3000, w.b);
  Buffer large(w, 2 * MiB, w.b);
  small.write(w.b);
  large.write(w.b);
}

void cross_stream_wait(World& w) {
  {
    Buffer small(w, 3000, w.a);
    Buffer large(w, 2 * MiB, w.a);
    small.write(w.a);
    large.write(w.a);
  }  // fenced at once (fence_every_free), the fences pending
  Buffer small(w, 3000, w.b);
  Buffer large(w, 2 * MiB, w.b);
  small.write(w.b);
  large.write(w.b);
}

// A buffer used on a second stream (record_stream), dropped while both streams' work pends.
void record_stream(World& w) {
  for (std::size_t bytes : {std::size_t{3000}, 2 * MiB}) {
    {
      Buffer shared(w, bytes, w.a);
      shared.write(w.a);
      fake_test::order_after(*w.fake, w.b, w.a);
      shared.get().record_stream(w.b);
      shared.write(w.b);
    }
    Buffer on_a(w, bytes, w.a);
    on_a.write(w.a);
    Buffer on_b(w, bytes, w.b);
    on_b.write(w.b);
  }
  w.fake->complete_all();
  Buffer after(w, 3000, w.b);
}

// The out-of-memory ladder: a request the device has no room for until A's cached (pending)
// ranges come back through a device synchronize and their segments are freed; then one the
// device can never hold fails with out_of_memory, its message naming the figures.
void out_of_memory(World& w) {
  {
    std::vector<std::unique_ptr<Buffer>> held;
    for (int i = 0; i < 5; ++i) {
      held.push_back(std::make_unique<Buffer>(w, 4 * MiB, w.a));
      held.back()->write(w.a);
    }
  }
  Buffer big(w, 12 * MiB, w.b);
  big.write(w.b);
  try {
    Buffer never(w, 64 * MiB, w.b);
    w.bad.push_back("64 MiB allocated on a 24 MiB device");
  } catch (const Error& e) {
    if (e.errc() != Errc::out_of_memory) throw;
    // The device allocation that refused last: a segment, or (expandable) a reservation, the
    // physical memory or its mapping; after a failed granularity query, segments again.
    const std::string what = e.what();
    bool named = false;
    for (const char* call : {"cudaMalloc", "cuMemCreate", "cuMemMap", "cuMemAddressReserve"}) {
      named = named || what.find(call) != std::string::npos;
    }
    if (!named) {
      w.bad.push_back("out of memory without naming the device allocation that refused: " + what);
    }
  }
}

// Two captures with a CapturePool: global mode within its reservation, relaxed mode growing;
// the graphs uploaded and launched.
void capture(World& w) {
  auto capture = std::make_shared<CapturePool>(*w.pool);
  capture->reserve(1 * MiB);
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::relaxed}) {
    streampool::begin_capture_with_pool(capture, w.a, mode);
    EndCaptureOnError guard(capture, w.a);
    {
      Buffer inside(w, 64 * KiB, w.a);
      inside.write(w.a);
      if (mode == CaptureMode::relaxed) {
        Buffer grown(w, 3 * MiB, w.a);
        grown.write(w.a);
      }
    }
    guard.ended();
    CapturedGraph graph = streampool::end_capture_with_pool(w.a, capture);
    graph.upload(w.a);
    graph.launch(w.a);
    w.fake->complete_all();
  }
}

// A graph outlives its CapturedGraph and its CapturePool handle: its last replay completing
// releases the pool, whose buffers and private memory come back at the next safe point (trim).
void graph_release(World& w) {
  Buffer before(w, 8 * KiB, w.a);
  before.write(w.a);
  {
    auto capture = std::make_shared<CapturePool>(*w.pool);
    capture->reserve(2 * MiB);
    capture->record_buffer(before.take());
    streampool::begin_capture_with_pool(capture, w.a);
    EndCaptureOnError guard(capture, w.a);
    {
      Buffer inside(w, 64 * KiB, w.a);
      inside.write(w.a);
    }
    guard.ended();
    CapturedGraph graph = streampool::end_capture_with_pool(w.a, capture);
    graph.launch(w.a);
    graph.launch(w.a);
  }  // the replays still pending hold the pool
  w.fake->complete_all();
  w.pool->trim();
  Buffer after(w, 2 * MiB, w.b);
}

// trim with cached small and large blocks on two streams, some pending; then allocations again.
void trim(World& w) {
  {
    Buffer small_a(w, 3000, w.a);
    Buffer large_a(w, 2 * MiB, w.a);
    Buffer large_b(w, 5 * MiB, w.b);
    small_a.write(w.a);
    large_b.write(w.b);
  }
  Buffer kept(w, 1 * MiB, w.a);
  w.pool->trim(4 * MiB);
  w.pool->trim();
  Buffer again(w, 5 * MiB, w.b);
  again.write(w.b);
}

// release_stream waits for the released stream's last fence; its blocks go anywhere then.
void release_stream(World& w) {
  {
    Buffer small(w, 3000, w.a);
    Buffer large(w, 2 * MiB, w.a);
    small.write(w.a);
    large.write(w.a);
    Buffer other(w, 3000, w.b);  // a second stream: drops on A are fenced
  }
  w.pool->release_stream(w.a);
  Buffer small(w, 3000, w.b);
  Buffer large(w, 2 * MiB, w.b);
  small.write(w.b);
  large.write(w.b);
}

// A pool of its own destroyed with cached memory, pending work, fences and a live buffer; the
// core goes when that buffer is dropped. Its faults cannot be reported (destructors): a free or
// event destroy CUDA refuses is tried again at the next safe point.
void pool_destruction(World& w) {
  auto options = matrix_options();
  options.fence_every_free = true;
  std::optional<Buffer> survivor;
  {
    MemoryPool pool(w.device, options);
    Buffer small(w, pool, 3000, w.a);
    Buffer large(w, pool, 2 * MiB, w.b);
    small.write(w.a);
    large.write(w.b);
    small.reset();
    large.reset();
    survivor.emplace(w, pool, 64 * KiB, w.a);
    survivor->write(w.a);
  }
  survivor.reset();
}

struct Scenario {
  const char* name;
  void (*run)(World&);
  PoolOptions options = matrix_options();
  FakeDevice::Options device = {};
  bool uses_world_pool = true;  // false: makes a pool of its own
};

Scenario with(Scenario s, const std::function<void(Scenario&)>& change) {
  change(s);
  return s;
}

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> table{
      {"allocation", allocation},
      {"growth", growth},
      with({"growth that waits for its stream", growth_wait},
           [](Scenario& s) {
             s.options.segment_bytes = 20 * MiB;
             s.options.large_shelf = 0;  // every drop goes back to the arena
           }),
      {"cross-stream reuse", cross_stream},
      with({"cross-stream wait", cross_stream_wait},
           [](Scenario& s) {
             s.options.cross_stream_wait = true;
             s.options.fence_every_free = true;
           }),
      {"record_stream", record_stream},
      with({"out-of-memory ladder", out_of_memory},
           [](Scenario& s) { s.device.capacity = 24 * MiB; }),
      {"capture", capture},
      {"graph release", graph_release},
      {"trim", trim},
      {"release_stream", release_stream},
      with({"peer access", peer_access}, [](Scenario& s) { s.device.peers = 0b10; }),
      with({"pool destruction", pool_destruction}, [](Scenario& s) { s.uses_world_pool = false; }),
  };
  return table;
}

// --- the runs ------------------------------------------------------------------------------

// Runs the scenario; the Error it throws, if any. Anything else thrown fails the test.
std::optional<Error> attempt(const Scenario& scenario, World& w) {
  try {
    scenario.run(w);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

bool capturing(World& w, cudaStream_t s) {
  CaptureStatus status = CaptureStatus::none;
  w.fake->capture_info(s, &status, nullptr);
  return status != CaptureStatus::none;
}

// Everything the world took from the device is back once its pool is gone and the library's
// next safe point (a new pool, then the graph releases) has passed.
void require_nothing_leaked(World& w) {
  w.pool.reset();
  streampool::complete_graph_releases();
  { MemoryPool safe_point(w.device, test_options()); }
  streampool::complete_graph_releases();
  CHECK(w.fake->live_bytes() == 0);
  CHECK(w.fake->live_allocations() == 0);
  CHECK(w.fake->live_events() == 0);
  CHECK(w.fake->live_user_objects() == 0);
}

struct Counted {
  std::array<std::uint64_t, kinds> calls{};
  std::uint64_t blocking_fallbacks = 0;
};

// The fault-free run: what it calls, and that it passes every check itself.
Counted count_calls(const Scenario& scenario) {
  World w(scenario.options, scenario.device);
  const auto before = w.device->counts();
  const std::optional<Error> error = attempt(scenario, w);
  INFO((error ? std::string(error->what()) : std::string("no error")));
  REQUIRE_FALSE(error);
  const auto after = w.device->counts();
  Counted counted;
  for (int k = 0; k < kinds; ++k) counted.calls[k] = after[k] - before[k];
  counted.blocking_fallbacks = w.pool->stats().blocking_fallbacks;
  INFO(first_hazard(*w.fake));
  CHECK(w.fake->hazards().empty());
  CHECK(w.bad.empty());
  require_nothing_leaked(w);
  return counted;
}

// Calls the library makes only after another failed, as its fallback: failed too, in runs of
// their own, after each failure of the call they follow.
struct FollowUp {
  Call first;
  Call then;
};
constexpr std::array<FollowUp, 3> follow_ups{{
    {Call::event_create, Call::stream_synchronize},  // no fence: wait for the stream instead
    {Call::event_record, Call::stream_synchronize},
    {Call::graph_retain_user_object, Call::user_object_release},  // the reference given back
}};

// One run with the `position`th call of `call` failing (and then the next call of `then`);
// whether that follow-up came.
bool run_with_fault(const Scenario& scenario, const Counted& clean, Call call,
                    std::uint64_t position, std::optional<Call> then = std::nullopt) {
  const auto kind = static_cast<int>(call);
  INFO("scenario " << scenario.name << ": call " << position << " of "
                   << clean.calls[kind] << " to " << cuda_names[kind] << " fails"
                   << (then ? std::string(", then the next to ") +
                                  cuda_names[static_cast<int>(*then)]
                            : std::string()));
  World w(scenario.options, scenario.device);
  w.device->arm(call, position, then);
  const std::optional<Error> error = attempt(scenario, w);
  const bool followed = w.device->followed();
  w.device->disarm();
  const cudaError_t injected = w.device->injected();
  REQUIRE(injected != cudaSuccess);  // the call came, and failed

  if (error) {
    INFO("the error: " << error->what());
    CHECK(error->cuda_error() == injected);
    CHECK_THAT(error->what(), Catch::Contains(cuda_names[kind]));
  } else if (scenario.uses_world_pool && !then &&
             (call == Call::event_create || call == Call::event_record)) {
    // No fence could be made: the pool waited for the stream instead, and counted it.
    CHECK(w.pool->stats().blocking_fallbacks > clean.blocking_fallbacks);
  }
  for (const std::string& what : w.bad) FAIL_CHECK(what);
  w.bad.clear();
  CHECK_FALSE(capturing(w, w.a));
  CHECK_FALSE(capturing(w, w.b));

  // The fault cleared, the same scenario on the same pool.
  w.fake->complete_all();
  const std::optional<Error> again = attempt(scenario, w);
  if (again) FAIL_CHECK("the scenario failed again once the fault cleared: " << again->what());
  for (const std::string& what : w.bad) FAIL_CHECK(what);
  INFO(first_hazard(*w.fake));
  CHECK(w.fake->hazards().empty());
  w.fake->complete_all();
  require_nothing_leaked(w);
  return followed;
}

}  // namespace

TEST_CASE("fault matrix: every device call of each scenario fails in turn; nothing leaks, no bad "
          "pointer, a clear error, and the pool works again",
          "[faults][matrix]") {
  for (const Scenario& base : scenarios()) for (const bool expandable : {true, false}) {
    Scenario scenario = base;
    scenario.options.expandable_segments = expandable;
    DYNAMIC_SECTION(scenario.name
                    << (expandable ? ", expandable segments" : ", cudaMalloc segments")) {
      const Counted clean = count_calls(scenario);
      std::uint64_t runs = 0;
      std::uint64_t follow_up_runs = 0;
      for (int k = 0; k < kinds; ++k) {
        for (std::uint64_t n = 1; n <= clean.calls[k]; ++n) {
          run_with_fault(scenario, clean, static_cast<Call>(k), n);
          ++runs;
          for (const FollowUp& f : follow_ups) {
            if (f.first != static_cast<Call>(k)) continue;
            run_with_fault(scenario, clean, f.first, n, f.then);
            ++follow_up_runs;
          }
        }
      }
      WARN(scenario.name << ": " << runs << " runs, " << follow_up_runs << " with a follow-up");
    }
  }
}

TEST_CASE("the fault matrix fails every kind of device call: in the scenarios, or after the call "
          "its fallback follows",
          "[faults][matrix]") {
  std::array<std::uint64_t, kinds> made{};
  for (const Scenario& base : scenarios()) for (const bool expandable : {true, false}) {
    Scenario scenario = base;
    scenario.options.expandable_segments = expandable;
    const Counted clean = count_calls(scenario);
    for (int k = 0; k < kinds; ++k) made[k] += clean.calls[k];
    for (const FollowUp& f : follow_ups) {
      if (clean.calls[static_cast<int>(f.first)] == 0) continue;
      if (run_with_fault(scenario, clean, f.first, 1, f.then)) ++made[static_cast<int>(f.then)];
    }
  }
  for (int k = 0; k < kinds; ++k) {
    CAPTURE(cuda_names[k]);
    CHECK(made[k] > 0);
  }
}

// Review of 9ed639b: the matrix's record of live memory (FaultAt::inside_live_memory) after a
// grant. grant_access gives the peer one cuMemSetAccess over a run of adjacent mappings; trim then
// unmaps the middle mapping of that run. The record must say the hole is not live memory (else a
// buffer the pool handed out there would pass the matrix's check).
TEST_CASE("fault matrix record: a mapping unmapped inside a run a grant gave the peer is not "
          "live") {
  FakeDevice::Options device_options;
  device_options.peers = 0b10;
  auto fake = std::make_shared<FakeDevice>(device_options);
  auto device = std::make_shared<FaultAt>(fake);
  PoolOptions options = test_options();
  options.expandable_segments = true;
  MemoryPool pool(device, options);
  cudaStream_t s = fake->create_stream();
  constexpr std::size_t MiB = std::size_t{1} << 20;
  auto x = Bytes::alloc_async(pool, 4 * MiB, s);
  auto y = Bytes::alloc_async(pool, 4 * MiB, s);
  auto z = Bytes::alloc_async(pool, 4 * MiB, s);
  REQUIRE(y.data() == x.data() + 4 * MiB);  // one reservation, three adjacent mappings
  REQUIRE(z.data() == y.data() + 4 * MiB);
  pool.grant_access(1);  // one cuMemSetAccess for device 1 over the three
  std::byte* const hole = y.data();
  y.reset();
  pool.trim();  // unmaps y's mapping
  REQUIRE(pool.stats().reserved_bytes.current == static_cast<std::int64_t>(8 * MiB));
  REQUIRE_FALSE(fake->accessible_from(hole, 0));  // the fake: nothing mapped there
  CHECK_FALSE(device->inside_live_memory(hole, 1));  // the matrix's record says the same
}

// The record counts a cuMemSetAccess that named only the peer as the pool's own access.
TEST_CASE("fault matrix record: a mapping only the peer was given access to is not the device's") {
  FakeDevice::Options device_options;
  device_options.peers = 0b10;
  auto fake = std::make_shared<FakeDevice>(device_options);
  FaultAt device(fake);
  std::size_t granule = 0;
  REQUIRE(device.vm_granularity(&granule) == cudaSuccess);
  void* base = nullptr;
  REQUIRE(device.vm_reserve(&base, granule) == cudaSuccess);
  streampool::VmHandle handle = 0;
  REQUIRE(device.vm_create(&handle, granule) == cudaSuccess);
  REQUIRE(device.vm_map(base, granule, handle) == cudaSuccess);
  REQUIRE(device.vm_set_access(base, granule, 0b10) == cudaSuccess);  // device 1 only
  REQUIRE_FALSE(fake->accessible_from(base, 0));  // device 0's kernels would fault
  CHECK_FALSE(device.inside_live_memory(base, 1));
  REQUIRE(device.vm_unmap(base, granule) == cudaSuccess);
  REQUIRE(device.vm_release(handle) == cudaSuccess);
  REQUIRE(device.vm_unreserve(base, granule) == cudaSuccess);
}
