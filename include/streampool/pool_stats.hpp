// PoolStats: a plain value describing a MemoryPool at one moment. Its fmt::formatter is in
// <streampool/format.hpp> (kept apart: fmt 9's headers do not compile under nvcc 13).
#pragma once

#include <streampool/export.hpp>

#include <cstdint>
#include <string>

namespace streampool {

// A quantity's value now, its highest value so far, and the sum of all increases so far.
struct StatCounter {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t total = 0;
};

struct PoolStats {
  StatCounter requested_bytes;   // bytes asked for by allocations (peak: see stats_granule)
  StatCounter reserved_bytes;    // device memory the pool holds
  StatCounter live_allocations;  // allocations not yet dropped
  std::uint64_t cache_hits = 0;          // allocations served from the stream's own cache
  std::uint64_t cache_misses = 0;        // allocations that took a slow path
  // Device allocations made and given back: cudaMalloc and cudaFree of fixed segments; with
  // expandable segments, physical allocations mapped (cuMemCreate) and unmapped and released.
  std::uint64_t device_allocations = 0;
  std::uint64_t device_frees = 0;
  std::uint64_t fences_recorded = 0;     // fences (events) recorded
  // Small blocks a stream took from another stream's free list (covered by a fence, or waited
  // for under cross_stream_wait). Not counted: large ranges, and blocks that reach another stream
  // through the parked list or the clean depot.
  std::uint64_t cross_stream_reuses = 0;
  std::uint64_t blocking_fallbacks = 0;  // stream synchronizes where a fence (or the event a
                                         // growth waits on) could not be made
  std::uint64_t oom_retries = 0;         // allocations retried after reclaiming
  // Waits for a stream before a growth on virtual memory, so that memory the stream freed could
  // be mapped again where its request needs it (docs/design.md, "Waiting for one's own").
  std::uint64_t growth_waits = 0;
};

// Waits for the pools' locks, counted for the whole process since it started, by every pool
// (lock_contention()): a diagnostic for tuning many threads on many streams, as the bench's
// stress reports it. Only waits are counted and timed: an acquisition that found the lock free
// costs nothing more.
struct LockWaits {
  std::uint64_t waits = 0;  // acquisitions that found the lock held
  std::uint64_t ns = 0;     // the time they waited, in all
};
struct LockContention {
  LockWaits stream;      // a stream's lock held by another thread
  LockWaits revocation;  // a stream's lock taken from the thread it was biased to (a barrier on
                         // every CPU running the process, then waiting for that thread to leave)
  LockWaits arena;       // the large tier's lock (ranges of 256 KiB and up, by default)
  LockWaits growth;      // the large tier's growth lock (one device allocation at a time)
  LockWaits events;      // the idle fence events
};
STREAMPOOL_API LockContention lock_contention() noexcept;

// Where the reserved memory is at one moment (MemoryPool::breakdown()): a walk under the pool's
// locks, for diagnostics, not for a hot loop. Taken while other threads allocate and drop, its
// parts are each exact at their own moment but need not add up to one moment's whole.
//
// Every reserved byte is in a segment (a device allocation), counted in segment_bytes; so is
// physical memory that the device refused to release once unmapped, which a later trim tries
// again. A segment is cut into ranges: slabs of the small tier, free ranges, and ranges in use
// (live large buffers, large blocks parked or stranded, ranges a CapturePool holds, and memory the
// device refused to unmap after refusing access to it, kept until the pool's destruction).
struct PoolBreakdown {
  std::int64_t segments = 0;
  std::int64_t segment_bytes = 0;
  std::int64_t slab_bytes = 0;             // small-tier slabs, whatever their blocks do
  std::int64_t small_cached_bytes = 0;     // free small blocks on their streams' lists
  std::int64_t small_depot_bytes = 0;      // free small blocks no stream owns
  std::int64_t free_ranges = 0;            // free ranges of the large tier
  std::int64_t free_clean_bytes = 0;       // usable by any stream now
  std::int64_t free_owned_bytes = 0;       // usable by their stream now, by others after a fence
  std::int64_t largest_free_range = 0;
  std::int64_t shelved_ranges = 0;         // large ranges on their streams' shelves, kept for
  std::int64_t shelved_bytes = 0;          // their requests (PoolOptions::large_shelf)
  std::int64_t parked_blocks = 0;          // dropped, waiting for fences of several streams
  std::int64_t parked_bytes = 0;           // (or for a device synchronize), small and large
  std::int64_t stranded_blocks = 0;        // dropped when host memory ran out, their uses not
  std::int64_t stranded_bytes = 0;         // listed: back at the next device synchronize
};

// One line naming every field; also what fmt prints (<streampool/format.hpp>).
STREAMPOOL_API std::string to_string(const PoolStats& stats);
STREAMPOOL_API std::string to_string(const PoolBreakdown& breakdown);

}  // namespace streampool

