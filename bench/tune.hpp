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
};

// The configurations tune searches: size classes (smallest block, classes per doubling, largest
// cached size), slab, segment and large rounding, around `base`. The wide grid has a few hundred.
std::vector<PoolOptions> tune_grid(const PoolOptions& base = {}, bool wide = false);

// Replays every trace under every configuration, `threads` replays at a time, and returns the
// rows best first: fewest failed allocations, then lowest mean ratio, then fewest device
// allocations, then fewest fences.
std::vector<TuneRow> tune(const std::vector<Trace>& traces, const std::vector<PoolOptions>& grid,
                          unsigned threads, const std::function<void(double)>& progress = {});

}  // namespace streampool::bench
