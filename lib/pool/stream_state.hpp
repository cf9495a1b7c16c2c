// StreamState: one CUDA stream as the pool sees it.
#pragma once

#include "block.hpp"
#include "biased_lock.hpp"

#include <streampool/device.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>

namespace streampool::detail {

class PoolCore;

// A number naming the calling thread, never given to another thread of the process: unlike
// std::thread::id, which the C library hands an exited thread's to the next thread it starts
// (glibc does at once), so that a later thread would pass for an exited one's and record fences
// on its own per-thread default stream for the exited thread's. Not 0.
extern constinit thread_local std::uint64_t thread_token;
std::uint64_t assign_thread_token() noexcept;
inline std::uint64_t this_thread_token() noexcept {
  const std::uint64_t token = thread_token;
  return token != 0 ? token : assign_thread_token();
}

// A fence recorded on a stream: an event, or a virtual fence (no event) that the device
// synchronize of index `device_index` on the pool's device timeline completes.
struct Fence {
  std::uint64_t index;
  cudaEvent_t event;
  std::uint64_t device_index;
};

// Counters of one stream, guarded by its lock; stats() sums them over the streams.
struct StreamCounters {
  std::int64_t recorded_uses = 0;  // record_stream calls naming this stream
  // Blocks the slow drop kept on this stream (PoolCore::keep_on): other streams' blocks freed
  // here among them, which its own counters below do not see.
  std::int64_t kept_drops = 0;
  // Allocations, drops (of its own blocks, and of others' onto it) and record_stream uses so
  // far: it moves whenever the stream is used.
  std::int64_t activity() const noexcept {
    return 2 * live_total - live + recorded_uses + kept_drops;
  }

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
  std::uint64_t growth_waits = 0;
};

// Bits of StreamState::attention: any set bit sends allocations and drops on the stream off the
// fast path.
enum Attention : std::uint32_t {
  wants_fence = 1u << 0,  // another stream waits for blocks dropped here: record a fence
  retired = 1u << 1,      // released or dead: no longer found by lookups, gets no new blocks
  gated = 1u << 2,        // the gate (gate.hpp) takes this stream's allocations and drops
  joinable = 1u << 3,     // the gate is busy (PoolCore::gate_busy_begins): any stream may
                          // have joined its work, so drops ask it (on every state meanwhile)
};

// One CUDA stream. States live as long as their pool; a retired state is recycled for a new
// stream (a new generation) once nothing refers to it.
//
// Invariants, under `lock`:
//   - every block on free[c] has size class c, is free, and has need.timeline == &timeline
//     (need.index <= timeline.recorded) or no timeline;
//   - free_blocks is the number of blocks on the lists;
//   - every range on the shelf is a large range dropped here, not free in the arena's eyes (on
//     no index, flag false: the arena treats it as in use), requested == 0, with
//     need.timeline == &timeline (need.index <= timeline.recorded) or no timeline; shelved is
//     the shelf's count, at most PoolOptions::large_shelf;
//   - fences are in index order, each index < timeline.recorded, all >= timeline.completed;
//   - a retired state has empty lists and shelf and gets no new blocks; it is recycled only when
//     timeline.completed > last_index, live == 0, pins == 0 and recorded_by == 0.
struct alignas(64) StreamState {
  BiasedLock lock;  // biased to the thread that uses the stream (biased_lock.hpp)
  std::atomic<std::uint32_t> attention{0};
  // Bumped (under the lock) when the state is retired and when it is recycled: a thread's cached
  // lookup, a live block's home and a record_stream entry are valid only at their generation.
  std::atomic<std::uint32_t> generation{0};
  FreeLists free;                              // per size class [lock]
  std::atomic<std::size_t> free_blocks{0};     // written under the lock, read anywhere as a hint
  // Large ranges dropped here, newest first: a same-stream request takes one back without the
  // arena (PoolCore::take_shelved). [lock]
  BlockList shelf;
  std::atomic<std::uint32_t> shelved{0};       // shelf.count: written under the lock, a hint
  Timeline timeline;                           // written under the lock, read anywhere
  std::deque<Fence> fences;                    // recorded, not yet known complete [lock]
  StreamCounters counters;                     // [lock]
  // Bytes dropped here since the last fence (an over-estimate: a large range reused here before
  // the fence is still counted), when the first of them was dropped, and the bound past which a
  // drop records a fence (see FencePolicy). [lock]
  std::size_t unfenced_bytes = 0;
  std::int64_t unfenced_since_ns = 0;
  std::size_t unfenced_limit = std::numeric_limits<std::size_t>::max();
  std::uint32_t drops = 0;
  int pins = 0;                 // allocations on their slow path that will count here [lock]
  int recorded_by = 0;          // live blocks whose record_stream named this stream [lock]
  std::int64_t seen_activity = -1;  // allocations and drops when retire_idle last looked [lock]
  bool orphaned = false;        // the MemoryPool object is gone; drops count down [lock]
  std::uint64_t last_index = 0; // retired: the index of its last fence [lock]

  PoolCore* core = nullptr;  // the pool the state belongs to; constant

  // Identity: set when registered (registry mutex), constant until retired.
  StreamId id = 0;
  cudaStream_t handle = nullptr;
  std::uint64_t owner = 0;  // for the per-thread default stream: its thread's this_thread_token()
  // Every state of the pool, newest first, for iteration without a lock (never unlinked).
  StreamState* next_state = nullptr;

  // Calls naming this stream may be made from the current thread (the per-thread default stream
  // is another stream in every other thread).
  bool addressable() const noexcept {
    return handle != cudaStreamPerThread || owner == this_thread_token();
  }
  // This state still names the stream it named at `seen`, and takes new blocks.
  bool current(std::uint32_t seen) const noexcept {
    return generation.load(std::memory_order_relaxed) == seen &&
           (attention.load(std::memory_order_relaxed) & retired) == 0;
  }
  // The need a block dropped here now gets. [lock]
  Need need_now() const noexcept {
    return {&timeline, timeline.recorded.load(std::memory_order_relaxed)};
  }
  void set_free_blocks(std::size_t n) noexcept { free_blocks.store(n, std::memory_order_relaxed); }
};

}  // namespace streampool::detail
