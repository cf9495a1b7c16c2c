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
//   pool blocks   what the pool's notifications said: live blocks, dropped ones, the segments
//                 they lie in, and `lifetime_log`, the same map over live blocks for the order
//                 check, whose clocks (Stream::order) count stream order, event waits and host
//                 synchronization but never completion: the checks of the "user checks" section
//                 do not depend on what completed, or on whether the pool reuses a block.
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
#include <streampool/error.hpp>

#include <fmt/format.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
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

// FakeDevice instance -> the stream cudaStreamPerThread names in this thread. At the thread's
// exit, each of those streams' captures is over, as CUDA has it (seen on the H100: a thread that
// began a global capture of its per-thread stream and exited restricts no other thread's
// cudaMalloc or cudaDeviceSynchronize; test/gpu/probes.cpp), and when CUDA has it: after the
// thread's C++ thread_local destructors (still under way in them, and refusing other threads'
// calls) and before the second round of its thread-specific data destructors (seen on the H100,
// 2026-12-07). So in the first round of those: the map is the value of a key of its own, made at
// the thread's first use.
struct PerThreadStreams {
  std::unordered_map<std::uint64_t, StreamId> ids;
  ~PerThreadStreams();  // below, once State is known: ends the captures
};
void end_per_thread_streams(void* streams) noexcept { delete static_cast<PerThreadStreams*>(streams); }
pthread_key_t per_thread_key() {
  static const pthread_key_t key = [] {
    pthread_key_t made{};
    if (pthread_key_create(&made, end_per_thread_streams) != 0) throw std::bad_alloc();
    return made;
  }();
  return key;
}
// The calling thread's, made at its first use if `make` (null otherwise, and during its exit once
// the key's destructor ran).
PerThreadStreams* per_thread_streams(bool make) {
  const pthread_key_t key = per_thread_key();
  auto* mine = static_cast<PerThreadStreams*>(pthread_getspecific(key));
  if (mine != nullptr || !make) return mine;
  auto owned = std::make_unique<PerThreadStreams>();
  if (pthread_setspecific(key, owned.get()) != 0) throw std::bad_alloc();
  return owned.release();
}
// Non-zero while this thread runs a user object's destructor, where CUDA forbids CUDA calls.
thread_local int in_user_object_destructor = 0;

std::uintptr_t address_of(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }
const void* as_pointer(std::uintptr_t address) { return reinterpret_cast<const void*>(address); }

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
  std::uint32_t label = 0;
};

struct Work {
  std::uint64_t seq = 0;
  Clock follows;  // other streams' work that must complete first
  std::function<void()> body;
};

// One capture sequence, shared by the stream that began it (`origin`) and every stream that
// joined it by waiting on an event recorded in it (each Stream::capture points here).
struct Capture {
  CaptureId id = 0;
  CaptureMode mode = CaptureMode::global;
  std::thread::id thread;
  bool invalidated = false;
  std::vector<Item> items;  // the graph's work, every member's in launch order
  StreamId origin = 0;
  // The streams that joined. CUDA ends a capture only once the origin depends on each one's
  // last captured work (cudaErrorStreamCaptureUnjoined otherwise).
  std::set<StreamId> joined;
  // Each member's captured work so far, and what each member's later work depends on: per
  // member, how much of every member's work (through waits on events recorded in the capture,
  // transitively).
  std::map<StreamId, std::uint64_t> work;
  std::map<StreamId, std::map<StreamId, std::uint64_t>> sees;
  void captured_on(StreamId member) { ++work[member]; }
  // `member` waits on an event recorded on `on` that saw `seen`.
  void wait(StreamId member, const std::map<StreamId, std::uint64_t>& seen) {
    auto& mine = sees[member];
    for (const auto& [other, count] : seen) mine[other] = std::max(mine[other], count);
  }
  // What an event recorded on `member` now carries.
  std::map<StreamId, std::uint64_t> seen_by(StreamId member) {
    std::map<StreamId, std::uint64_t> seen = sees[member];
    seen[member] = work[member];
    return seen;
  }
  bool unjoined() {
    const auto& mine = sees[origin];
    return std::any_of(joined.begin(), joined.end(), [&](StreamId member) {
      const auto it = mine.find(member);
      return it == mine.end() || it->second < work[member];
    });
  }
};

struct Stream {
  StreamId id = 0;
  std::uint64_t enqueued = 0;   // seq of the last work enqueued
  std::uint64_t completed = 0;  // seq of the last work completed; work completes in order
  Clock follows;                // what work enqueued from now on follows, on other streams
  // The same, never forgetting completed work, and with what the host synchronized with
  // (host_order, merged in at each launch when host_version moved past host_seen).
  Clock order;
  std::uint64_t host_seen = 0;
  std::deque<Work> queue;
  std::shared_ptr<Capture> capture;  // the capture it is in, begun here or joined
  bool destroyed = false;
  // Synchronizes with the legacy default stream (cudaStreamPerThread's streams; those
  // create_stream makes are non-blocking, as cudaStreamNonBlocking makes them).
  bool blocking = false;
  // The front of `queue` is running: its body has started and not returned. It completes (and
  // `completed` moves) only once the body has returned, as a kernel's event completes only once
  // the kernel has finished.
  bool running = false;
};

struct Event {
  bool captured = false;
  Clock covers;  // empty when never recorded: such an event is complete
  CaptureId capture = 0;  // the capture it was last recorded in, when `captured`
  Clock order;  // Stream::order of its stream at the record, that stream's own work included
  // When `captured`: the captured work of each member of its capture that it follows
  // (Capture::seen_by at the record).
  std::map<StreamId, std::uint64_t> captured_seen;
};

struct Allocation {
  std::size_t bytes = 0;
  std::size_t mapped = 0;  // bytes of host memory behind it (host-backed only)
};

struct VmMapping {
  std::size_t bytes = 0;
  VmHandle handle = 0;
  std::uint64_t access = 0;  // the devices whose kernels may use it (vm_set_access), bit d for d
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
    std::uint32_t label = 0;  // State::labels
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

  // An access to [begin, end) for which `pending(touch)` holds, and whether it writes; the last
  // write and the reads since it are the accesses that may still run (earlier ones complete
  // before them, or raced with them).
  template <class Pending>
  std::optional<std::pair<Touch, bool>> pending_access(std::uintptr_t begin, std::uintptr_t end,
                                                       Pending pending) const {
    auto it = segments_.upper_bound(begin);
    if (it != segments_.begin()) --it;
    for (; it != segments_.end() && it->first < end; ++it) {
      if (it->second.end <= begin) continue;
      if (it->second.write && pending(*it->second.write)) return std::pair{*it->second.write, true};
      for (const Touch& read : it->second.reads) {
        if (pending(read)) return std::pair{read, false};
      }
    }
    return std::nullopt;
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
  // The peers that enable_peer_access let use this device's malloc memory, bit d for device d.
  std::uint64_t peer_access_enabled = 0;

  // This device, as a bit of an access mask (the constructor took only ordinals 0 to 63).
  std::uint64_t own_bit() const noexcept { return std::uint64_t{1} << options.ordinal; }
  // The devices whose kernels can reach this device's memory: itself and Options::peers.
  std::uint64_t reachable_from() const noexcept { return own_bit() | options.peers; }

  std::map<StreamId, Stream> streams;
  std::uint64_t completions = 0;  // units completed so far
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

  // For a call CUDA considers unsafe during capture: a global capture, whoever began it, or a
  // thread-local one begun by this thread, refuses it and is invalidated (as CUDA does, seen on
  // the H200); one already invalidated refuses it too until it ends (seen on an H100,
  // 2026-12-07). Relaxed captures restrict nobody.
  // Querying or waiting for an event recorded in a capture: refused, and the capture it was
  // recorded in is invalidated (seen on the H200), whatever its mode.
  cudaError_t refuse_captured_event(const Event& event) {
    for (auto& [id, stream] : streams) {
      if (stream.capture && stream.capture->id == event.capture) stream.capture->invalidated = true;
    }
    return cudaErrorCapturedEvent;
  }

  // The legacy default stream synchronizes with every blocking stream, so while one of them
  // captures (its capture active or invalidated, until it ends), CUDA refuses calls that name the
  // legacy stream with cudaErrorStreamCaptureImplicit, in every mode and from any thread (seen on
  // an H100): asking its capture status changes nothing, enqueueing on it (a record, a wait, a
  // launch) or synchronizing it invalidates the blocking streams' captures.
  bool implicit_dependency(const Stream& target) const {
    if (target.id != legacy) return false;
    return std::any_of(streams.begin(), streams.end(), [](const auto& entry) {
      return entry.second.blocking && entry.second.capture != nullptr;
    });
  }
  cudaError_t refuse_implicit() {
    for (auto& [id, stream] : streams) {
      if (stream.blocking && stream.capture) stream.capture->invalidated = true;
    }
    return cudaErrorStreamCaptureImplicit;
  }

  // Every stream of the capture leaves it (its origin and the streams that joined).
  void leave_capture(const std::shared_ptr<Capture>& capture) {
    const std::shared_ptr<Capture> keep = capture;  // may be one of the members' own pointer
    for (auto& [id, stream] : streams) {
      if (stream.capture == keep) stream.capture.reset();
    }
  }

  cudaError_t refuse_if_restricted() {
    bool refused = false;
    for (auto& [id, stream] : streams) {
      if (!stream.capture) continue;
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
      PerThreadStreams& mine = *per_thread_streams(true);
      auto it = mine.ids.find(instance);
      if (it == mine.ids.end()) {
        Stream& made = new_stream();
        made.blocking = true;
        it = mine.ids.emplace(instance, made.id).first;
      }
      return &streams.at(it->second);
    }
    auto it = handles.find(handle);
    return it == handles.end() ? nullptr : &streams.at(it->second);
  }

  // The stream a device call names, as find_stream; a destroyed stream's handle that no stream
  // has taken since is reported (Hazard::Kind::destroyed_handle) before it is refused.
  Stream* called_stream(cudaStream_t handle, const char* call) {
    Stream* found = find_stream(handle);
    if (found == nullptr &&
        std::find(free_handles.begin(), free_handles.end(), handle) != free_handles.end()) {
      hazards.push_back({Hazard::Kind::destroyed_handle,
                         fmt::format("{} named {}, the handle of a destroyed stream that no stream "
                                     "has taken since (CUDA may crash: the stream's memory is "
                                     "gone)",
                                     call, fmt::ptr(handle))});
    }
    return found;
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

  // `replay`: a graph's captured work, whose memory the capture layer keeps for the graph.
  std::uint64_t enqueue(Stream& stream, const std::vector<Access>& accesses,
                        std::function<void()> body, std::uint32_t label = 0,
                        bool replay = false) {
    catch_up(stream);
    const std::uint64_t seq = ++stream.enqueued;
    for (const Access& access : accesses) check_access(stream, seq, label, access, replay);
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
      // A body still running (this thread's: completions are serialized) completes first.
      if (it->second.running) return nullptr;
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
  // The unit completes once its body has returned: until then queries and the race check see it
  // pending (a body that completes work of its own stream leaves that work pending).
  void complete_through(StreamId id, std::uint64_t seq) {
    std::lock_guard serial(completion_mutex);
    for (;;) {
      std::function<void()> body;
      StreamId running = 0;
      {
        std::lock_guard lock(mutex);
        Stream* stream = next_to_complete(id, seq);
        if (stream == nullptr) return;
        stream->running = true;
        running = stream->id;
        body = std::move(stream->queue.front().body);
      }
      // Completes the unit also when its body throws.
      struct Finish {
        State& state;
        StreamId id;
        ~Finish() {
          Destructors destructors;
          {
            std::lock_guard lock(state.mutex);
            Stream& stream = state.streams.at(id);  // not erased while its front runs
            stream.running = false;
            stream.completed = stream.queue.front().seq;
            stream.queue.pop_front();
            ++state.completions;
            if (stream.destroyed && stream.queue.empty()) state.streams.erase(id);
            state.retire_executables(destructors);
          }
          run_destructors(destructors);
        }
      } finish{*this, running};
      if (body) body();
    }
  }

  void complete_everything() {
    for (;;) {
      std::vector<std::pair<StreamId, std::uint64_t>> targets;
      std::uint64_t before = 0;
      {
        std::lock_guard lock(mutex);
        for (const auto& [id, stream] : streams) {
          if (!stream.queue.empty()) targets.emplace_back(id, stream.enqueued);
        }
        before = completions;
      }
      if (targets.empty()) return;
      for (const auto& [id, seq] : targets) complete_through(id, seq);
      std::lock_guard lock(mutex);
      // Nothing moved: what is left waits for a body still running (the caller's own).
      if (completions == before) return;
    }
  }

  // Completes what `clock` names; false when some of it could not complete because it is, or
  // waits for, the body that called this (a synchronize inside a body waits for that body).
  bool complete_clock(const Clock& clock) {
    for (const auto& [stream, seq] : clock) complete_through(stream, seq);
    std::lock_guard lock(mutex);
    return std::all_of(clock.begin(), clock.end(),
                       [&](const auto& entry) { return done(entry.first, entry.second); });
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
          (m->second.access & own_bit()) == 0) {
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
  void check_access(Stream& stream, std::uint64_t seq, std::uint32_t label,
                    const Access& access, bool replay) {
    if (access.bytes == 0) return;
    const std::uintptr_t begin = address_of(access.ptr);
    const std::uintptr_t end = begin + access.bytes;
    if (end < begin || !inside_one_allocation(begin, end)) {
      // A pool's memory says more: the block it overran, or that it was dropped.
      if (end >= begin && check_pool_memory(stream, seq, label, access, begin, end, replay)) {
        return;
      }
      hazards.push_back({Hazard::Kind::out_of_bounds,
                         fmt::format("{} is not inside one live allocation",
                                     describe_access(access, stream.id, label))});
      return;
    }
    if (check_pool_memory(stream, seq, label, access, begin, end, replay)) return;
    auto ordered = [&](const AccessLog::Touch& earlier) {
      auto followed = stream.follows.find(earlier.stream);
      return earlier.stream == stream.id || done(earlier.stream, earlier.seq) ||
             (followed != stream.follows.end() && followed->second >= earlier.seq);
    };
    for (const AccessLog::Race& race :
         access_log.record({stream.id, seq, label}, begin, end, access.write, ordered)) {
      hazards.push_back(
          {Hazard::Kind::race,
           fmt::format("{} races with a {}{} on {} at [{:#x}, {:#x}): no stream order, event "
                       "wait or completion orders them",
                       describe_access(access, stream.id, label),
                       race.earlier_write ? "write" : "read", enqueued_at(race.earlier.label),
                       describe(race.earlier.stream), race.begin, race.end)});
    }
  }

  // --- the user checks: names, labels, order, pool blocks (docs/testing-your-code.md) -------

  struct StreamName {
    cudaStream_t handle = nullptr;
    std::string name;
  };
  struct Use {
    std::uint64_t seq = 0;
    std::uint32_t label = 0;
  };
  // A block the pool said is live: [base, base + bytes).
  struct PoolBlock {
    std::size_t bytes = 0;      // the block's size: the bound
    std::size_t requested = 0;  // what its allocation asked for
    bool held = false;       // by the layer above, for graphs: checked for bounds alone
    StreamId home = 0;
    std::uint64_t since = 0; // home's last work when it became live
    std::vector<StreamId> recorded;
    std::map<StreamId, Use> uses;  // each stream's last work that touched it
  };
  struct DroppedBlock {
    std::size_t bytes = 0;
    StreamId on = 0;  // the drop's stream; 0 when the layer above held it
  };
  // The label of the allocation's own entry in lifetime_log.
  static constexpr std::uint32_t allocation_label = std::numeric_limits<std::uint32_t>::max();

  std::unordered_map<StreamId, StreamName> names;  // streams create_stream made, for messages
  std::vector<std::string> labels{std::string()};  // label 0: none
  std::unordered_map<std::string, std::uint32_t> label_ids;
  Clock host_order;  // what the host synchronized with (synchronize calls; never completion)
  std::uint64_t host_version = 0;
  std::map<std::uintptr_t, PoolBlock> live_blocks;
  std::map<std::uintptr_t, DroppedBlock> dropped_blocks;
  std::set<std::uintptr_t> pool_segments;  // bases of allocations holding a pool's blocks
  AccessLog lifetime_log;

  std::uint32_t label_id(std::string_view label) {
    if (label.empty()) return 0;
    const auto [it, added] =
        label_ids.emplace(std::string(label), static_cast<std::uint32_t>(labels.size()));
    if (added) labels.emplace_back(label);
    return it->second;
  }

  // `stream "consumer" (0x1010, id 4)`: how hazard messages name a stream.
  std::string describe(StreamId id) const {
    if (id == legacy) return "the legacy default stream";
    auto it = names.find(id);
    if (it == names.end()) return fmt::format("a per-thread default stream (id {})", id);
    if (it->second.name.empty()) {
      return fmt::format("stream {} (id {})", fmt::ptr(it->second.handle), id);
    }
    return fmt::format("stream \"{}\" ({}, id {})", it->second.name, fmt::ptr(it->second.handle),
                       id);
  }

  std::string enqueued_at(std::uint32_t label) const {
    return label == 0 || label >= labels.size() ? std::string()
                                                : fmt::format(" by \"{}\"", labels[label]);
  }

  // "write of [0x.., 0x..) by "fill" on stream "producer" (0x1000, id 2)"
  std::string describe_access(const Access& access, StreamId stream, std::uint32_t label) const {
    const std::uintptr_t begin = address_of(access.ptr);
    return fmt::format("{} of [{:#x}, {:#x}){} on {}", access.write ? "write" : "read", begin,
                       begin + access.bytes, enqueued_at(label), describe(stream));
  }

  std::string describe_block(std::uintptr_t base, const PoolBlock& block) const {
    if (block.held) {
      return fmt::format("memory a CapturePool holds for its graphs, [{:#x}, {:#x})", base,
                         base + block.bytes);
    }
    return fmt::format("the block of {} bytes ({} asked for) at [{:#x}, {:#x}) allocated on {}",
                       block.bytes, block.requested, base, base + block.bytes,
                       describe(block.home));
  }

  static void merge(Clock& into, const Clock& from, StreamId skip) {
    for (const auto& [stream, seq] : from) {
      if (stream == skip) continue;
      std::uint64_t& known = into[stream];
      known = std::max(known, seq);
    }
  }

  // What the host synchronized with is followed by all work launched after.
  void catch_up(Stream& stream) {
    if (stream.host_seen == host_version) return;
    merge(stream.order, host_order, stream.id);
    stream.host_seen = host_version;
  }

  // Stream::order of `stream` with its own work so far: what an event recorded now covers.
  Clock order_snapshot(Stream& stream) {
    catch_up(stream);
    Clock clock = stream.order;
    clock[stream.id] = stream.enqueued;
    return clock;
  }

  void host_learns(const Clock& clock) {
    merge(host_order, clock, 0);
    ++host_version;
  }

  void host_learns_everything() {
    for (auto& [id, stream] : streams) merge(host_order, {{id, stream.enqueued}}, 0);
    ++host_version;
  }

  // Is work of `stream` launched from now on ordered after work (other, seq)? seq 0: nothing.
  static bool ordered_after(const Stream& stream, StreamId other, std::uint64_t seq) {
    if (seq == 0 || other == stream.id) return true;
    auto it = stream.order.find(other);
    return it != stream.order.end() && it->second >= seq;
  }

  // The pool block or dropped block holding `at`, if any.
  template <class Map>
  static auto containing(Map& map, std::uintptr_t at) {
    auto it = map.upper_bound(at);
    if (it == map.begin()) return map.end();
    --it;
    return at < it->first + it->second.bytes ? it : map.end();
  }

  bool in_pool_segment(std::uintptr_t at) const {
    auto it = pool_segments.upper_bound(at);
    if (it == pool_segments.begin()) return false;
    --it;
    auto allocation = allocations.find(*it);
    return allocation != allocations.end() && at < *it + allocation->second.bytes;
  }

  // Forgets the live and dropped blocks overlapping [begin, end).
  void forget_blocks(std::uintptr_t begin, std::uintptr_t end) {
    for (auto* map : {&dropped_blocks}) {
      for (auto it = map->lower_bound(begin); it != map->end() && it->first < end;) {
        it = map->erase(it);
      }
      auto before = containing(*map, begin);
      if (before != map->end()) map->erase(before);
    }
    for (auto it = live_blocks.lower_bound(begin); it != live_blocks.end() && it->first < end;) {
      it = live_blocks.erase(it);
    }
    auto before = containing(live_blocks, begin);
    if (before != live_blocks.end()) live_blocks.erase(before);
    lifetime_log.forget(begin, end);
  }

  void note_segment(std::uintptr_t at) {
    auto it = allocations.upper_bound(at);
    if (it == allocations.begin()) return;
    --it;
    if (at < it->first + it->second.bytes) pool_segments.insert(it->first);
  }

  // A device free: nothing of the pool's is left in [base, base + bytes).
  void forget_pool_memory(std::uintptr_t base, std::size_t bytes) {
    if (pool_segments.erase(base) == 0) return;
    forget_blocks(base, base + bytes);
  }

  // The fake's bound is the block the pool handed out (`size`): the pool's own tests touch all of
  // it; compute-sanitizer (nvtx_memory) is the stricter, at the bytes asked for.
  void block_live(std::uintptr_t base, std::size_t requested, std::size_t size,
                  cudaStream_t stream) {
    Stream* home = find_stream(stream);
    const std::size_t bytes = std::max(requested, size);
    forget_blocks(base, base + bytes);
    note_segment(base);
    PoolBlock block;
    block.bytes = bytes;
    block.requested = requested;
    if (home != nullptr) {
      block.home = home->id;
      block.since = home->enqueued;
    }
    live_blocks.emplace(base, std::move(block));
    // The allocation is the block's first write: every access of its life is ordered after it.
    lifetime_log.record({block.home, block.since, allocation_label}, base, base + bytes, true,
                        [](const AccessLog::Touch&) { return true; });
  }

  void block_held(std::uintptr_t base, std::size_t bytes) {
    forget_blocks(base, base + bytes);
    note_segment(base);
    PoolBlock block;
    block.bytes = bytes;
    block.held = true;
    live_blocks.emplace(base, std::move(block));
  }

  void block_recorded(std::uintptr_t base, cudaStream_t stream) {
    auto it = live_blocks.find(base);
    Stream* other = find_stream(stream);
    if (it == live_blocks.end() || other == nullptr) return;
    std::vector<StreamId>& recorded = it->second.recorded;
    if (std::find(recorded.begin(), recorded.end(), other->id) == recorded.end()) {
      recorded.push_back(other->id);
    }
  }

  void block_dropped(std::uintptr_t base, cudaStream_t stream) {
    auto it = live_blocks.find(base);
    if (it == live_blocks.end()) return;
    drop_block(it, it->second.held ? nullptr : find_stream(stream));
  }

  // Dropped on its home stream, which no handle names in the calling thread (another thread's
  // per-thread default stream): known by its id.
  void block_dropped_home(std::uintptr_t base) {
    auto it = live_blocks.find(base);
    if (it == live_blocks.end()) return;
    Stream* on = nullptr;
    if (!it->second.held && it->second.home != 0) {
      auto home = streams.find(it->second.home);
      if (home != streams.end() && !home->second.destroyed) on = &home->second;
    }
    drop_block(it, on);
  }

  // `on`: the drop's stream; null when the layer above held the block, or the stream is gone.
  void drop_block(std::map<std::uintptr_t, PoolBlock>::iterator it, Stream* on) {
    const std::uintptr_t base = it->first;
    const PoolBlock& block = it->second;
    if (on != nullptr) catch_up(*on);
    if (!block.held) {
      for (const auto& [user, use] : block.uses) {
        const bool covered = (on != nullptr && ordered_after(*on, user, use.seq)) ||
                             std::find(block.recorded.begin(), block.recorded.end(), user) !=
                                 block.recorded.end();
        if (covered) continue;
        hazards.push_back(
            {Hazard::Kind::unrecorded_use,
             fmt::format("{} was dropped on {} while work{} on {} used it, and no "
                         "record_stream named that stream, nor did {} wait for that work: the "
                         "pool may hand the block out again while the work is pending",
                         describe_block(base, block),
                         on != nullptr ? describe(on->id) : std::string("a destroyed stream"),
                         enqueued_at(use.label), describe(user), "the drop's stream"),
             as_pointer(base)});
      }
    }
    const DroppedBlock dropped{block.bytes, on != nullptr ? on->id : 0};
    live_blocks.erase(it);
    lifetime_log.forget(base, base + dropped.bytes);
    dropped_blocks[base] = dropped;
  }

  void stream_destroyed(StreamId id) {
    for (const auto& [base, block] : live_blocks) {
      if (block.held) continue;
      const bool recorded =
          std::find(block.recorded.begin(), block.recorded.end(), id) != block.recorded.end();
      if (block.home != id && !recorded) continue;
      hazards.push_back(
          {Hazard::Kind::destroyed_stream,
           fmt::format("{} was destroyed while {} is live{}: drop the buffer first (its drop "
                       "records a fence on each of its streams, and the handle may already name "
                       "another stream)",
                       describe(id), describe_block(base, block),
                       block.home == id ? "" : " and recorded on it"),
           as_pointer(base)});
    }
  }

  // The checks of an access to a pool's memory. True when the access is a hazard of its own
  // (out of bounds, after the drop, unordered), so that the race check need not report it again.
  // A graph's replay is checked for bounds, drops and order (a replay on a stream not ordered
  // after the block's allocation is unordered, as any work there is). It is not yet a use that
  // the block's drop must name (record_stream): right for what the capture layer keeps until the
  // graph's launches complete (adopted blocks, record_buffer's), but a buffer the user drops
  // while a replay on another stream still uses it goes unreported (a known gap: the capture
  // layer's own drops would need telling apart first). Memory the layer holds for its graphs
  // (block_held) is exempt from the order check too.
  bool check_pool_memory(Stream& stream, std::uint64_t seq, std::uint32_t label,
                         const Access& access, std::uintptr_t begin, std::uintptr_t end,
                         bool replay) {
    auto live = containing(live_blocks, begin);
    if (live == live_blocks.end()) {
      auto dropped = containing(dropped_blocks, begin);
      if (dropped != dropped_blocks.end()) {
        const auto& [base, block] = *dropped;
        hazards.push_back(
            {Hazard::Kind::use_after_drop,
             fmt::format("{} touches the block of {} bytes at [{:#x}, {:#x}) after its drop on "
                         "{}: work launched after a drop must not use the block",
                         describe_access(access, stream.id, label), block.bytes, base,
                         base + block.bytes,
                         block.on != 0 ? describe(block.on) : std::string("its graph's end")),
             as_pointer(base)});
        return true;
      }
      if (!in_pool_segment(begin)) return false;
      hazards.push_back(
          {Hazard::Kind::out_of_bounds,
           fmt::format("{} is in a pool's segment but not inside any live block of it",
                       describe_access(access, stream.id, label))});
      return true;
    }
    auto& [base, block] = *live;
    if (end > base + block.bytes) {
      hazards.push_back(
          {Hazard::Kind::out_of_bounds,
           fmt::format("{} runs {} bytes past the end of {}",
                       describe_access(access, stream.id, label), end - (base + block.bytes),
                       describe_block(base, block)),
           as_pointer(base)});
      return true;
    }
    if (block.held) return false;
    if (!replay) {
      Use& use = block.uses[stream.id];
      use = {std::max(use.seq, seq), label};
    }
    bool unordered = false;
    const auto ordered = [&](const AccessLog::Touch& earlier) {
      return ordered_after(stream, earlier.stream, earlier.seq);
    };
    for (const AccessLog::Race& race :
         lifetime_log.record({stream.id, seq, label}, begin, end, access.write, ordered)) {
      unordered = true;
      const std::string earlier =
          race.earlier.label == allocation_label
              ? fmt::format("the allocation on {}", describe(race.earlier.stream))
              : fmt::format("the {}{} on {}", race.earlier_write ? "write" : "read",
                            enqueued_at(race.earlier.label), describe(race.earlier.stream));
      hazards.push_back(
          {Hazard::Kind::unordered_access,
           fmt::format("{} is not ordered after {} at [{:#x}, {:#x}) of {}: no stream order, "
                       "event wait or host synchronization orders them (completion does not "
                       "count)",
                       describe_access(access, stream.id, label), earlier, race.begin, race.end,
                       describe_block(base, block)),
           as_pointer(base)});
    }
    return unordered;
  }
};

// --- construction -----------------------------------------------------------------------------

FakeDevice::FakeDevice() : FakeDevice(Options{}) {}

namespace {
// The live FakeDevices' states by instance, for a thread's exit (PerThreadStreams). Never
// destroyed: threads may exit during static destruction.
struct LiveStates {
  std::mutex mutex;
  // Ends the capture of a stream of that FakeDevice, by id.
  std::unordered_map<std::uint64_t, std::function<void(StreamId)>> end_capture;
};
LiveStates& live_states() {
  static LiveStates* instance = new LiveStates;
  return *instance;
}
}  // namespace

PerThreadStreams::~PerThreadStreams() {
  if (ids.empty()) return;
  LiveStates& live = live_states();
  std::lock_guard registry(live.mutex);  // before a state's mutex; the state lives meanwhile
  for (const auto& [instance, id] : ids) {
    const auto found = live.end_capture.find(instance);
    if (found != live.end_capture.end()) found->second(id);
  }
}

namespace {
// An ordinal a mask of devices can name (vm_set_access: bit d for device d), as CUDA's are.
const FakeDevice::Options& checked(const FakeDevice::Options& options) {
  if (options.ordinal < 0 || options.ordinal >= 64) {
    throw std::invalid_argument(
        fmt::format("FakeDevice: ordinal {} (0 to 63, as a mask of devices names them)",
                    options.ordinal));
  }
  return options;
}
}  // namespace

FakeDevice::FakeDevice(Options options) : state_(std::make_unique<State>(checked(options))) {
  // Made here, where it may throw, and not first in a device call or the destructor, which may
  // not.
  static_cast<void>(per_thread_key());
  LiveStates& live = live_states();
  std::lock_guard registry(live.mutex);
  live.end_capture.emplace(state_->instance, [state = state_.get()](StreamId id) {
    std::lock_guard lock(state->mutex);
    const auto stream = state->streams.find(id);
    if (stream != state->streams.end() && stream->second.capture) {
      // The capture the thread's stream began ends; one it only joined goes on without it.
      if (stream->second.capture->origin == id) {
        state->leave_capture(stream->second.capture);
      } else {
        stream->second.capture.reset();
      }
    }
  });
}

// Pending work is dropped without running its bodies (they may refer to what the test already
// tore down). User objects still alive are destroyed, so that nothing they own leaks.
FakeDevice::~FakeDevice() {
  {
    LiveStates& live = live_states();
    std::lock_guard registry(live.mutex);
    live.end_capture.erase(state_->instance);
  }
  Destructors remaining;
  {
    std::lock_guard lock(state_->mutex);
    for (const auto& [handle, object] : state_->user_objects) {
      remaining.push_back({object.destroy, object.ptr});
    }
    state_->user_objects.clear();
  }
  run_destructors(remaining);
  if (PerThreadStreams* mine = per_thread_streams(false)) mine->ids.erase(state_->instance);
}

// --- controls ---------------------------------------------------------------------------------

cudaStream_t FakeDevice::create_stream(std::string name) {
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
  const StreamId id = s.new_stream().id;
  s.handles[handle] = id;
  s.names[id] = {handle, std::move(name)};
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
  s.stream_destroyed(destroyed.id);
  destroyed.destroyed = true;
  // The stream that began a capture takes it with it: every stream that joined leaves it too
  // (seen on an H100, 2026-12-07).
  if (destroyed.capture && destroyed.capture->origin == destroyed.id) {
    s.leave_capture(destroyed.capture);
  }
  destroyed.capture.reset();
  if (destroyed.queue.empty()) s.streams.erase(destroyed.id);
  s.handles.erase(it);
  s.free_handles.push_back(stream);
}

void FakeDevice::launch(cudaStream_t stream, std::initializer_list<Access> accesses,
                        std::function<void()> body, std::string_view label) {
  launch(stream, std::vector<Access>(accesses), std::move(body), label);
}

void FakeDevice::launch(cudaStream_t stream, const std::vector<Access>& accesses,
                        std::function<void()> body, std::string_view label) {
  State& s = *state_;
  std::pair<StreamId, std::uint64_t> launched;
  {
    std::lock_guard lock(s.mutex);
    Stream& target = s.control_stream(stream, "launch");
    if (s.implicit_dependency(target)) {
      throw Error(s.refuse_implicit(),
                  "FakeDevice::launch on the legacy default stream while a blocking stream "
                  "(cudaStreamPerThread) captures");
    }
    const std::uint32_t label_id = s.label_id(label);
    if (target.capture) {
      // Work captured after the capture was invalidated is lost, as CUDA loses it.
      if (!target.capture->invalidated) {
        target.capture->items.push_back({accesses, std::move(body), label_id});
        target.capture->captured_on(target.id);
      }
      return;
    }
    launched = {target.id, s.enqueue(target, accesses, std::move(body), label_id)};
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

std::size_t FakeDevice::live_graphs() const {
  std::lock_guard lock(state_->mutex);
  return state_->graphs.size() + state_->execs.size();
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

const FakeDevice::Options& FakeDevice::options() const noexcept { return state_->options; }

const char* FakeDevice::hazard_name(Hazard::Kind kind) noexcept {
  switch (kind) {
    case Hazard::Kind::race: return "race";
    case Hazard::Kind::out_of_bounds: return "out_of_bounds";
    case Hazard::Kind::call_in_user_object_destructor: return "call_in_user_object_destructor";
    case Hazard::Kind::use_after_drop: return "use_after_drop";
    case Hazard::Kind::unordered_access: return "unordered_access";
    case Hazard::Kind::unrecorded_use: return "unrecorded_use";
    case Hazard::Kind::destroyed_stream: return "destroyed_stream";
    case Hazard::Kind::unmapped_in_use: return "unmapped_in_use";
    case Hazard::Kind::destroyed_handle: return "destroyed_handle";
  }
  return "unknown";
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
  s.forget_pool_memory(base, allocation.bytes);
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

cudaError_t FakeDevice::enable_peer_access(int peer) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::enable_peer_access); e != cudaSuccess) return e;
  if (cudaError_t e = s.refuse_if_restricted(); e != cudaSuccess) return e;
  if (peer < 0 || peer >= 64 || peer == s.options.ordinal ||
      ((s.options.peers >> peer) & 1u) == 0) {
    return cudaErrorInvalidDevice;
  }
  s.peer_access_enabled |= std::uint64_t{1} << peer;
  return cudaSuccess;
}

bool FakeDevice::accessible_from(const void* ptr, int device) const {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (device < 0 || device >= 64) return false;
  const std::uint64_t bit = std::uint64_t{1} << device;
  const std::uintptr_t at = address_of(ptr);
  auto a = s.allocations.upper_bound(at);
  if (a != s.allocations.begin() && at < std::prev(a)->first + std::prev(a)->second.bytes) {
    return device == s.options.ordinal || (s.peer_access_enabled & bit) != 0;
  }
  auto r = s.reservations.upper_bound(at);
  if (r == s.reservations.begin()) return false;
  --r;
  auto m = r->second.mappings.upper_bound(at);
  if (m == r->second.mappings.begin()) return false;
  --m;
  return at < m->first + m->second.bytes && (m->second.access & bit) != 0;
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
  mappings.emplace(begin, VmMapping{bytes, handle, 0});
  ++memory->second.mappings;
  return cudaSuccess;
}

cudaError_t FakeDevice::vm_set_access(void* ptr, std::size_t bytes,
                                      std::uint64_t devices) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter_vm(Call::vm_set_access); e != cudaSuccess) return e;
  const std::uintptr_t begin = address_of(ptr);
  const auto range = s.whole_mappings(begin, begin + bytes);
  if (!range) return cudaErrorInvalidValue;
  if ((devices & ~s.reachable_from()) != 0) return cudaErrorInvalidDevice;
  if (s.own_bit() & devices && s.options.host_backed &&
      ::mprotect(ptr, bytes, PROT_READ | PROT_WRITE) != 0) {
    return cudaErrorMemoryAllocation;
  }
  for (auto m = range->first; m != range->second; ++m) m->second.access |= devices;
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
  const auto in_use = s.access_log.pending_access(
      begin, end, [&](const AccessLog::Touch& t) { return !s.done(t.stream, t.seq); });
  if (in_use) {
    const auto& [touch, write] = *in_use;
    s.hazards.push_back(
        {Hazard::Kind::unmapped_in_use,
         fmt::format("vm_unmap of [{:#x}, {:#x}) while a {} {} on {} that uses it is pending",
                     begin, end, write ? "write" : "read", s.enqueued_at(touch.label),
                     s.describe(touch.stream))});
  }
  s.access_log.forget(begin, end);
  if (s.options.host_backed && !in_use) {
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
  Stream* target = s.called_stream(stream, "cudaEventRecord");
  if (it == s.events.end() || target == nullptr) return cudaErrorInvalidResourceHandle;
  if (s.implicit_dependency(*target)) return s.refuse_implicit();
  if (target->capture) {
    if (target->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    it->second = Event{true, {}, target->capture->id, {},
                       target->capture->seen_by(target->id)};
    return cudaSuccess;
  }
  it->second = Event{false, s.snapshot(*target), 0, {}, {}};
  it->second.order = s.order_snapshot(*target);
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
    s.host_learns(it->second.order);
  }
  return s.complete_clock(covers) ? cudaSuccess : cudaErrorNotPermitted;
}

// --- the seam: streams ------------------------------------------------------------------------

// On a capturing stream, waiting on an event recorded in its own capture is a fork or join inside
// the graph (the fake keeps the graph's work in launch order, not as a graph of dependencies);
// waiting on one recorded outside, or in another capture, is refused (below). A stream that is
// not capturing and waits on an event recorded in a capture under way joins that capture.
cudaError_t FakeDevice::stream_wait_event(cudaStream_t stream, cudaEvent_t event) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::stream_wait_event); e != cudaSuccess) return e;
  auto it = s.events.find(event);
  Stream* target = s.called_stream(stream, "cudaStreamWaitEvent");
  if (it == s.events.end() || target == nullptr) return cudaErrorInvalidResourceHandle;
  if (s.implicit_dependency(*target)) return s.refuse_implicit();
  if (target->capture) {
    // A capturing stream may wait on an event recorded in its own capture (fork and join); one
    // recorded outside any capture is refused and invalidates the capture, in every mode (seen on
    // the H200); one recorded in another capture would merge two captures, which CUDA refuses
    // and invalidates both (seen on an H100, 2026-12-06).
    const Event& awaited = it->second;
    if (awaited.captured && awaited.capture == target->capture->id) {
      // A join inside the graph: the waiting stream's later work depends on what the event
      // follows (which is how a joined stream is joined back into the origin).
      target->capture->wait(target->id, awaited.captured_seen);
      return cudaSuccess;
    }
    target->capture->invalidated = true;
    if (!it->second.captured) return cudaErrorStreamCaptureIsolation;
    for (auto& [id, other] : s.streams) {
      if (other.capture && other.capture->id == it->second.capture) other.capture->invalidated = true;
    }
    return cudaErrorStreamCaptureMerge;
  }
  if (it->second.captured && target->id != s.legacy) {
    // An event recorded in a capture still under way: the stream joins that capture (seen on an
    // H100: it reports the capture's status and id, and its work is captured from now on), and
    // the capture cannot end until the stream is joined back.
    for (auto& [id, member] : s.streams) {
      if (member.capture && member.capture->id == it->second.capture) {
        target->capture = member.capture;
        target->capture->joined.insert(target->id);
        target->capture->wait(target->id, it->second.captured_seen);
        return cudaSuccess;
      }
    }
  }
  for (const auto& [other, seq] : it->second.covers) {
    if (other == target->id) continue;  // stream order already covers it
    std::uint64_t& followed = target->follows[other];
    followed = std::max(followed, seq);
  }
  s.forget_done(target->follows);
  s.merge(target->order, it->second.order, target->id);
  return cudaSuccess;
}

cudaError_t FakeDevice::stream_synchronize(cudaStream_t stream) noexcept {
  State& s = *state_;
  Clock covers;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::stream_synchronize); e != cudaSuccess) return e;
    Stream* target = s.called_stream(stream, "cudaStreamSynchronize");
    if (target == nullptr) return cudaErrorInvalidResourceHandle;
    if (s.implicit_dependency(*target)) return s.refuse_implicit();
    if (target->capture) {  // every mode, seen on the H200
      target->capture->invalidated = true;
      return cudaErrorStreamCaptureUnsupported;
    }
    if (cudaError_t e = s.refuse_if_restricted(); e != cudaSuccess) return e;
    // The stream's own work and what it was made to wait for, even with no work after the wait:
    // CUDA enqueues the wait itself.
    covers = s.snapshot(*target);
    s.host_learns(s.order_snapshot(*target));
  }
  return s.complete_clock(covers) ? cudaSuccess : cudaErrorNotPermitted;
}

cudaError_t FakeDevice::device_synchronize() noexcept {
  State& s = *state_;
  Clock before;
  {
    std::lock_guard lock(s.mutex);
    if (cudaError_t e = s.enter(Call::device_synchronize); e != cudaSuccess) return e;
    // Refused while any capture is under way, active or invalidated and not yet ended (seen on
    // the H200 and an H100), and the capture is invalidated.
    bool refused = false;
    for (auto& [id, stream] : s.streams) {
      if (stream.capture) {
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
    s.host_learns_everything();
  }
  return s.complete_clock(before) ? cudaSuccess : cudaErrorNotPermitted;
}

cudaError_t FakeDevice::stream_id(cudaStream_t stream, StreamId* id) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::stream_id); e != cudaSuccess) return e;
  Stream* target = s.called_stream(stream, "cudaStreamGetId");
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  // Refused on a capturing stream, in every mode, and the capture is invalidated (seen on the
  // H200); refused too once it is invalidated, until its end (seen on an H100, 2026-12-07).
  // Other streams' ids may be asked at any time.
  if (target->capture) {
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
  Stream* target = s.called_stream(stream, "cudaStreamGetCaptureInfo");
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  if (s.implicit_dependency(*target)) return cudaErrorStreamCaptureImplicit;  // nothing changes
  const std::shared_ptr<Capture>& capture = target->capture;
  *status = !capture               ? CaptureStatus::none
            : capture->invalidated ? CaptureStatus::invalidated
                                   : CaptureStatus::active;
  if (id != nullptr) *id = *status == CaptureStatus::active ? capture->id : 0;  // as CudaDevice
  return cudaSuccess;
}

// --- the seam: capture and graphs -------------------------------------------------------------

cudaError_t FakeDevice::begin_capture(cudaStream_t stream, CaptureMode mode) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::begin_capture); e != cudaSuccess) return e;
  if (is_legacy(stream)) return cudaErrorStreamCaptureUnsupported;  // as the H200 answers
  Stream* target = s.called_stream(stream, "cudaStreamBeginCapture");
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  if (target->capture) return cudaErrorIllegalState;
  target->capture = std::make_shared<Capture>();
  target->capture->id = next_capture_id.fetch_add(1);
  target->capture->mode = mode;
  target->capture->thread = std::this_thread::get_id();
  target->capture->origin = target->id;
  return cudaSuccess;
}

cudaError_t FakeDevice::end_capture(cudaStream_t stream, cudaGraph_t* graph) noexcept {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (cudaError_t e = s.enter(Call::end_capture); e != cudaSuccess) return e;
  Stream* target = s.called_stream(stream, "cudaStreamEndCapture");
  if (target == nullptr) return cudaErrorInvalidResourceHandle;
  if (!target->capture) return cudaErrorIllegalState;
  const std::shared_ptr<Capture> ending = target->capture;
  Capture& capture = *ending;
  *graph = nullptr;
  if (capture.origin != target->id) {
    // A stream that joined the capture cannot end it: refused, and the capture is invalidated.
    capture.invalidated = true;
    return cudaErrorStreamCaptureUnmatched;
  }
  if (capture.mode != CaptureMode::relaxed && capture.thread != std::this_thread::get_id()) {
    // Refused, and the capture is over: seen on the H200, the stream leaves capture.
    s.leave_capture(ending);
    return cudaErrorStreamCaptureWrongThread;
  }
  s.leave_capture(ending);
  if (capture.invalidated) return cudaErrorStreamCaptureInvalidated;
  // A stream that joined and was not joined back: CUDA makes no graph of a fork left open.
  if (capture.unjoined()) {
    return cudaErrorStreamCaptureUnjoined;
  }
  const auto handle = s.new_object_handle<cudaGraph_t>();
  s.graphs.emplace(handle, Graph{std::move(capture.items), {}});
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
    Stream* target = s.called_stream(stream, "cudaGraphLaunch");
    if (it == s.execs.end() || target == nullptr) return cudaErrorInvalidResourceHandle;
    // As a kernel launch there (probed): not a graph launch itself.
    if (s.implicit_dependency(*target)) return s.refuse_implicit();
    Exec& executable = it->second;
    if (target->capture) {  // CUDA captures the launch as a child graph: its items, here
      if (target->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
      auto& items = target->capture->items;
      items.insert(items.end(), executable.items.begin(), executable.items.end());
      target->capture->captured_on(target->id);
      ++executable.launches;
      return cudaSuccess;
    }
    std::uint64_t seq = 0;
    for (const Item& item : executable.items) {
      seq = s.enqueue(*target, item.accesses, item.body, item.label, true);
    }
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
  Stream* target = s.called_stream(stream, "cudaGraphUpload");
  if (!s.execs.contains(exec) || target == nullptr) return cudaErrorInvalidResourceHandle;
  if (s.implicit_dependency(*target)) return s.refuse_implicit();  // as graph_launch
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

// --- the notifications -----------------------------------------------------------------------
// The pool's word on its blocks (device_calls.def): never counted, never failed. Running out of
// host memory while noting one only weakens the checks.

void FakeDevice::block_live(const void* ptr, std::size_t bytes, std::size_t size,
                            cudaStream_t stream) noexcept {
  std::lock_guard lock(state_->mutex);
  try {
    state_->block_live(address_of(ptr), bytes, size, stream);
  } catch (const std::bad_alloc&) {
  }
}

void FakeDevice::block_recorded(const void* ptr, cudaStream_t stream) noexcept {
  std::lock_guard lock(state_->mutex);
  try {
    state_->block_recorded(address_of(ptr), stream);
  } catch (const std::bad_alloc&) {
  }
}

void FakeDevice::block_dropped(const void* ptr, cudaStream_t stream) noexcept {
  std::lock_guard lock(state_->mutex);
  try {
    state_->block_dropped(address_of(ptr), stream);
  } catch (const std::exception&) {  // bad_alloc, or fmt's format_error
  }
}

void FakeDevice::block_dropped_home(const void* ptr) noexcept {
  std::lock_guard lock(state_->mutex);
  try {
    state_->block_dropped_home(address_of(ptr));
  } catch (const std::exception&) {  // bad_alloc, or fmt's format_error
  }
}

void FakeDevice::block_held(const void* ptr, std::size_t bytes) noexcept {
  std::lock_guard lock(state_->mutex);
  try {
    state_->block_held(address_of(ptr), bytes);
  } catch (const std::bad_alloc&) {
  }
}

}  // namespace streampool
