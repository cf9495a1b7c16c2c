// The pool's private state: see the data model at the top of include/streampool/memory_pool.hpp.
// This header is the one place its parts are declared; each part's code has a file of its own:
//
//   pool_core.cpp   construction, destruction, the fast paths, stream resolution
//   fences.cpp      recording fences, learning which completed, the event free list
//   small_tier.cpp  the slow path of small blocks: depot, stealing, new slabs
//   arena.cpp       device segments and the large tier: best fit, split, coalesce
//   reclaim.cpp     out-of-memory ladder, device-synchronize reclaim, trim, release_stream
//   stats.cpp       counters and their sums
#pragma once

#include "block.hpp"
#include "spin_lock.hpp"

#include <streampool/device.hpp>
#include <streampool/error.hpp>
#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>
#include <streampool/size_classes.hpp>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

namespace streampool::detail {

class CaptureBinding;
class PoolCore;

struct Fence {
  std::uint64_t index;
  cudaEvent_t event;
};

enum class FenceResult { recorded, synchronized, failed };

// A block dropped after use on several streams, waiting for a fence on each: it becomes clean
// when each (stream, tag) has tag < stream->completed. A null stream stands for a use that could
// not be fenced: only a device synchronize clears it.
struct Parked {
  Block* block;
  std::vector<std::pair<StreamState*, std::uint64_t>> needs;
};

// Counters of one stream, guarded by its lock; stats() sums them over the streams.
struct StreamCounters {
  std::int64_t requested = 0;  // bytes of live allocations made on this stream
  std::int64_t requested_total = 0;
  std::int64_t live = 0;       // live allocations made on this stream
  std::int64_t live_total = 0;
  // What this stream has added to the pool-wide sums (see PoolCore::publish): at least the
  // current value, and at most 2 granules above it.
  std::int64_t requested_published = 0;
  std::int64_t live_published = 0;
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t fences = 0;
  std::uint64_t cross_stream = 0;
  std::uint64_t blocking = 0;
};

// Bits of StreamState::attention: any set bit sends allocations and drops on the stream off the
// fast path.
enum Attention : std::uint32_t {
  wants_fence = 1u << 0,    // another stream waits for blocks dropped here: record a fence
  retired = 1u << 1,        // released or dead: no longer found by stream lookups
  capture_bound = 1u << 2,  // being captured with a CapturePool
};

// One CUDA stream, as the pool sees it. Never freed while the pool lives: retired states are
// recycled with a new generation, so a thread's stale cache entry can always be checked safely.
struct alignas(64) StreamState {
  SpinLock lock;
  std::atomic<std::uint32_t> attention{0};
  std::atomic<std::uint32_t> generation{0};
  std::vector<BlockList> free;  // per size class [lock]
  // Fences recorded on this stream so far (some virtual: a synchronize); a drop takes it as its
  // block's tag. Written under the lock, read anywhere.
  std::atomic<std::uint64_t> fence_seq{0};
  // Every fence with a smaller index has completed. Written under the lock, read anywhere.
  std::atomic<std::uint64_t> completed{0};
  StreamCounters counters;    // [lock]
  std::deque<Fence> fences;   // recorded, not yet known complete, oldest first [lock]
  bool orphaned = false;      // the MemoryPool object is gone; drops count down [lock]
  // Retired, and every block ever dropped on it is covered by a completed fence: nothing in the
  // pool still needs its fence indices, so the state may serve another stream. [lock]
  bool recyclable = false;

  // Identity, set when registered (registry mutex) and constant while registered.
  PoolCore* core = nullptr;
  StreamId id = 0;
  cudaStream_t handle = nullptr;
  std::thread::id owner;      // for the per-thread default stream: the thread it belongs to
  std::atomic<CaptureBinding*> capture{nullptr};

  // Calls naming this stream may be made by the current thread (the per-thread default stream
  // is a different stream in every other thread).
  bool addressable() const noexcept {
    return handle != cudaStreamPerThread || owner == std::this_thread::get_id();
  }
};

// A device allocation of the large tier; its ranges form an address-ordered list.
struct Segment {
  std::byte* base = nullptr;
  std::size_t size = 0;
  Block* first = nullptr;
};

// A large range carved into blocks of one size class.
struct Slab {
  Block* range = nullptr;
  std::uint32_t size_class = 0;
  std::vector<Block> blocks;
};

class PoolCore {
 public:
  PoolCore(std::shared_ptr<Device> device, const PoolOptions& options);
  ~PoolCore();
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;

  // --- the public operations (pool_core.cpp) ---------------------------------------------
  Block* allocate(std::size_t bytes, cudaStream_t stream, std::error_code& error) noexcept;
  void release(Block* block) noexcept;
  // Throws Error when the stream cannot be identified.
  void record_stream(Block* block, cudaStream_t stream);
  void* allocate_raw(std::size_t bytes, cudaStream_t stream, std::error_code& error) noexcept;
  void deallocate_raw(void* ptr, cudaStream_t stream) noexcept;
  // The MemoryPool object is gone: destroy now, or when the last live block is released.
  void orphan() noexcept;

  // --- reclaim.cpp ---------------------------------------------------------------------------
  void release_stream(cudaStream_t stream);
  void trim(std::size_t bytes_to_keep);

  // --- stats.cpp -----------------------------------------------------------------------------
  PoolStats stats() const;

  Device& device() const noexcept { return *device_; }
  const PoolOptions& options() const noexcept { return options_; }
  const SizeClasses& classes() const noexcept { return classes_; }

  // Resolves a stream handle to its state, per options().stream_checks (pool_core.cpp).
  StreamState* resolve(cudaStream_t stream, std::error_code& error) noexcept;

  // --- for the capture layer (capture_support.cpp) ------------------------------------------
  // A clean range of at least `bytes` for a CapturePool's private memory, counted as a live
  // allocation of the pool (so the pool outlives it).
  Block* take_private(std::size_t bytes, std::error_code& error) noexcept;
  // Back to the arena, clean: a CapturePool's memory has no pending work when it goes (its graphs
  // are gone and their replays complete).
  void return_private(Block* range) noexcept;
  void bind_capture(CaptureId id, CaptureBinding* binding);
  void unbind_capture(CaptureId id) noexcept;

 private:
  // pool_core.cpp
  StreamState* resolve_slow(cudaStream_t stream, std::uint64_t key, std::error_code& error) noexcept;
  StreamState* register_stream(cudaStream_t stream, StreamId id);
  // The state of an explicit stream the pool has seen, by handle, without a device call.
  StreamState* known_stream(cudaStream_t stream) noexcept;
  Block* allocate_slow(StreamState& s, std::size_t bytes, cudaStream_t stream,
                       std::error_code& error) noexcept;
  void release_slow(Block* block) noexcept;
  void release_recorded(Block* block) noexcept;
  // Asks CUDA whether `stream` is capturing. True when that decides the allocation (an error, or
  // an allocation from a CapturePool): `out` then holds the result.
  bool decided_by_capture(std::size_t bytes, cudaStream_t stream, Block*& out,
                          std::error_code& error) noexcept;
  // An allocation on a stream that is being captured: from the CapturePool bound to the capture,
  // or Errc::capture_without_pool.
  Block* allocate_captured(std::size_t bytes, cudaStream_t stream, CaptureStatus status,
                           CaptureId capture, std::error_code& error) noexcept;
  void put_back(StreamState& s, Block* block) noexcept;  // [s.lock]
  // put_back, then the fence the options or another stream ask for. [s.lock]
  void put_back_fenced(StreamState& s, Block* block) noexcept;
  // Records a fence on s if fence_every_free is set or another stream asked for one. [s.lock]
  void fence_if_asked(StreamState& s) noexcept;
  void count_allocation(StreamState& s, Block* b, std::size_t bytes) noexcept;  // [s.lock]
  bool count_release(StreamState& s, Block* b) noexcept;  // [s.lock]; true: orphan count-down
  void orphan_release() noexcept;

  // fences.cpp
  // Records a fence on `s` covering every block dropped on it so far: its index is the
  // fence_seq before the call. [s.lock, s addressable] Falls back to a stream synchronize when the
  // event cannot be created or recorded (`synchronized`: every block dropped on s so far is then
  // clean). `failed` when neither worked, or when s is being captured (a fence recorded there
  // would belong to the graph): the blocks then wait for a later fence or a device synchronize.
  FenceResult record_fence(StreamState& s) noexcept;
  // Moves parked blocks whose fences all completed to the depot or the arena, clean.
  void drain_parked() noexcept;
  // Hands free blocks no pending work uses to the depot (small) or the arena (large).
  void make_clean(const std::vector<Block*>& blocks) noexcept;
  // Learns which of s's fences completed (event queries). [s.lock]
  void refresh_fences(StreamState& s) noexcept;
  // The event of the oldest recorded fence with index >= tag, or nullptr. [s.lock]
  cudaEvent_t fence_event(const StreamState& s, std::uint64_t tag) const noexcept;
  cudaEvent_t take_event() noexcept;  // nullptr on failure
  void return_event(cudaEvent_t event) noexcept;
  // Calls CUDA refuses during a restricting capture (event queries, malloc, synchronize) may be
  // made from this thread now.
  bool unsafe_calls_allowed() const noexcept;

  // small_tier.cpp
  Block* allocate_small_slow(StreamState& s, std::uint32_t size_class, std::error_code& error) noexcept;
  Block* take_from_depot(StreamState& s, std::uint32_t size_class) noexcept;
  Block* steal(StreamState& s, std::uint32_t size_class) noexcept;
  // A new slab of the class: returns its first block, puts the others in the depot.
  Block* carve_slab(std::uint32_t size_class, std::error_code& error) noexcept;

  // arena.cpp
  Block* allocate_large(StreamState& s, std::size_t bytes, std::error_code& error) noexcept;
  // A request's size in the arena (rounded to large_rounding), or 0 and out_of_memory when no
  // device could hold it.
  std::size_t arena_size(std::size_t bytes, std::error_code& error) const noexcept;
  void release_large(Block* block) noexcept;
  // Before the arena grows for s: learns which fences of streams owning free ranges completed,
  // and asks those with unfenced free ranges for a fence.
  void ask_owners_of_free_ranges(StreamState& s) noexcept;
  // A range of at least `bytes` usable on `s`. [arena_mutex_]
  Block* arena_take(StreamState* s, std::size_t bytes, std::error_code& error) noexcept;
  Block* arena_find(StreamState* s, std::size_t bytes) noexcept;  // [arena_mutex_]
  // Takes a free range out of the index and cuts it to `bytes`. [arena_mutex_]
  Block* arena_split(Block* range, std::size_t bytes) noexcept;
  // Cuts an unindexed range to `bytes`, indexing the rest as free. [arena_mutex_]
  Block* arena_cut(Block* range, std::size_t bytes) noexcept;
  Block* arena_grow(std::size_t bytes, std::error_code& error) noexcept;  // [arena_mutex_]
  void arena_free(Block* range) noexcept;  // [arena_mutex_]
  void arena_insert_free(Block* range) noexcept;  // [arena_mutex_]
  void arena_erase_free(Block* range) noexcept;   // [arena_mutex_]
  bool range_clean(Block* range) noexcept;        // normalizes a completed owner to clean
  void coalesce_clean() noexcept;  // merges adjacent free clean ranges [arena_mutex_]
  std::size_t release_free_segments(std::size_t bytes_to_keep) noexcept;  // [arena_mutex_]
  Block* new_block();  // [arena_mutex_]
  void delete_block(Block* b) noexcept;  // [arena_mutex_]

  // reclaim.cpp
  // Runs `attempt` (which returns a block or sets `error`); on out-of-memory, climbs the reclaim
  // ladder one step at a time and tries again after each.
  template <class Attempt>
  Block* with_reclaim(Attempt&& attempt, std::error_code& error) noexcept {
    error.clear();
    if (Block* b = attempt()) return b;
    if (error != Errc::out_of_memory) return nullptr;
    oom_retries_.fetch_add(1, std::memory_order_relaxed);
    for (int step = 0; step < reclaim_steps; ++step) {
      if (!reclaim(step)) continue;
      error.clear();
      if (Block* b = attempt()) return b;
      if (error != Errc::out_of_memory) return nullptr;
    }
    return nullptr;
  }
  static constexpr int reclaim_steps = 4;
  // Step 0: learn which fences completed, release parked blocks. Step 1: return wholly free
  // segments to the device. Step 2: synchronize the device, after which every cached block is
  // clean (and slabs wholly free go back to the arena). Step 3: return the segments that made
  // wholly free. False when the step could do nothing.
  bool reclaim(int step) noexcept;
  // After a device synchronize every block dropped before it is clean: marks it so, moves
  // blocks of retired streams to the depot and returns wholly free slabs to the arena.
  bool synchronize_and_reclaim() noexcept;
  void return_free_slabs() noexcept;
  void recycle_retired() noexcept;
  std::vector<StreamState*> all_states() const;

 public:
  // The text of an out-of-memory error: the request, reserved, cached and device-free bytes.
  std::string out_of_memory_message(std::size_t bytes, cudaStream_t stream);

 private:

  // stats.cpp
  void publish(StreamCounters& c) noexcept;  // [lock of c's stream]
  void count_device_allocation(std::size_t bytes) noexcept;
  void count_device_free(std::size_t bytes) noexcept;

  std::shared_ptr<Device> device_;
  PoolOptions options_;
  SizeClasses classes_;
  std::uint64_t uid_;  // unique over the program's life: keys the threads' stream caches
  // How far a stream's published byte and allocation counts may run above its true ones.
  std::int64_t byte_slack_;
  std::int64_t count_slack_;

  // Registry [registry_mutex_]. Lock order: registry_mutex_ before any stream's lock.
  mutable std::mutex registry_mutex_;
  std::unordered_map<StreamId, StreamState*> by_id_;
  std::unordered_map<cudaStream_t, StreamState*> by_handle_;  // handles of explicit streams
  std::vector<std::unique_ptr<StreamState>> states_;  // every state ever made (some retired)
  std::vector<StreamState*> recycled_;                 // retired states with nothing left

  // Depot [depot_mutex_]: clean small blocks, per class.
  std::mutex depot_mutex_;
  std::vector<BlockList> depot_;

  // Arena [arena_mutex_]. Lock order: arena_mutex_ may be taken before a stream's lock, never
  // after one.
  struct BySize {
    bool operator()(const Block* a, const Block* b) const noexcept {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  std::mutex arena_mutex_;
  std::vector<std::unique_ptr<Segment>> segments_;
  std::set<Block*, BySize> free_ranges_;
  std::vector<std::unique_ptr<Slab>> slabs_;
  std::vector<Block*> spare_blocks_;

  // Raw-pointer API: pointer -> block, sharded to keep threads apart.
  static constexpr unsigned raw_shards = 64;
  struct alignas(64) RawShard {
    SpinLock lock;
    std::unordered_map<void*, Block*> blocks;
  };
  std::unique_ptr<RawShard[]> raw_;

  // Blocks used on several streams, waiting for their fences [parked_mutex_].
  std::mutex parked_mutex_;
  std::vector<Parked> parked_;

  // Events [event_mutex_].
  std::mutex event_mutex_;
  std::vector<cudaEvent_t> idle_events_;

  // Pool-wide quantities.
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

  // Captures with a CapturePool under way, by capture id [capture_mutex_].
  std::mutex capture_mutex_;
  std::unordered_map<CaptureId, CaptureBinding*> captures_;
  // The owner of CapturePools' private ranges: counted like a stream, registered as none.
  std::unique_ptr<StreamState> private_state_;

  // Lifetime: see orphan().
  std::atomic<std::int64_t> orphan_remaining_{0};

  friend class CaptureBinding;
};

}  // namespace streampool::detail
