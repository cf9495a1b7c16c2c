// FakeDevice: the simulation behind fake_device.hpp.
//
// The data model, all of it in State and under State::mutex:
//
//   streams       StreamId -> Stream: its queue of pending Work, the sequence numbers of the last
//                 work it enqueued and completed, the clock of what its next work must follow, and
//                 its capture, if any. `handles` maps created streams' handles to ids; the legacy
//                 stream and each thread's per-thread stream have an id but no handle. A destroyed
//                 stream stays until its queue drains, so that its work can still complete.
//   events        handle -> the clock of the work the last record covers, or "captured".
//   allocations   base address -> bytes (malloc's); `reservations`, base address -> bytes and
//                 the mappings in it; `physical`, handle -> bytes, mappings, released;
//                 `access_log`, an interval map over addresses, holds per
//                 byte range the last write and the reads since it, for the race check.
//   graphs, execs captured Items, and the user objects each holds a reference on.
//
// Work (s, n) is the n-th unit enqueued on stream s, n counting from 1. It is complete once
// streams[s].completed >= n, or once s is gone (a destroyed stream leaves only when drained).
// A Clock maps stream ids to sequence numbers: work W of stream s follows (p, n) when p == s and
// n < W's seq, or when W's clock[p] >= n. Entries for completed work may be dropped from any
// clock: completed work neither blocks nor races, so such an entry says nothing. Completion and
// the race check both read the same clocks, so an event wait orders work for both at once.
//
// Bodies and user-object destructors run with `mutex` released, since they may call back in.
// `completion_mutex` (recursive, for bodies that complete work themselves) serializes
// completions, so bodies run in stream order even when several threads complete work at once.
#include <streampool/fake_device.hpp>

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

namespace streampool {
namespace {

using Call = FakeDevice::Call;
using Access = FakeDevice::Access;
using Hazard = FakeDevice::Hazard;
using Clock = std::map<StreamId, std::uint64_t>;

// cudaMalloc's alignment guarantee.
constexpr std::size_t alignment = 256;
// Where simulated (not host-backed) allocations start: far from the null page, and recognisable
// in a hazard message.
constexpr std::uintptr_t first_device_address = 0x7f0000000000;
// Each ordinal's allocations start a window further, as CUDA's unified address space gives every
// GPU its own range: pointers of two fakes never compare equal, so a pointer handed to the wrong
// device's pool is not mistaken for one of its own (as long as each fake allocates under 1 TiB in
// all: addresses are never reused).
constexpr std::uintptr_t device_window = std::uintptr_t{1} << 40;

std::uintptr_t first_address_of(int ordinal) noexcept {
  return first_device_address +
         device_window * static_cast<std::uintptr_t>(ordinal < 0 ? 0 : ordinal);
}
// Stream handles look like small pointers, clear of 0, cudaStreamLegacy (0x1) and
// cudaStreamPerThread (0x2). Events, graphs, executable graphs and user objects share one
// counter in another range, so a handle of one kind is never mistaken for another kind's.
constexpr std::uintptr_t first_stream_handle = 0x1000;
constexpr std::uintptr_t first_object_handle = 0x5e0000000000;
constexpr std::uintptr_t handle_stride = 16;

// Program-wide, like CUDA's: ids of different FakeDevices never collide either.
std::atomic<StreamId> next_stream_id{1};
std::atomic<CaptureId> next_capture_id{1};
// Keys the per-thread streams: an instance number, unlike the FakeDevice's address, is never
// reused by a later FakeDevice.
std::atomic<std::uint64_t> next_instance{1};

// FakeDevice instance -> the stream cudaStreamPerThread names in this thread.
thread_local std::unordered_map<std::uint64_t, StreamId> per_thread_streams;
// Non-zero while this thread runs a user object's destructor, where CUDA forbids CUDA calls.
thread_local int in_user_object_destructor = 0;

std::uintptr_t address_of(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

std::size_t round_up(std::size_t bytes, std::size_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

bool is_legacy(cudaStream_t stream) { return stream == nullptr || stream == cudaStreamLegacy; }

cudaError_t default_error(Call call) {
  switch (call) {
    case Call::malloc:
    case Call::vm_reserve:
    case Call::vm_create:
    case Call::vm_map:
    case Call::event_create:
    case Call::graph_instantiate:
    case Call::user_object_create:
      return cudaErrorMemoryAllocation;
    default:
      return cudaErrorLaunchFailure;
  }
}

// A unit of captured work, replayed by each launch of the graph.
struct Item {
  std::vector<Access> accesses;
  std::function<void()> body;
};

struct Work {
  std::uint64_t seq = 0;
  Clock follows;  // other streams' work that must complete first
  std::function<void()> body;
};

struct Capture {
  CaptureId id = 0;
  CaptureMode mode = CaptureMode::global;
  std::thread::id thread;
  bool invalidated = false;
  std::vector<Item> items;
};

struct Stream {
  StreamId id = 0;
  std::uint64_t enqueued = 0;   // seq of the last work enqueued
  std::uint64_t completed = 0;  // seq of the last work completed; work completes in order
  Clock follows;                // what work enqueued from now on follows, on other streams
  std::deque<Work> queue;
  std::optional<Capture> capture;
  bool destroyed = false;
};

struct Event {
  bool captured = false;
  Clock covers;  // empty when never recorded: such an event is complete
  CaptureId capture = 0;  // the capture it was last recorded in, when `captured`
};

struct Allocation {
  std::size_t bytes = 0;
  std::size_t mapped = 0;  // bytes of host memory behind it (host-backed only)
};

struct VmMapping {
  std::size_t bytes = 0;
  VmHandle handle = 0;
  bool accessible = false;
};

struct Reservation {
  std::size_t bytes = 0;
  std::map<std::uintptr_t, VmMapping> mappings;  // by address
};

struct PhysicalMemory {
  std::size_t bytes = 0;
  int mappings = 0;
  bool released = false;
};

struct UserObject {
  void* ptr = nullptr;
  cudaHostFn_t destroy = nullptr;
  int references = 0;
};

struct Graph {
  std::vector<Item> items;
  std::vector<cudaUserObject_t> retained;  // one reference each; an object may appear twice
};

struct Exec {
  std::vector<Item> items;
  std::vector<cudaUserObject_t> retained;
  std::uint64_t launches = 0;
  std::vector<std::pair<StreamId, std::uint64_t>> in_flight;  // the last work of each launch
};

struct Destructor {
  cudaHostFn_t destroy;
  void* ptr;
};
using Destructors = std::vector<Destructor>;

// Runs destructors of user objects whose last reference went, with no lock of the fake held.
void run_destructors(const Destructors& destructors) {
  ++in_user_object_destructor;
  for (const Destructor& d : destructors) d.destroy(d.ptr);
  --in_user_object_destructor;
}

// The race detector's memory: for each byte range touched, the last write and the reads since.
class AccessLog {
 public:
  // An access by work (stream, seq).
  struct Touch {
    StreamId stream = 0;
    std::uint64_t seq = 0;
  };
  // An earlier access a new one races with, and the bytes they share.
  struct Race {
    Touch earlier;
    bool earlier_write = false;
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
  };

  // Records an access to [begin, end) by `touch` and returns the earlier accesses it races with:
  // those to the same bytes, one of the two a write, that `ordered(earlier)` says the new access
  // is not ordered after. One Race per earlier access, however many ranges they share.
  template <class Ordered>
  std::vector<Race> record(Touch touch, std::uintptr_t begin, std::uintptr_t end, bool write,
                           Ordered ordered) {
    std::vector<Race> races;
    auto check = [&](const Touch& earlier, bool earlier_write, std::uintptr_t lo,
                     std::uintptr_t hi) {
      if (ordered(earlier)) return;
      for (Race& race : races) {
        if (race.earlier.stream == earlier.stream && race.earlier.seq == earlier.seq &&
            race.earlier_write == earlier_write) {
          race.begin = std::min(race.begin, lo);
          race.end = std::max(race.end, hi);
          return;
        }
      }
      races.push_back({earlier, earlier_write, lo, hi});
    };

    split(begin);
    split(end);
    auto it = segments_.lower_bound(begin);
    for (std::uintptr_t at = begin; at < end; ++it) {
      if (it == segments_.end() || it->first > at) {  // a gap never touched: fill it
        const std::uintptr_t gap_end = it == segments_.end() ? end : std::min(end, it->first);
        it = segments_.emplace_hint(it, at, Segment{gap_end, {}, {}});
      }
      Segment& segment = it->second;
      if (segment.write) check(*segment.write, true, at, segment.end);
      if (write) {
        for (const Touch& read : segment.reads) check(read, false, at, segment.end);
        segment.write = touch;
        segment.reads.clear();
      } else {
        // A read stands for the earlier reads of its stream: it completes after them, and
        // whatever is ordered after it is ordered after them.
        std::erase_if(segment.reads,
                      [&](const Touch& read) { return read.stream == touch.stream; });
        segment.reads.push_back(touch);
      }
      at = segment.end;
    }
    return races;
  }

  // Freed memory is never allocated again: what touched it no longer matters.
  void forget(std::uintptr_t begin, std::uintptr_t end) {
    split(begin);
    split(end);
    segments_.erase(segments_.lower_bound(begin), segments_.lower_bound(end));
  }

 private:
  struct Segment {  // [key, end)
    std::uintptr_t end = 0;
    std::optional<Touch> write;
    std::vector<Touch> reads;  // since `write`, at most one per stream
  };

  // Cuts the segment that straddles `at` in two, so that a range can start or end there.
  void split(std::uintptr_t at) {
    auto it = segments_.upper_bound(at);
    if (it == segments_.begin()) return;
    --it;
    if (it->first < at && at < it->second.end) {
      Segment tail = it->second;
      it->second.end = at;
      segments_.emplace(at, std::move(tail));
    }
  }

  std::map<std::uintptr_t, Segment> segments_;
};

}  // namespace

struct FakeDevice::State {
  explicit State(Options o) : options(o), auto_complete(o.auto_complete) {
    legacy = new_stream().id;
  }
  ~State() {
    for (const auto& [base, allocation] : allocations) {
      if (allocation.mapped > 0) retired_mappings.emplace_back(base, allocation.mapped);
    }
    for (const auto& [base, mapped] : retired_mappings) {
      ::munmap(reinterpret_cast<void*>(base), mapped);
    }
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  const Options options;
  const std::uint64_t instance = next_instance.fetch_add(1);
  mutable std::mutex mutex;
  std::recursive_mutex completion_mutex;  // taken before `mutex`, never after

  bool auto_complete;
  std::size_t capacity = options.capacity;
  std::size_t live_bytes = 0;
  std::uintptr_t next_address = first_address_of(options.ordinal);
  std::map<std::uintptr_t, Allocation> allocations;
  std::map<std::uintptr_t, Reservation> reservations;
  std::unordered_map<VmHandle, PhysicalMemory> physical;
  VmHandle next_vm_handle = 1;
  // Freed host-backed ranges stay mapped (inaccessible) until the end, so that no later
  // allocation gets their addresses and a body touching freed memory faults.
  std::vector<std::pair<std::uintptr_t, std::size_t>> retired_mappings;
  AccessLog access_log;

  std::map<StreamId, Stream> streams;
  std::unordered_map<cudaStream_t, StreamId> handles;
  std::vector<cudaStream_t> free_handles;  // LIFO: the last destroyed handle is reused first
  std::uintptr_t next_stream_handle = first_stream_handle;
  StreamId legacy = 0;

  std::uintptr_t next_object_handle = first_object_handle;
  std::unordered_map<cudaEvent_t, Event> events;
  std::unordered_map<cudaGraph_t, Graph> graphs;
  std::unordered_map<cudaGraphExec_t, Exec> execs;
  std::vector<Exec> retiring;  // destroyed executables whose launches are still in flight
  std::unordered_map<cudaUserObject_t, UserObject> user_objects;

  std::uint64_t calls[call_kinds] = {};
  struct Fault {
    int remaining = 0;
    cudaError_t error = cudaSuccess;
  } faults[call_kinds];
  std::vector<Hazard> hazards;

  // --- seam-call bookkeeping --------------------------------------------------------------

  // Counts the call, then decides whether it fails before doing anything.
  cudaError_t enter(Call call) {
    const auto kind = static_cast<int>(call);
    ++calls[kind];
    if (in_user_object_destructor > 0) {
      hazards.push_back({Hazard::Kind::call_in_user_object_destructor,
                         fmt::format("{} called from a user object's destructor, where CUDA "
                                     "forbids CUDA calls",
                                     call_name(call))});
      return cudaErrorNotPermitted;
    }
    if (faults[kind].remaining > 0) {
      --faults[kind].remaining;
      return faults[kind].error;
    }
    return cudaSuccess;
  }

  // For a call CUDA considers unsafe during capture: an active global capture, whoever began it,
  // or an active thread-local one begun by this thread, refuses it and is invalidated (as CUDA
  // does, seen on the H200). Relaxed captures restrict nobody.
  // Querying or waiting for an event recorded in a capture: refused, and the capture it was
  // recorded in is invalidated (seen on the H200), whatever its mode.
  cudaError_t refuse_captured_event(const Event& event) {
    for (auto& [id, stream] : streams) {
      if (stream.capture && stream.capture->id == event.capture) stream.capture->invalidated = true;
    }
    return cudaErrorCapturedEvent;
  }

  cudaError_t refuse_if_restricted() {
    bool refused = false;
    for (auto& [id, stream] : streams) {
      if (!stream.capture || stream.capture->invalidated) continue;
      Capture& c = *stream.capture;
      if (c.mode == CaptureMode::global ||
          (c.mode == CaptureMode::thread_local_ && c.thread == std::this_thread::get_id())) {
        c.invalidated = true;
        refused = true;
      }
    }
    return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
  }

  // --- streams ----------------------------------------------------------------------------

  Stream& new_stream() {
    const StreamId id = next_stream_id.fetch_add(1);
    Stream& stream = streams[id];
    stream.id = id;
    return stream;
  }

  // The stream a handle names in the calling thread; null for an unknown or destroyed handle.
  Stream* find_stream(cudaStream_t handle) {
    if (is_legacy(handle)) return &streams.at(legacy);
    if (handle == cudaStreamPerThread) {
      auto it = per_thread_streams.find(instance);
      if (it == per_thread_streams.end()) {
        it = per_thread_streams.emplace(instance, new_stream().id).first;
      }
      return &streams.at(it->second);
    }
    auto it = handles.find(handle);
    return it == handles.end() ? nullptr : &streams.at(it->second);
  }

  // Controls are the test's own calls: naming a stream that does not exist is a bug in the test.
  Stream& control_stream(cudaStream_t handle, const char* control) {
    if (Stream* stream = find_stream(handle)) return *stream;
    throw std::invalid_argument(fmt::format("FakeDevice::{}: unknown or destroyed stream {}",
                                            control, fmt::ptr(handle)));
  }

  bool done(StreamId stream, std::uint64_t seq) const {
    auto it = streams.find(stream);
    return it == streams.end() || it->second.completed >= seq;
  }

  void forget_done(Clock& clock) const {
    std::erase_if(clock, [&](const auto& entry) { return done(entry.first, entry.second); });
  }

  // Everything the work enqueued on `stream` so far follows, itself included.
  Clock snapshot(const Stream& stream) const {
    Clock clock = stream.follows;
    if (stream.completed < stream.enqueued) clock[stream.id] = stream.enqueued;
    forget_done(clock);
    return clock;
  }

  bool complete(const Clock& clock) const {
    return std::all_of(clock.begin(), clock.end(),
                       [&](const auto& entry) { return done(entry.first, entry.second); });
  }

  // --- work -------------------------------------------------------------------------------

  std::uint64_t enqueue(Stream& stream, const std::vector<Access>& accesses,
                        std::function<void()> body) {
    const std::uint64_t seq = ++stream.enqueued;
    for (const Access& access : accesses) check_access(stream, seq, access);
    forget_done(stream.follows);
    stream.queue.push_back(Work{seq, stream.follows, std::move(body)});
    return seq;
  }

  // The stream whose first pending work must complete next on the way to completing (id, seq):
  // that stream itself, or, depth first, the stream of work its first pending work follows.
  // Null once (id, seq) is complete.
  Stream* next_to_complete(StreamId id, std::uint64_t seq) {
    std::vector<std::pair<StreamId, std::uint64_t>> goals{{id, seq}};
    while (!goals.empty()) {
      const auto [goal_stream, goal_seq] = goals.back();
      auto it = streams.find(goal_stream);
      if (it == streams.end() || it->second.completed >= goal_seq || it->second.queue.empty()) {
        goals.pop_back();
        continue;
      }
      const Clock& follows = it->second.queue.front().follows;
      auto blocker = std::find_if(follows.begin(), follows.end(), [&](const auto& entry) {
        return !done(entry.first, entry.second);
      });
      if (blocker == follows.end()) return &it->second;
      goals.emplace_back(*blocker);
    }
    return nullptr;
  }

  // Completes (id, seq) and everything it follows, one unit at a time: the body runs with
  // `mutex` released and the search starts over after it, since a body may change anything.
  void complete_through(StreamId id, std::uint64_t seq) {
    std::lock_guard serial(completion_mutex);
    for (;;) {
      std::function<void()> body;
      Destructors destructors;
      {
        std::lock_guard lock(mutex);
        Stream* stream = next_to_complete(id, seq);
        if (stream == nullptr) return;
        Work work = std::move(stream->queue.front());
        stream->queue.pop_front();
        stream->completed = work.seq;
        if (stream->destroyed && stream->queue.empty()) streams.erase(stream->id);
        retire_executables(destructors);
        body = std::move(work.body);
      }
      if (body) body();
      run_destructors(destructors);
    }
  }

  void complete_everything() {
    for (;;) {
      std::pair<StreamId, std::uint64_t> target;
      {
        std::lock_guard lock(mutex);
        auto it = std::find_if(streams.begin(), streams.end(),
                               [](const auto& entry) { return !entry.second.queue.empty(); });
        if (it == streams.end()) return;
        target = {it->first, it->second.enqueued};
      }
      complete_through(target.first, target.second);
    }
  }

  void complete_clock(const Clock& clock) {
    for (const auto& [stream, seq] : clock) complete_through(stream, seq);
  }

  // --- user objects -----------------------------------------------------------------------

  void release(cudaUserObject_t handle, Destructors& destructors) {
    auto it = user_objects.find(handle);
    if (it == user_objects.end() || --it->second.references > 0) return;
    destructors.push_back({it->second.destroy, it->second.ptr});
    user_objects.erase(it);
  }

  void release_all(const std::vector<cudaUserObject_t>& retained, Destructors& destructors) {
    for (cudaUserObject_t object : retained) release(object, destructors);
  }

  // An executable graph's references go when it is destroyed and its last launch completed.
  void retire_executables(Destructors& destructors) {
    std::erase_if(retiring, [&](Exec& exec) {
      std::erase_if(exec.in_flight,
                    [&](const auto& last) { return done(last.first, last.second); });
      if (!exec.in_flight.empty()) return false;
      release_all(exec.retained, destructors);
      return true;
    });
  }

  template <class Handle>
  Handle new_object_handle() {
    const std::uintptr_t value = next_object_handle;
    next_object_handle += handle_stride;
    return reinterpret_cast<Handle>(value);
  }

  // --- the race detector ------------------------------------------------------------------

  bool inside_one_allocation(std::uintptr_t begin, std::uintptr_t end) const {
    auto it = allocations.upper_bound(begin);
    if (it != allocations.begin()) {
      --it;
      if (begin >= it->first && end <= it->first + it->second.bytes) return true;
    }
    return inside_accessible_mappings(begin, end);
  }

  // The reservation [begin, end) lies in, or null.
  Reservation* reservation_of(std::uintptr_t begin, std::uintptr_t end) {
    auto it = reservations.upper_bound(begin);
    if (it == reservations.begin()) return nullptr;
    --it;
    if (begin < it->first || end > it->first + it->second.bytes || end < begin) return nullptr;
    return &it->second;
  }

  // Every byte of [begin, end) in mappings of one reservation whose access is set.
  bool inside_accessible_mappings(std::uintptr_t begin, std::uintptr_t end) const {
    auto r = reservations.upper_bound(begin);
    if (r == reservations.begin()) return false;
    --r;
    if (end > r->first + r->second.bytes) return false;
    const auto& mappings = r->second.mappings;
    auto m = mappings.upper_bound(begin);
    if (m == mappings.begin()) return false;
    --m;
    for (std::uintptr_t at = begin; at < end; ++m) {
      if (m == mappings.end() || m->first > at || m->first + m->second.bytes <= at ||
          !m->second.accessible) {
        return false;
      }
      at = m->first + m->second.bytes;
    }
    return true;
  }

  // The physical memory goes back once released and mapped nowhere.
  void settle(VmHandle handle) {
    auto it = physical.find(handle);
    if (it == physical.end() || !it->second.released || it->second.mappings > 0) return;
    live_bytes -= it->second.bytes;
    physical.erase(it);
  }

  bool granular(std::uintptr_t value) const { return value % options.vm_granularity == 0; }

  // A virtual memory call: counted, failed as told, unsupported without virtual memory. Unlike
  // malloc, allowed during every capture, which stays active (seen on the H200).
  cudaError_t enter_vm(Call call) {
    if (cudaError_t e = enter(call); e != cudaSuccess) return e;
    return options.virtual_memory ? cudaSuccess : cudaErrorNotSupported;
  }

  // The mappings that make up [begin, end) exactly, side by side in one reservation: [first,
  // last), or nothing when the range is not whole mappings.
  using MappingIt = std::map<std::uintptr_t, VmMapping>::iterator;
  std::optional<std::pair<MappingIt, MappingIt>> whole_mappings(std::uintptr_t begin,
                                                                std::uintptr_t end) {
    Reservation* reservation = reservation_of(begin, end);
    if (begin == end || reservation == nullptr) return std::nullopt;
    auto& mappings = reservation->mappings;
    const auto first = mappings.find(begin);
    auto m = first;
    for (std::uintptr_t at = begin; at < end; ++m) {
      if (m == mappings.end() || m->first != at || at + m->second.bytes > end) return std::nullopt;
      at += m->second.bytes;
    }
    return std::pair{first, m};
  }

  // An access by work (stream, seq) races with an earlier one unless the earlier one is on the
  // same stream, complete, or followed through event waits.
  void check_access(const Stream& stream, std::uint64_t seq, const Access& access) {
    if (access.bytes == 0) return;
    const std::uintptr_t begin = address_of(access.ptr);
    const std::uintptr_t end = begin + access.bytes;
    const char* kind = access.write ? "write" : "read";
    if (end < begin || !inside_one_allocation(begin, end)) {
      hazards.push_back({Hazard::Kind::out_of_bounds,
                         fmt::format("{} of [{:#x}, {:#x}) on stream {} is not inside one live "
                                     "allocation",
                                     kind, begin, end, stream.id)});
      return;
    }
    auto ordered = [&](const AccessLog::Touch& earlier) {
      auto followed = stream.follows.find(earlier.stream);
      return earlier.stream == stream.id || done(earlier.stream, earlier.seq) ||
             (followed != stream.follows.end() && followed->second >= earlier.seq);
    };
    for (const AccessLog::Race& race :
         access_log.record({stream.id, seq}, begin, end, access.write, ordered)) {
      hazards.push_back(
          {Hazard::Kind::race,
           fmt::format("{} on stream {} races with a {} on stream {} at [{:#x}, {:#x}): no "
                       "stream order, event wait or completion orders them",
                       kind, stream.id, race.earlier_write ? "write" : "read",
                       race.earlier.stream, race.begin, race.end)});
    }
  }
};

// --- construction -----------------------------------------------------------------------------

FakeDevice::FakeDevice() : FakeDevice(Options{}) {}

FakeDevice::FakeDevice(Options options) : state_(std::make_unique<State>(options)) {}

// Pending work is dropped without running its bodies (they may refer to what the test already
// tore down). User objects still alive are destroyed, so that nothing they own leaks.
FakeDevice::~FakeDevice() {
  Destructors remaining;
  {
    std::lock_guard lock(state_->mutex);
    for (const auto& [handle, object] : state_->user_objects) {
      remaining.push_back({object.destroy, object.ptr});
    }
    state_->user_objects.clear();
  }
  run_destructors(remaining);
  per_thread_streams.erase(state_->instance);
}

// --- controls ---------------------------------------------------------------------------------

cudaStream_t FakeDevice::create_stream() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  cudaStream_t handle;
  if (!s.free_handles.empty()) {
    handle = s.free_handles.back();
    s.free_handles.pop_back();
  } else {
    handle = reinterpret_cast<cudaStream_t>(s.next_stream_handle);
    s.next_stream_handle += handle_stride;
  }
  s.handles[handle] = s.new_stream().id;
  return handle;
}

void FakeDevice::destroy_stream(cudaStream_t stream) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto it = s.handles.find(stream);
  if (it == s.handles.end()) {
    throw std::invalid_argument(fmt::format(
        "FakeDevice::destroy_stream: {} is not a stream create_stream returned and that is alive",
        fmt::ptr(stream)));
  }
  Stream& destroyed = s.streams.at(it->second);
  destroyed.destroyed = true;
  destroyed.capture.reset();
  if (destroyed.queue.empty()) s.streams.erase(destroyed.id);
  s.handles.erase(it);
  s.free_handles.push_back(stream);
}

void FakeDevice::launch(cudaStream_t stream, std::initializer_list<Access> accesses,
                        std::function<void()> body) {
  launch(stream, std::vector<Access>(accesses), std::move(body));
}

void FakeDevice::launch(cudaStream_t stream, const std::vector<Access>& accesses,
                        std::function<void()> body) {
  State& s = *state_;
  std::pair<StreamId, std::uint64_t> launched;
  {
    std::lock_guard lock(s.mutex);
    Stream& target = s.control_stream(stream, "launch");
    if (target.capture) {
      // Work captured after the capture was invalidated is lost, as CUDA loses it.
      if (!target.capture->invalidated) {
        target.capture->items.push_back({accesses, std::move(body)});
      }
      return;
    }
    launched = {target.id, s.enqueue(target, accesses, std::move(body))};
    if (!s.auto_complete) return;
  }
  s.complete_through(launched.first, launched.second);
}

void FakeDevice::complete(cudaStream_t stream) {
  State& s = *state_;
  std::pair<StreamId, std::uint64_t> last;
  {
    std::lock_guard lock(s.mutex);
    Stream& target = s.control_stream(stream, "complete");
    last = {target.id, target.enqueued};
  }
  s.complete_through(last.first, last.second);
}

void FakeDevice::complete_all() { state_->complete_everything(); }

void FakeDevice::set_auto_complete(bool on) {
  std::lock_guard lock(state_->mutex);
  state_->auto_complete = on;
}

std::size_t FakeDevice::pending_work() const {
  std::lock_guard lock(state_->mutex);
  std::size_t pending = 0;
  for (const auto& [id, stream] : state_->streams) pending += stream.queue.size();
  return pending;
}

void FakeDevice::set_capacity(std::size_t bytes) {
  std::lock_guard lock(state_->mutex);
  state_->capacity = bytes;
}

std::size_t FakeDevice::live_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->live_bytes;
}

std::size_t FakeDevice::live_allocations() const {
  std::lock_guard lock(state_->mutex);
  return state_->allocations.size();
}

std::size_t FakeDevice::live_vm_handles() const {
  std::lock_guard lock(state_->mutex);
  std::size_t live = 0;
  for (const auto& [handle, memory] : state_->physical) live += memory.released ? 0 : 1;
  return live;
}

std::size_t FakeDevice::live_reservations() const {
  std::lock_guard lock(state_->mutex);
  return state_->reservations.size();
}

void FakeDevice::fail_next(Call call, int count) { fail_next(call, count, default_error(call)); }

void FakeDevice::fail_next(Call call, int count, cudaError_t error) {
  std::lock_guard lock(state_->mutex);
  state_->faults[static_cast<int>(call)] = {count, error};
}

std::uint64_t FakeDevice::calls(Call call) const {
  std::lock_guard lock(state_->mutex);
  return state_->calls[static_cast<int>(call)];
}

std::uint64_t FakeDevice::total_calls() const {
  std::lock_guard lock(state_->mutex);
  std::uint64_t total = 0;
  for (std::uint64_t count : state_->calls) total += count;
  return total;
}

std::uint64_t FakeDevice::graph_launches(cudaGraphExec_t exec) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->execs.find(exec);
  return it == state_->execs.end() ? 0 : it->second.launches;
}

std::size_t FakeDevice::live_events() const {
  std::lock_guard lock(state_->mutex);
  return state_->events.size();
}

std::size_t FakeDevice::live_user_objects() const {
  std::lock_guard lock(state_->mutex);
  return state_->user_objects.size();
}

std::vector<FakeDevice::Hazard> FakeDevice::hazards() const {
  std::lock_guard lock(state_->mutex);
  return state_->hazards;
}

void FakeDevice::clear_hazards() {
  std::lock_guard lock(state_->mutex);
  state_->hazards.clear();
}

const char* FakeDevice::call_name(Call call) noexcept {
  switch (call) {
#define STREAMPOOL_DEVICE_CALL(name, params, args) \
  case Call::name:                                  \
    return #name;
#include <streampool/device_calls.def>
  }
  return "unknown";
}

// --- the seam: memory -------------------------------------------------------------------------

int FakeDevice::ordinal() const noexcept { return state_->options.ordinal; }

cudaError_t FakeDevice::malloc(void** ptr, std::size_t bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::malloc); e != cudaSuccess) return e;
  if (cudaError_t e = s.refuse_if_restricted(); e != cudaSuccess) return e;
  if (bytes == 0) {  // what cudaMalloc does
    *ptr = nullptr;
    return cudaSuccess;
  }
  if (s.live_bytes > s.capacity || bytes > s.capacity - s.live_bytes ||
      bytes > std::numeric_limits<std::size_t>::max() - alignment) {
    return cudaErrorMemoryAllocation;
  }
  std::uintptr_t base = 0;
  std::size_t mapped = 0;
  if (s.options.host_backed) {
    // A mapping of its own, page-aligned (so 256-aligned), lets free keep the addresses
    // reserved and give the memory back.
    mapped = round_up(bytes, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
    void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
    if (memory == MAP_FAILED) return cudaErrorMemoryAllocation;
    base = address_of(memory);
  } else {
    base = s.next_address;
    s.next_address += round_up(bytes, alignment);
  }
  s.allocations.emplace(base, Allocation{bytes, mapped});
  s.live_bytes += bytes;
  *ptr = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

cudaError_t FakeDevice::free(void* ptr) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::free); e != cudaSuccess) return e;
  if (cudaError_t e = s.refuse_if_restricted(); e != cudaSuccess) return e;
  if (ptr == nullptr) return cudaSuccess;
  auto it = s.allocations.find(address_of(ptr));
  if (it == s.allocations.end()) return cudaErrorInvalidValue;
  const auto [base, allocation] = *it;
  s.access_log.forget(base, base + allocation.bytes);
  if (allocation.mapped > 0) {
    // Replaces the pages with an inaccessible reservation: the memory goes back to the system,
    // the addresses stay taken.
    ::mmap(ptr, allocation.mapped, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    s.retired_mappings.emplace_back(base, allocation.mapped);
  }
  s.live_bytes -= allocation.bytes;
  s.allocations.erase(it);
  return cudaSuccess;
}

cudaError_t FakeDevice::mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::mem_get_info); e != cudaSuccess) return e;
  *free_bytes = s.capacity > s.live_bytes ? s.capacity - s.live_bytes : 0;
  *total_bytes = s.capacity;
  return cudaSuccess;
}

// --- the seam: virtual memory -----------------------------------------------------------------

cudaError_t FakeDevice::vm_granularity(std::size_t* bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::vm_granularity); e != cudaSuccess) return e;
  if (!s.options.virtual_memory) return cudaErrorNotSupported;
  *bytes = s.options.vm_granularity;
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_reserve(void** ptr, std::size_t bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_reserve); e != cudaSuccess) return e;
  const std::size_t granule = s.options.vm_granularity;
  if (bytes == 0 || !s.granular(bytes) || bytes > (std::size_t{1} << 50)) {
    return cudaErrorInvalidValue;
  }
  std::uintptr_t base = 0;
  if (s.options.host_backed) {
    // Inaccessible addresses, aligned to the granularity; they stay taken after vm_unreserve so
    // that no later reservation or allocation gets them.
    void* memory = ::mmap(nullptr, bytes + granule, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) return cudaErrorMemoryAllocation;
    s.retired_mappings.emplace_back(address_of(memory), bytes + granule);
    base = round_up(address_of(memory), granule);
  } else {
    base = round_up(s.next_address, granule);
    s.next_address = base + bytes;
  }
  s.reservations.emplace(base, Reservation{bytes, {}});
  *ptr = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_unreserve(void* ptr, std::size_t bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_unreserve); e != cudaSuccess) return e;
  auto it = s.reservations.find(address_of(ptr));
  if (it == s.reservations.end() || it->second.bytes != bytes || !it->second.mappings.empty()) {
    return cudaErrorInvalidValue;
  }
  s.reservations.erase(it);
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_create(VmHandle* handle, std::size_t bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_create); e != cudaSuccess) return e;
  if (bytes == 0 || !s.granular(bytes)) return cudaErrorInvalidValue;
  if (s.live_bytes > s.capacity || bytes > s.capacity - s.live_bytes) {
    return cudaErrorMemoryAllocation;
  }
  const VmHandle id = s.next_vm_handle++;
  s.physical.emplace(id, PhysicalMemory{bytes, 0, false});
  s.live_bytes += bytes;
  *handle = id;
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_release(VmHandle handle) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_release); e != cudaSuccess) return e;
  auto it = s.physical.find(handle);
  if (it == s.physical.end() || it->second.released) return cudaErrorInvalidValue;
  it->second.released = true;
  s.settle(handle);
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_map(void* ptr, std::size_t bytes, VmHandle handle) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_map); e != cudaSuccess) return e;
  const std::uintptr_t begin = address_of(ptr);
  const std::uintptr_t end = begin + bytes;
  auto memory = s.physical.find(handle);
  Reservation* reservation = s.reservation_of(begin, end);
  if (memory == s.physical.end() || memory->second.released || reservation == nullptr ||
      !s.granular(begin)) {
    return cudaErrorInvalidValue;
  }
  if (memory->second.bytes != bytes) return cudaErrorNotSupported;  // what the H200 says
  auto& mappings = reservation->mappings;
  auto next = mappings.lower_bound(begin);
  if (next != mappings.end() && next->first < end) return cudaErrorInvalidValue;
  if (next != mappings.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second.bytes > begin) return cudaErrorInvalidValue;
  }
  mappings.emplace(begin, VmMapping{bytes, handle, false});
  ++memory->second.mappings;
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_set_access(void* ptr, std::size_t bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_set_access); e != cudaSuccess) return e;
  const std::uintptr_t begin = address_of(ptr);
  const auto range = s.whole_mappings(begin, begin + bytes);
  if (!range) return cudaErrorInvalidValue;
  if (s.options.host_backed &&
      ::mprotect(ptr, bytes, PROT_READ | PROT_WRITE) != 0) {
    return cudaErrorMemoryAllocation;
  }
  for (auto m = range->first; m != range->second; ++m) m->second.accessible = true;
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_unmap(void* ptr, std::size_t bytes) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_unmap); e != cudaSuccess) return e;
  const std::uintptr_t begin = address_of(ptr);
  const std::uintptr_t end = begin + bytes;
  const auto range = s.whole_mappings(begin, end);
  if (!range) return cudaErrorInvalidValue;
  const auto [first, m] = *range;
  s.access_log.forget(begin, end);
  if (s.options.host_backed) {
    // The contents go with the mapping: the pages go back to the system.
    ::mmap(ptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  }
  std::vector<VmHandle> handles;
  for (auto it = first; it != m; ++it) handles.push_back(it->second.handle);
  s.reservation_of(begin, end)->mappings.erase(first, m);
  for (VmHandle handle : handles) {
    --s.physical.at(handle).mappings;
    s.settle(handle);
  }
  return cudaSuccess;
}

// --- the seam: events -------------------------------------------------------------------------

cudaError_t FakeDevice::event_create(cudaEvent_t* event) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::event_create); e != cudaSuccess) return e;
  const auto handle = s.new_object_handle<cudaEvent_t>();
  s.events.emplace(handle, Event{});
  *event = handle;
  return cudaSuccess;
}

// Nothing waits on the event object itself (a wait copies its clock), so a pending event can go.
cudaError_t FakeDevice::event_destroy(cudaEvent_t event) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::event_destroy); e != cudaSuccess) return e;
  return s.events.erase(event) > 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t FakeDevice::event_record(cudaEvent_t event, cudaStream_t stream) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::event_record); e != cudaSuccess) return e;
  auto it = s.events.find(event);
  Stream* target = s.find_stream(stream);
  if (it == s.events.end() || target == nullptr) return cudaErrorInvalidResourceHandle;
  if (target->capture) {
    if (target->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    it->second = Event{true, {}, target->capture->id};
    return cudaSuccess;
  }
  it->second = Event{false, s.snapshot(*target)};
  return cudaSuccess;
}

cudaError_t FakeDevice::event_query(cudaEvent_t event) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::event_query); e != cudaSuccess) return e;
  auto it = s.events.find(event);
  if (it == s.events.end()) return cudaErrorInvalidResourceHandle;
  // Refused in every mode, and the capture it was recorded in is invalidated (seen on the H200).
  if (it->second.captured) return s.refuse_captured_event(it->second);
  if (cudaError_t e = s.refuse_if_restricted(); e != cudaSuccess) return e;
  return s.complete(it->second.covers) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t FakeDevice::event_synchronize(cudaEvent_t event) noexcept {
  State& s = *state_;
  Clock covers;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::event_synchronize); e != cudaSuccess) return e;
    auto it = s.events.find(event);
    if (it == s.events.end()) return cudaErrorInvalidResourceHandle;
    if (it->second.captured) return s.refuse_captured_event(it->second);
    if (cudaError_t e = s.refuse_if_restricted(); e != cudaSuccess) return e;
    covers = it->second.covers;
  }
  s.complete_clock(covers);
  return cudaSuccess;
}

// --- the seam: streams ------------------------------------------------------------------------

// On a capturing stream, waiting on an event recorded in a capture is a fork or join inside the
// graph (the fake does not simulate streams joining a capture: it adds nothing); waiting on one
// recorded outside is refused (below). Waiting on a captured event from a stream that is not
// capturing would make the stream join the capture, which the fake does not simulate either.
cudaError_t FakeDevice::stream_wait_event(cudaStream_t stream, cudaEvent_t event) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::stream_wait_event); e != cudaSuccess) return e;
  auto it = s.events.find(event);
  Stream* target = s.find_stream(stream);
  if (it == s.events.end() || target == nullptr) return cudaErrorInvalidResourceHandle;
  if (target->capture) {
    // A capturing stream may wait on an event recorded in a capture (fork and join); one recorded
    // outside any capture is refused and invalidates the capture, in every mode (seen on the H200).
    if (it->second.captured) return cudaSuccess;
    target->capture->invalidated = true;
    return cudaErrorStreamCaptureIsolation;
  }
  for (const auto& [other, seq] : it->second.covers) {
    if (other == target->id) continue;  // stream order already covers it
    std::uint64_t& followed = target->follows[other];
    followed = std::max(followed, seq);
  }
  s.forget_done(target->follows);
  return cudaSuccess;
}

cudaError_t FakeDevice::stream_synchronize(cudaStream_t stream) noexcept {
  State& s = *state_;
  Clock covers;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::stream_synchronize); e != cudaSuccess) return e;
    Stream* target = s.find_stream(stream);
    if (target == nullptr) return cudaErrorInvalidResourceHandle;
    if (target->capture) {  // every mode, seen on the H200
      target->capture->invalidated = true;
      return cudaErrorStreamCaptureUnsupported;
    }
    if (cudaError_t e = s.refuse_if_restricted(); e != cudaSuccess) return e;
    // The stream's own work and what it was made to wait for, even with no work after the wait:
    // CUDA enqueues the wait itself.
    covers = s.snapshot(*target);
  }
  s.complete_clock(covers);
  return cudaSuccess;
}

cudaError_t FakeDevice::device_synchronize() noexcept {
  State& s = *state_;
  Clock before;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::device_synchronize); e != cudaSuccess) return e;
    bool refused = false;
    for (auto& [id, stream] : s.streams) {
      if (stream.capture && !stream.capture->invalidated) {
        stream.capture->invalidated = true;
        refused = true;
      }
    }
    if (refused) return cudaErrorStreamCaptureUnsupported;
    // Only the work enqueued before the call: what other threads (or the bodies run below)
    // enqueue meanwhile is not waited for, as on a GPU.
    for (const auto& [id, stream] : s.streams) {
      if (stream.completed < stream.enqueued) before[id] = stream.enqueued;
    }
  }
  s.complete_clock(before);
  return cudaSuccess;
}

cudaError_t FakeDevice::stream_id(cudaStream_t stream, StreamId* id) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::stream_id); e != cudaSuccess) return e;
  Stream* target = s.find_stream(stream);
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  // Refused on a capturing stream, in every mode, and the capture is invalidated (seen on the
  // H200); other streams' ids may be asked at any time.
  if (target->capture && !target->capture->invalidated) {
    target->capture->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  *id = target->id;
  return cudaSuccess;
}

cudaError_t FakeDevice::capture_info(cudaStream_t stream, CaptureStatus* status,
                                     CaptureId* id) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::capture_info); e != cudaSuccess) return e;
  Stream* target = s.find_stream(stream);
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  const std::optional<Capture>& capture = target->capture;
  *status = !capture               ? CaptureStatus::none
            : capture->invalidated ? CaptureStatus::invalidated
                                   : CaptureStatus::active;
  if (id != nullptr) *id = capture ? capture->id : 0;
  return cudaSuccess;
}

// --- the seam: capture and graphs -------------------------------------------------------------

cudaError_t FakeDevice::begin_capture(cudaStream_t stream, CaptureMode mode) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::begin_capture); e != cudaSuccess) return e;
  if (is_legacy(stream)) return cudaErrorStreamCaptureUnsupported;  // as the H200 answers
  Stream* target = s.find_stream(stream);
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  if (target->capture) return cudaErrorIllegalState;
  target->capture =
      Capture{next_capture_id.fetch_add(1), mode, std::this_thread::get_id(), false, {}};
  return cudaSuccess;
}

cudaError_t FakeDevice::end_capture(cudaStream_t stream, cudaGraph_t* graph) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::end_capture); e != cudaSuccess) return e;
  Stream* target = s.find_stream(stream);
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  if (!target->capture) return cudaErrorIllegalState;
  Capture& capture = *target->capture;
  if (capture.mode != CaptureMode::relaxed && capture.thread != std::this_thread::get_id()) {
    // Refused, and the capture is over: seen on the H200, the stream leaves capture.
    target->capture.reset();
    *graph = nullptr;
    return cudaErrorStreamCaptureWrongThread;
  }
  if (capture.invalidated) {
    target->capture.reset();
    *graph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  const auto handle = s.new_object_handle<cudaGraph_t>();
  s.graphs.emplace(handle, Graph{std::move(capture.items), {}});
  target->capture.reset();
  *graph = handle;
  return cudaSuccess;
}

cudaError_t FakeDevice::graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::graph_instantiate); e != cudaSuccess) return e;
  auto it = s.graphs.find(graph);
  if (it == s.graphs.end()) return cudaErrorInvalidResourceHandle;
  Exec executable{it->second.items, {}, 0, {}};
  for (cudaUserObject_t object : it->second.retained) {
    // Absent only if the caller released a reference it had moved to the graph.
    auto found = s.user_objects.find(object);
    if (found == s.user_objects.end()) continue;
    ++found->second.references;
    executable.retained.push_back(object);
  }
  const auto handle = s.new_object_handle<cudaGraphExec_t>();
  s.execs.emplace(handle, std::move(executable));
  *exec = handle;
  return cudaSuccess;
}

// Each captured item becomes ordinary work on `stream`, race-checked like any launch. An empty
// graph still enqueues one unit, so that its launch completes in stream order like CUDA's.
cudaError_t FakeDevice::graph_launch(cudaGraphExec_t exec, cudaStream_t stream) noexcept {
  State& s = *state_;
  std::pair<StreamId, std::uint64_t> last;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::graph_launch); e != cudaSuccess) return e;
    auto it = s.execs.find(exec);
    Stream* target = s.find_stream(stream);
    if (it == s.execs.end() || target == nullptr) return cudaErrorInvalidResourceHandle;
    Exec& executable = it->second;
    if (target->capture) {  // CUDA captures the launch as a child graph: its items, here
      if (target->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
      auto& items = target->capture->items;
      items.insert(items.end(), executable.items.begin(), executable.items.end());
      ++executable.launches;
      return cudaSuccess;
    }
    std::uint64_t seq = 0;
    for (const Item& item : executable.items) seq = s.enqueue(*target, item.accesses, item.body);
    if (executable.items.empty()) seq = s.enqueue(*target, {}, {});
    ++executable.launches;
    std::erase_if(executable.in_flight, [&](const auto& l) { return s.done(l.first, l.second); });
    executable.in_flight.emplace_back(target->id, seq);
    if (!s.auto_complete) return cudaSuccess;
    last = {target->id, seq};
  }
  s.complete_through(last.first, last.second);
  return cudaSuccess;
}

cudaError_t FakeDevice::graph_upload(cudaGraphExec_t exec, cudaStream_t stream) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::graph_upload); e != cudaSuccess) return e;
  if (!s.execs.contains(exec) || s.find_stream(stream) == nullptr) {
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

cudaError_t FakeDevice::graph_exec_destroy(cudaGraphExec_t exec) noexcept {
  State& s = *state_;
  Destructors destructors;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::graph_exec_destroy); e != cudaSuccess) return e;
    auto it = s.execs.find(exec);
    if (it == s.execs.end()) return cudaErrorInvalidResourceHandle;
    s.retiring.push_back(std::move(it->second));
    s.execs.erase(it);
    s.retire_executables(destructors);
  }
  run_destructors(destructors);
  return cudaSuccess;
}

cudaError_t FakeDevice::graph_destroy(cudaGraph_t graph) noexcept {
  State& s = *state_;
  Destructors destructors;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::graph_destroy); e != cudaSuccess) return e;
    auto it = s.graphs.find(graph);
    if (it == s.graphs.end()) return cudaErrorInvalidResourceHandle;
    s.release_all(it->second.retained, destructors);
    s.graphs.erase(it);
  }
  run_destructors(destructors);
  return cudaSuccess;
}

cudaError_t FakeDevice::user_object_create(cudaUserObject_t* object, void* ptr,
                                           cudaHostFn_t destroy) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::user_object_create); e != cudaSuccess) return e;
  if (destroy == nullptr) return cudaErrorInvalidValue;
  const auto handle = s.new_object_handle<cudaUserObject_t>();
  s.user_objects.emplace(handle, UserObject{ptr, destroy, 1});
  *object = handle;
  return cudaSuccess;
}

cudaError_t FakeDevice::graph_retain_user_object(cudaGraph_t graph,
                                                 cudaUserObject_t object) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::graph_retain_user_object); e != cudaSuccess) return e;
  auto it = s.graphs.find(graph);
  if (it == s.graphs.end() || !s.user_objects.contains(object)) {
    return cudaErrorInvalidResourceHandle;
  }
  it->second.retained.push_back(object);  // the caller's reference moves to the graph
  return cudaSuccess;
}

cudaError_t FakeDevice::user_object_release(cudaUserObject_t object) noexcept {
  State& s = *state_;
  Destructors destructors;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::user_object_release); e != cudaSuccess) return e;
    if (!s.user_objects.contains(object)) return cudaErrorInvalidResourceHandle;
    s.release(object, destructors);
  }
  run_destructors(destructors);
  return cudaSuccess;
}

}  // namespace streampool
