// PoolStats: a plain value describing a MemoryPool at one moment. Its fmt::formatter is in
// <streampool/format.hpp> (kept apart: fmt 9's headers do not compile under nvcc 13).
#pragma once

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
  std::uint64_t device_allocations = 0;  // successful device mallocs
  std::uint64_t device_frees = 0;
  std::uint64_t fences_recorded = 0;     // fences (events) recorded
  std::uint64_t cross_stream_reuses = 0; // blocks handed to another stream than their last
  std::uint64_t blocking_fallbacks = 0;  // stream synchronizes where a fence failed
  std::uint64_t oom_retries = 0;         // allocations retried after reclaiming
};

// One line naming every field; also what fmt prints (<streampool/format.hpp>).
std::string to_string(const PoolStats& stats);

}  // namespace streampool

