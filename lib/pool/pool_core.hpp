// PoolCore: the stream-ordered cache behind a MemoryPool.
//
// The data model, and who may touch what (docs/design.md, "MemoryPool", says why):
//
//   PoolCore                 lives until the MemoryPool object, its last buffer and the last
//    │                       layer above that keeps it (see orphan()) are gone
//    ├─ StreamRegistry       stream -> StreamState; the threads' caches      registry mutex
//    │   └─ StreamState      one per stream: free[class] lists, fence log,   its spin lock
//    │       ├─ Timeline     counters, unfenced bytes; blocks on its lists
//    │       ├─ free[class]  are safe on it at once, elsewhere once covered
//    │       └─ shelf        large ranges it dropped, kept for its own requests
//    ├─ SmallTier            depot[class] of clean blocks; slabs             depot mutex
//    ├─ LargeTier            segments -> ranges; free ranges by size         arena mutex
//    ├─ parked               blocks waiting for several needs                parked mutex
//    ├─ device timeline      device synchronizes, as fences                  (atomics)
//    ├─ EventPool            idle fence events                               event mutex
//    ├─ Gate*                the hooks of the layer above (gate.hpp)
//    └─ Observer*            kept for the public entry points, never called here (observer.hpp)
//
//   Block: a range of device memory (block.hpp). Live: on no list, counted on its home stream.
//   Free: its Need (a timeline and a fence index) says who may have it; covered() decides.
//
// Lock order: reclaim mutex, registry mutex, depot mutex, arena mutex, one stream's lock, then
// the leaves (parked, event, keepers, raw shards), each taken alone. The fast paths take one
// stream's lock and nothing else.
#pragma once

#include "block.hpp"
#include "failure.hpp"
#include "fences.hpp"
#include "gate.hpp"
#include "large_tier.hpp"
#include "observer.hpp"
#include "small_tier.hpp"
#include "spin_lock.hpp"
#include "stream_registry.hpp"
#include "stream_state.hpp"

#include <streampool/device.hpp>
#include <streampool/error.hpp>
#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>
#include <streampool/size_classes.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace streampool::detail {

// A free block that waits for several needs (uses on several streams, or a use only a device
// synchronize can cover); clean once all are covered.
struct Parked {
  Block* block;
  std::vector<Need> needs;
};

// Destroys the cores whose destruction calls_allowed() deferred, where it is allowed now. The
// layer above calls it at its safe points; every new pool calls it too.
void bury_dead_pools() noexcept;

class PoolCore {
 public:
  PoolCore(std::shared_ptr<Device> device, const PoolOptions& options);
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;

  // --- the public operations -------------------------------------------------------------
  // allocate.cpp. Through the instance of allocate_as for the pool's StreamChecks, chosen at
  // construction: the stream's lookup is inlined into the fast path, with no branch on the checks.
  Block* allocate(std::size_t bytes, cudaStream_t stream, Failure& error) noexcept {
    return allocate_(*this, bytes, stream, error);
  }
  // drop.cpp: the one drop. `stream` is the stream the drop is ordered on: a PooledBuffer's own,
  // or the one deallocate names.
  void drop(Block* block, cudaStream_t stream) noexcept;
  // Throws Error when the stream cannot be identified.
  void record_stream(Block* block, cudaStream_t stream);
  // raw_api.cpp
  void* allocate_raw(std::size_t bytes, cudaStream_t stream, Failure& error) noexcept;
  // `bytes`: the size the caller says it allocated (checked in debug builds).
  void deallocate_raw(void* ptr, std::size_t bytes, cudaStream_t stream) noexcept;
  // reclaim.cpp
  void release_stream(cudaStream_t stream);
  void trim(std::size_t bytes_to_keep);
  // pool_core.cpp: MemoryPool::grant_access.
  void grant_access(int device);
  // stats.cpp
  PoolStats stats() const;
  PoolBreakdown breakdown();
  std::string out_of_memory_message(std::size_t bytes, cudaStream_t stream);
  // Whether `bytes` more would pass max_reserved_bytes: then the limit refused the request, not
  // the device.
  bool past_reserved_limit(std::size_t bytes) const noexcept;
  // pool_core.cpp: the MemoryPool object is gone; destroy now, or when the last buffer or
  // keeper (keep()) goes.
  void orphan() noexcept;

  Device& device() const noexcept { return *device_; }
  const std::shared_ptr<Device>& shared_device() const noexcept { return device_; }
  const PoolOptions& options() const noexcept { return options_; }
  const SizeClasses& classes() const noexcept { return classes_; }

  // --- for the gate (the layer above) ---------------------------------------------------------
  // Installs the gate (once; the pool owns it from then on) and returns the one installed.
  Gate& install_gate(std::unique_ptr<Gate> gate) noexcept;
  Gate* gate() const noexcept { return gate_.load(std::memory_order_acquire); }
  // The gate's layer has work under way that any stream may join (gate.hpp), counted by the
  // layer: meanwhile every stream's state has the `joinable` attention bit, which keeps its
  // drops off the fast path at no cost to it and sends them to the gate (drop.cpp).
  void gate_busy_begins() noexcept { registry_.gate_busy(+1); }
  void gate_busy_ends() noexcept { registry_.gate_busy(-1); }
  StreamRegistry& registry() noexcept { return registry_; }
  // A clean range of the arena of at least `bytes` (the out-of-memory ladder climbed if needed).
  Block* take_range(std::size_t bytes, Failure& error) noexcept;
  // Back to the arena, free once every need is covered.
  void return_range(Block* range, std::vector<Need> needs) noexcept;
  // Back to the arena after the next device synchronize: a range whose uses are not all known.
  void strand_range(Block* range) noexcept;
  // Parks a block that came back, with the needs of its uses (those covered already dropped).
  // Where that finds no host memory, the block is stranded instead.
  bool park(Block* block, std::vector<Need> needs) noexcept;  // false: stranded
  // A block whose needs cannot be remembered (no host memory): it waits, on a list that needs
  // none, for a device synchronize begun after it was listed, which covers every need it had.
  void strand(Block* block) noexcept;
  // Appends the needs of these uses, each fenced now where it can be (see drop.cpp). False when
  // there was no memory to list them: the block must then wait for a device synchronize
  // (strand) begun after every one of them was enqueued.
  bool fence_uses(UseSpan uses, std::vector<Need>& needs) noexcept;
  // Records a fence on `s` now (its call names it) and returns the need it covers; the need of
  // an unfenced drop when no fence could be made; a device-timeline need when `s` no longer is
  // the state it was at `generation`.
  Need fence_now(StreamState& s, std::uint32_t generation) noexcept;
  // Counts `b` live on `s` / no longer live (the gate's own allocations and drops).
  void count_allocation(StreamState& s, Block* b, std::size_t bytes) noexcept;  // [s.lock]
  void count_drop(Block* b) noexcept;  // [nothing locked]
  // --- for a layer that watches the public calls (observer.hpp) --------------------------------
  // Installs the observer (once; the core owns it from then on, so that calls in flight on
  // other threads never see it destroyed) and returns the one installed. It is called only while
  // published (observing(true)); the public entry points read observer() once per call.
  Observer& install_observer(std::unique_ptr<Observer> observer) noexcept;
  void observing(bool on) noexcept;
  Observer* installed_observer() noexcept;  // published or not; null before install_observer
  Observer* observer() const noexcept { return observer_.load(std::memory_order_acquire); }

  // Something above the pool keeps the core alive until it lets go.
  void keep() noexcept;
  void let_go() noexcept;

  // --- notifications to the device (device_calls.def, the last section) ---------------------
  // One test of a flag read at construction: a device that wants none (CudaDevice) costs the
  // fast paths a predictable branch and nothing else. Each is made before the block can reach
  // another thread (a drop's, before the block is on any list), with no lock held.
  void announce_live(const Block* b, cudaStream_t stream) noexcept {
    if (notify_) [[unlikely]] device_->block_live(b->ptr, b->requested, b->size, stream);
  }
  void announce_recorded(const Block* b, cudaStream_t stream) noexcept {
    if (notify_) [[unlikely]] device_->block_recorded(b->ptr, stream);
  }
  // `stream`: the drop's; null for memory the layer above held (announce_held).
  void announce_dropped(const Block* b, cudaStream_t stream) noexcept {
    if (notify_) [[unlikely]] device_->block_dropped(b->ptr, stream);
  }
  // A drop on the block's own stream (drop()), whose handle is `stream`: cudaStreamPerThread
  // names another stream in every thread, so where the block's is another thread's, the drop is
  // announced on the block's home stream (a live block's home is never recycled, so its handle
  // and owner are still those of the allocation).
  void announce_dropped_home(const Block* b, cudaStream_t stream) noexcept {
    if (notify_) [[unlikely]] {
      if (stream == cudaStreamPerThread && !b->home->addressable()) {
        device_->block_dropped_home(b->ptr);
      } else {
        device_->block_dropped(b->ptr, stream);
      }
    }
  }
  void announce_held(const Block* b) noexcept {
    if (notify_) [[unlikely]] device_->block_held(b->ptr, b->size);
  }

  // --- for the parts of the pool --------------------------------------------------------------
  // fences.cpp, all [s.lock]
  // Records a fence on `s` covering every block dropped on it so far: its index is the
  // `recorded` before the call. Requires s addressable and not retired. Falls back to a stream
  // synchronize when the event cannot be created or recorded (`synchronized`: every block dropped
  // on s so far is then clean), except with `may_block` false (a caller holding a lock other
  // threads need while s's work runs). `failed` when neither worked, or when s is capturing (a
  // fence recorded there would belong to the graph).
  FenceResult record_fence(StreamState& s, bool may_block = true) noexcept;
  // Learns which of s's fences completed (event queries, where allowed).
  void refresh(StreamState& s) noexcept;
  // s's fences up to `index` completed (the caller waited for s's work): they leave the list,
  // their events back to the idle ones. `index` must be recorded.
  void complete_through(StreamState& s, std::uint64_t index) noexcept;
  // The first fence recorded with an event whose index is >= `index`, or null.
  const Fence* fence_at(const StreamState& s, std::uint64_t index) const noexcept;
  // NOT under s.lock: records a fence on s, waits on the CPU until s's work so far has completed,
  // holding no lock meanwhile, and learns which of s's fences completed: every block dropped on s
  // before the call is covered after it. The event waited for is one of the caller's, recorded
  // right after the fence: a fence's own event goes back to the event pool when another thread
  // learns it completed, and may be recorded again elsewhere while it is waited for; where that
  // event cannot be made or recorded, the stream is synchronized instead (counted in
  // PoolStats::blocking_fallbacks). False where it could not wait (s retired or not addressable,
  // capturing, a failed call, or the gate forbids the wait).
  bool wait_for_stream(StreamState& s) noexcept;
  // A drop of `bytes` landed on s: true when the fence policy, or another stream, wants a fence
  // on s now. [s.lock] The clock is read once every FencePolicy::clock_every drops: the time
  // bound starts at the first reading after the stream's last fence (or after its unfenced bytes
  // were all reused there), so it holds to within that many drops.
  bool dropped_here(StreamState& s, std::size_t bytes) noexcept {
    s.unfenced_bytes += bytes;
    if (s.unfenced_bytes >= s.unfenced_limit) return true;
    if ((s.attention.load(std::memory_order_relaxed) & wants_fence) != 0) return true;
    return clock_due(s) && past_time_bound(s);
  }
  // One more drop under the time bound: true when it is the one that reads the clock. [s.lock]
  bool clock_due(StreamState& s) const noexcept {
    return policy_.unfenced_ns != 0 && s.unfenced_limit != unbounded &&
           ++s.drops % FencePolicy::clock_every == 0;
  }
  // Reads the clock: true when s's unfenced bytes are older than the time bound, whose start is
  // the first reading after s's last fence. [s.lock]
  bool past_time_bound(StreamState& s) const noexcept {
    const std::int64_t now = now_ns();
    if (s.unfenced_since_ns == 0) {
      s.unfenced_since_ns = now;
      return false;
    }
    return now - s.unfenced_since_ns > policy_.unfenced_ns;
  }
  // Free blocks that came to s from another stream by waiting on its fence (cross_stream_wait)
  // have s's need now, as if dropped here: they count among s's unfenced bytes, which
  // reused_here takes them off again. [s.lock]
  static void waited_here(StreamState& s, std::size_t bytes) noexcept {
    s.unfenced_bytes += bytes;
  }
  // A free block of s goes back into use on s. [s.lock]
  static void reused_here(StreamState& s, const Need& need, std::size_t bytes) noexcept {
    if (need.timeline != &s.timeline ||
        need.index != s.timeline.recorded.load(std::memory_order_relaxed)) {
      return;  // covered by a fence already: not counted as unfenced
    }
    s.unfenced_bytes -= std::min(bytes, s.unfenced_bytes);
    if (s.unfenced_bytes == 0) s.unfenced_since_ns = 0;
  }
  static constexpr std::size_t unbounded = FencePolicy::unbounded;  // one stream: no fence
  // Records the fence another stream asked for, if any.
  void fence_if_asked(StreamState& s) noexcept;
  // The fence policy wants a fence on s now: records it, or, where this thread may not name s
  // (another thread's per-thread default stream), asks s's own thread's next call to. [s.lock]
  void fence_or_ask(StreamState& s) noexcept;

  // Is the need covered, learning (querying its stream's fences) if it is not yet known? Takes
  // the stream's lock: call with no stream locked.
  bool learn_covered(const Need& need) noexcept;
  // [nothing locked] Every shelf back to the arena, as before any growth of the arena; true when
  // a range moved. `caller`: the stream the call names, if any (the others' fences are asked
  // for, not recorded).
  bool unshelve_all(const StreamState* caller = nullptr) noexcept;
  // Parked blocks whose needs are all covered go back clean (their streams' fences are asked).
  void drain_parked() noexcept;
  // The same for the oldest few, by the fences already known to have completed: after a park.
  void drain_parked_front() noexcept;
  // The same as drain_parked, asking only the fences that parked large ranges a request of
  // `rounded` bytes would get whole wait for (rounded up to rounded + large_rounding), and only
  // if there is one.
  void drain_parked_of(std::size_t rounded) noexcept;
  // [parked_mutex_] A large range joins (+1) or leaves (-1) parked_.
  void count_parked_large(int change) noexcept {
    parked_large_.store(parked_large_.load(std::memory_order_relaxed) +
                            static_cast<std::size_t>(change),
                        std::memory_order_relaxed);
  }
  // Blocks (small or large) that no pending work uses go back to their tier.
  void make_clean(const std::vector<Block*>& blocks) noexcept;
  // A block off every list with pending needs: clean, parked, or (one need) where it belongs.
  void settle(Block* block, const std::vector<Need>& needs) noexcept;
  // Moves a retired state's free blocks off it (stream_registry.cpp calls it). [registry]
  // With `may_fence` (release_stream) its last fence is recorded without waiting; where that
  // fails, the fence is virtual, and with `unwaited` the bytes it covers go there instead of
  // being counted as stranded: the caller waits for the stream, or counts them.
  void empty_retired(StreamState& s, bool may_fence, std::size_t* unwaited = nullptr) noexcept;

  // reclaim.cpp
  // Runs `attempt` (which returns a block or sets `error`); on out-of-memory, climbs the reclaim
  // ladder one step at a time and tries again after each. Out of memory at the top of a ladder
  // whose device synchronize failed reports that failure instead: it is the news (on a GPU,
  // usually the sticky error of an earlier kernel), not the refusal it left standing.
  template <class Attempt>
  Block* with_reclaim(Attempt&& attempt, Failure& error) noexcept {
    error.clear();
    if (Block* b = attempt()) return b;
    if (error != Errc::out_of_memory) return nullptr;
    oom_retries_.fetch_add(1, std::memory_order_relaxed);
    Failure step_failed;
    for (int step = 0; step < reclaim_steps; ++step) {
      if (!reclaim(step, step_failed)) continue;
      error.clear();
      if (Block* b = attempt()) return b;
      if (error != Errc::out_of_memory) return nullptr;
    }
    if (step_failed && error == Errc::out_of_memory) error = step_failed;
    return nullptr;
  }
  static constexpr int reclaim_steps = 4;
  // `failed`: set when the step's own device call failed.
  bool reclaim(int step, Failure& failed) noexcept;
  // After a device synchronize every block dropped before it is clean: covers every timeline up
  // to it and moves what that frees to the depot and the arena. False when not allowed now, or
  // when the synchronize failed (then `failed`, if given, says how).
  // `only_if_due`: not unless reclaim_due() still holds once this thread is the reclaimer.
  bool synchronize_and_reclaim(Failure* failed = nullptr, bool only_if_due = false) noexcept;
  // Retires idle streams now and then, and keeps the stranded-memory bound (docs/design.md,
  // "Streams"): synchronizes when it is passed, or when the last synchronize failed (not again
  // before retry_at_ns_).
  void reclaim_if_stranded() noexcept;
  // The stranded-memory bound is passed, or the last synchronize failed, and retry_at_ns_ has come.
  bool reclaim_due() const noexcept;
  void note_stranded(std::size_t bytes) noexcept {
    stranded_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }

  // stats.cpp
  void publish(StreamCounters& c, bool exact = false) noexcept;  // [lock of c's stream]
  // Ends the one-stream regime of the published sums (falls_wait_): every stream publishes its
  // falls, before a second stream, or a range held by a layer above, can raise a peak. Once; the
  // registry calls it when it first sees a second stream or a stream retire. [no stream lock]
  void publish_falls() noexcept;
  void count_device_allocation(std::size_t bytes) noexcept;
  void count_device_free(std::size_t bytes) noexcept;
  std::int64_t stats_reserved() const noexcept { return reserved_.load(); }
  // A range handed to a layer above (take_range) counts as a live allocation of its size.
  void count_range(const Block& range, bool taken) noexcept;

  // invariants.cpp
  bool consistent_state(StreamState& s) noexcept;  // [s.lock]
  bool consistent() noexcept;                       // [nothing locked]

  const FencePolicy& policy() const noexcept { return policy_; }
  Timeline& device_timeline() noexcept { return device_timeline_; }
  EventPool& events() noexcept { return events_; }
  SmallTier& small() noexcept { return small_; }
  LargeTier& large() noexcept { return large_; }

 private:
  ~PoolCore();

  // reclaim.cpp (defined and used there only): drain_parked, asking the fences of the parked
  // blocks `asked` selects; nothing at all when it selects none.
  template <class Asked>
  void drain_asking(Asked asked) noexcept;

  // allocate.cpp
  Block* allocate_slow(StreamState& s, std::uint32_t generation, std::size_t bytes,
                       cudaStream_t stream, Failure& error) noexcept;
  // The state allocate_slow was given is no longer the stream's: the stream looked up again, and
  // the allocation made there (or the gate's, or the lookup's failure).
  Block* allocate_found_again(std::size_t bytes, cudaStream_t stream, Failure& error) noexcept;
  Block* allocate_large(StreamState& s, std::size_t bytes, Failure& error) noexcept;
  Block* allocate_gated(std::size_t bytes, cudaStream_t stream, const GateStatus& status,
                        Failure& error) noexcept;
  // drop.cpp
  void drop_slow(Block* b, cudaStream_t stream, UseSpan uses) noexcept;
  Uses uses_of(Block* b) noexcept;
  void forget_recorded(Block* b) noexcept;  // the record_stream entries, given up
  void place(Block* b, UseSpan uses) noexcept;
  void keep_on(StreamState& u, Block* b) noexcept;  // [u.lock], unlocks it
  // shelf.cpp: the large ranges a stream keeps for itself (StreamState::shelf).
  // [s.lock] The newest shelved range of `bytes` rounded to large_rounding, off the shelf; or
  // null. Inline: the allocation's fast path for a large request (allocate.cpp).
  Block* take_shelved(StreamState& s, std::size_t bytes) noexcept {
    if (s.shelf.empty() || bytes > (std::size_t{1} << 50)) return nullptr;
    const std::size_t rounding = options_.large_rounding;  // a power of two (validate())
    const std::size_t rounded = (bytes + rounding - 1) & ~(rounding - 1);
    for (Block* b = s.shelf.head; b != nullptr; b = b->next) {
      // Of the request's size alone: a larger range would be held whole by the smaller buffer,
      // where the arena would cut it. (Allowing 1/8 or 1/32 more gained nothing in the fake
      // replays of the traces and embedded workloads, and one of them held a segment more.)
      if (b->size == rounded) {
        s.shelf.remove(b);
        s.shelved.store(static_cast<std::uint32_t>(s.shelf.count), std::memory_order_relaxed);
        return b;
      }
    }
    return nullptr;
  }
  // [s.lock] Puts a large range just dropped on s (its need set) on s's shelf; true when that
  // made the shelf too long (shelf_overflow then takes the oldest off).
  bool shelve(StreamState& s, Block* range) noexcept {
    STREAMPOOL_ASSERT(range->large && !range->free && range->requested == 0);
    s.shelf.push_front(range);
    s.shelved.store(static_cast<std::uint32_t>(s.shelf.count), std::memory_order_relaxed);
    return s.shelf.count > options_.large_shelf;
  }
  // [s.lock] The oldest range of s's shelf off it, where the shelf is too long, for the caller
  // to give to_arena() unlocked; else null.
  Block* shelf_overflow(StreamState& s) noexcept;
  // [nothing locked] A range of s (as of `generation`) back to the arena with its need.
  // `named`: the call names s (a drop on it, its own allocation), so it may record the fence the
  // policy then wants; otherwise s's next call is asked for it (a fence is recorded only inside
  // a call that names its stream: s may be destroyed, its handle another stream's).
  void to_arena(StreamState& s, std::uint32_t generation, Block* range,
                bool named = true) noexcept;
  // [nothing locked] s's shelf back to the arena; true when a range moved.
  bool unshelve(StreamState& s, bool named = true) noexcept;
  // [s.lock] Empties s's shelf into `out`.
  void take_shelf(StreamState& s, BlockList& out) noexcept;
  // [s.lock] The block is no longer live on s; true when the core is orphaned (count down).
  bool count_release(StreamState& s, Block* b) noexcept {
    const bool due = uncount(s, b);
    // A retired stream publishes exactly: its slack would stay in the sums while its state
    // waits to be recycled, however long that is. (Retiring one ended the one-stream regime.)
    if ((s.attention.load(std::memory_order_relaxed) & retired) != 0) {
      publish(s.counters, true);
    } else if (due) {
      publish(s.counters);
    }
    return s.orphaned;
  }
  // [s.lock] count_release's counting, for a stream not retired: true when s's counters are to
  // be published now (their falls are past the slack). With one stream, its falls wait
  // (falls_wait_): what it published is at least the truth, and only its own rises, published
  // exactly, raise the peaks.
  bool uncount(StreamState& s, Block* b) const noexcept {
    StreamCounters& c = s.counters;
    c.requested -= static_cast<std::int64_t>(b->requested);
    --c.live;
    b->requested = 0;
    return (c.requested_published - c.requested > byte_slack_ ||
            c.live_published - c.live > count_slack_) &&
           !falls_wait_.load(std::memory_order_relaxed);
  }
  // pool_core.cpp
  void count_down() noexcept;
  // Destroys the core once release_device_memory() succeeds; until then it waits in the
  // graveyard for the next safe point (bury_dead_pools).
  void destroy() noexcept;
  // Waits for the device, destroys every event and gives back every segment; false when the
  // device refused a free or an event destroy (twice in a row): what it did free or destroy is
  // not again, the rest is tried again at the next call. [no other thread]
  bool release_device_memory() noexcept;

  using AllocateFn = Block* (*)(PoolCore&, std::size_t, cudaStream_t, Failure&) noexcept;
  static AllocateFn allocate_of(StreamChecks checks) noexcept;
  template <StreamChecks checks>
  static Block* allocate_as(PoolCore& pool, std::size_t bytes, cudaStream_t stream,
                            Failure& error) noexcept;
  // The fast paths (allocate.cpp, drop.cpp) are written so that they call nothing they return
  // from: each rare case jumps to one of the functions below, which does the whole of it. A
  // function that calls and then goes on keeps its values in callee-saved registers, and every
  // call pays for saving and restoring them (a dozen instructions of a pair of about 350).
  template <StreamChecks checks>
  static Block* allocate_looking(PoolCore& pool, std::size_t bytes, cudaStream_t stream,
                                 Failure& error) noexcept;  // the stream's lookup, then:
  // The id of a stream whose gate status allows asking it (the caller asked, as ask_id does),
  // and its state; {} with `error` set where CUDA gave no id or the host had no memory.
  inline StreamRegistry::Found found_by_id(cudaStream_t stream, Failure& error) noexcept;
  // StreamChecks::full's allocation where the stream's gate status, asked alone (`first`), is
  // not ordinary: ask_id's verdict on it, completed.
  Block* allocate_unordinary(std::size_t bytes, cudaStream_t stream, GateStatus first,
                             Failure& error) noexcept;
  // find() gave no state: the gate's allocation (a capturing stream), or the failure CUDA gave.
  Block* unfound(std::size_t bytes, cudaStream_t stream, const GateStatus& gate,
                 Failure& error) noexcept;
  Block* allocate_locking(StreamState& s, std::uint32_t generation, std::size_t bytes,
                          cudaStream_t stream, Failure& error) noexcept;  // s's lock, any way
  // [s.lock, taken as `biased` says] A block of s's list or shelf for the request, if s is still
  // the state of `generation` and needs no attention; else allocate_slow. s's lock goes.
  template <bool biased>
  inline Block* served_here(StreamState& s, std::uint32_t generation, bool large,
                            std::size_t bytes, cudaStream_t stream, Failure& error) noexcept;
  // [s.lock, taken as `biased` says] A free block of s, just off its list, goes live on s; s's
  // lock goes.
  template <bool biased>
  inline Block* allocated_here(StreamState& s, Block* b, std::size_t bytes,
                               cudaStream_t stream) noexcept;
  Block* allocated_rare(StreamState& s, Block* b, cudaStream_t stream, bool publish_due) noexcept;
  void drop_announcing(Block* b, cudaStream_t stream) noexcept;  // drop() where notify_
  inline void drop_unannounced(Block* b, cudaStream_t stream) noexcept;  // drop.cpp alone
  void drop_locking(Block* b, cudaStream_t stream) noexcept;
  // [s.lock, taken as `biased` says] A small block of s dropped on s, which droppable_here
  // allows, goes onto s's list; s's lock goes.
  template <bool biased>
  inline void dropped_on_list(StreamState& s, Block* b) noexcept;
  void dropped_rare(StreamState& s, bool publish_due, bool clock) noexcept;
  // The same for a large range of s dropped on s, onto its shelf (shelf.cpp).
  static bool shelvable_here(const StreamState& s, const Block* b) noexcept {
    return s.attention.load(std::memory_order_relaxed) == 0 &&
           s.generation.load(std::memory_order_relaxed) == b->home_generation;
  }
  template <bool biased>
  inline void dropped_on_shelf(StreamState& s, Block* b) noexcept;
  void shelved_rare(StreamState& s, bool publish_due, bool past_bound, bool clock) noexcept;
  // [s.lock] May a small block of s dropped on s go straight onto s's list? Not when s needs
  // attention, was retired or recycled since the block's allocation, or the drop would pass
  // s's unfenced bound.
  static bool droppable_here(const StreamState& s, const Block* b) noexcept {
    return s.attention.load(std::memory_order_relaxed) == 0 &&
           s.generation.load(std::memory_order_relaxed) == b->home_generation &&
           s.unfenced_bytes + b->size < s.unfenced_limit;
  }
  // [s.lock] count_allocation's counting: true when s's counters are to be published now.
  bool count_live(StreamState& s, Block* b, std::size_t bytes) noexcept {
    STREAMPOOL_ASSERT(b->requested == 0 && b->recorded == nullptr);
    b->home = &s;
    b->home_generation = s.generation.load(std::memory_order_relaxed);
    if (!b->large) b->free = false;  // a large range's flag is the arena's, under its mutex
    b->requested = bytes;
    StreamCounters& c = s.counters;
    c.requested += static_cast<std::int64_t>(bytes);
    c.requested_total += static_cast<std::int64_t>(bytes);
    ++c.live;
    ++c.live_total;
    return c.requested > c.requested_published || c.live > c.live_published;
  }

  std::shared_ptr<Device> device_;  // the user's device, decorated (reserved limit, nvtx)
  const bool notify_;               // device_->wants_notifications(), asked once
  const AllocateFn allocate_;       // allocate_of(options_.stream_checks)
  // Read by every public call, written only when recording starts or stops: kept beside the
  // constants, away from the lines the fast paths write.
  std::atomic<Observer*> observer_{nullptr};
  const PoolOptions options_;
  const SizeClasses classes_;
  const FencePolicy policy_;
  // How far a stream's published byte and allocation counts may run above its true ones.
  const std::int64_t byte_slack_;
  const std::int64_t count_slack_;
  // While the pool has seen one stream and no range held above: drops publish no fall (stats.cpp).
  // Read by every drop, written once (publish_falls), under each stream's lock in turn.
  std::atomic<bool> falls_wait_{true};

  EventPool events_;
  Timeline device_timeline_;
  StreamRegistry registry_;
  SmallTier small_;
  LargeTier large_;

  std::mutex parked_mutex_;
  std::deque<Parked> parked_;  // in the order the blocks parked
  BlockList stranded_blocks_;  // strand()'s [parked_mutex_]
  // How many of them are large ranges: written under parked_mutex_, read without it as a hint.
  std::atomic<std::size_t> parked_large_{0};

  // The raw-pointer API: pointer -> block, sharded to keep threads apart.
  static constexpr unsigned raw_shards = 64;
  struct alignas(64) RawShard {
    SpinLock lock;
    std::unordered_map<void*, Block*> blocks;
  };
  std::unique_ptr<RawShard[]> raw_;

  std::mutex reclaim_mutex_;  // one reclaimer at a time
  std::atomic<std::size_t> stranded_bytes_{0};  // an estimate; a synchronize takes off its own
  std::atomic<std::size_t> lost_streams_{0};     // retired with a virtual fence since then
  // The last device synchronize failed: its virtual fence on every stream stays pending, and
  // each stream's later fences complete behind it, until one succeeds. A slow path tries again
  // (reclaim_if_stranded): the first time at once, then not before retry_at_ns_, which each
  // failure in a row puts twice as far off (1 ms, 2 ms, ... up to max_retry_wait_ns), since each
  // try sweeps every stream and leaves another virtual fence on it.
  std::atomic<bool> synchronize_failed_{false};
  std::atomic<std::uint32_t> failed_syncs_{0};  // in a row
  std::atomic<std::int64_t> retry_at_ns_{0};
  static constexpr std::int64_t max_retry_wait_ns = 1'000'000'000;
  std::atomic<std::int64_t> next_idle_check_ns_{0};

  std::atomic<std::int64_t> requested_published_{0};
  std::atomic<std::int64_t> requested_peak_{0};
  std::atomic<std::int64_t> live_published_{0};
  std::atomic<std::int64_t> live_peak_{0};
  std::atomic<std::int64_t> reserved_{0};
  std::atomic<std::int64_t> reserved_peak_{0};
  std::atomic<std::int64_t> reserved_total_{0};
  std::atomic<std::uint64_t> device_allocations_{0};
  std::atomic<std::uint64_t> device_frees_{0};
  std::atomic<std::uint64_t> oom_retries_{0};

  std::atomic<Gate*> gate_{nullptr};
  std::unique_ptr<Gate> owned_gate_;
  std::mutex gate_mutex_;
  std::unique_ptr<Observer> owned_observer_;  // [gate_mutex_]

  // Lifetime: see orphan().
  mutable std::mutex keepers_mutex_;
  std::int64_t keepers_ = 0;   // [keepers_mutex_]
  StreamCounters ranges_;      // ranges held by layers above [keepers_mutex_]
  bool orphaned_ = false;      // [keepers_mutex_]
  std::atomic<std::int64_t> orphan_remaining_{0};
  // release_device_memory's device synchronize succeeded / its events were taken. [destroy()]
  bool synchronized_at_end_ = false;
  bool events_taken_ = false;
  std::vector<cudaEvent_t> undestroyed_events_;  // events it has yet to destroy [destroy()]

  friend class StreamRegistry;
  friend void bury_dead_pools() noexcept;
};

}  // namespace streampool::detail
