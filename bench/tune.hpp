// Tuning: replays traces under many configurations on the fake device (memory figures do not
// depend on the GPU) and ranks them.
#pragma once

#include "replay.hpp"

#include <string>
#include <vector>

namespace streampool::bench {

struct TuneRow {
  PoolOptions options;
  std::vector<ReplayReport> reports;  // one per trace, in the order given
  double mean_ratio = 0;              // mean over traces of peak reserved / peak requested
  std::uint64_t device_allocations = 0;  // summed over traces
  std::uint64_t fences = 0;              // summed over traces
  std::uint64_t failed_allocations = 0;
  bool baseline = false;  // the configuration tune started from (the grid's first)
};

// The ranking: fewer failed allocations, then a lower mean ratio, then fewer device allocations,
// then fewer fences. True when `a` ranks strictly before `b`.
bool ranks_before(const TuneRow& a, const TuneRow& b);

// The configurations tune searches: `base` itself first (the baseline), then size classes
// (classes per doubling, largest cached size), large rounding and segment size (and, in the wide
// grid, slab size and the shelf) varied on top of `base`, every other key kept, then expandable
// segments and (wide grid) the mapping size each varied alone, one mapping per growth among them
// when base sets a size; no configuration twice. The narrow grid has a few dozen, the wide one
// about two thousand.
std::vector<PoolOptions> tune_grid(const PoolOptions& base = {}, bool wide = false);

// Replays every trace under every configuration, `threads` replays at a time (no more threads
// than replays), and returns the rows best first by ranks_before; rows that rank alike keep the
// grid's order, so the baseline (grid[0]) comes before any configuration that is only as good.
// Throws std::runtime_error when a thread cannot be created, after the running ones stopped.
std::vector<TuneRow> tune(const std::vector<Trace>& traces, const std::vector<PoolOptions>& grid,
                          unsigned threads, const std::function<void(double)>& progress = {});

}  // namespace streampool::bench
