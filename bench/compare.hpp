// `compare`: streampool against every peer, measured in one run on one GPU.
#pragma once

#include "peers.hpp"
#include "replay.hpp"

#include <string>
#include <vector>

namespace streampool::bench {

struct Table {
  std::string title;
  std::string note;  // how it was measured
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  // The leading columns that name a row (trace, allocator); the others hold figures, which
  // `--json` writes as numbers (and "n/a" as null).
  std::size_t label_columns = 1;

  std::string markdown() const;
  std::string csv() const;
};

struct CompareOptions {
  std::vector<std::size_t> sizes{256, 4096, 65536, 1 << 20, 16 << 20, 256 << 20};
  std::vector<int> threads{1, 2, 4, 8, 16};
  std::size_t thread_bytes = 65536;
  int repeats = 5;  // medians of this many runs
  double seconds_per_point = 0.05;
};

// Latency of an allocate+free pair by size, one stream.
Table latency_table(std::vector<std::unique_ptr<Peer>>& peers, const CompareOptions& options);
// Million pairs per second in total, N threads each on its own stream.
Table scaling_table(std::vector<std::unique_ptr<Peer>>& peers, const CompareOptions& options);
// Free on stream A, allocate the same size on stream B: ns per hand-off, and how often B got
// A's memory back.
Table handoff_table(std::vector<std::unique_ptr<Peer>>& peers, const CompareOptions& options);
// Each trace replayed through each peer: time per event, failed allocations and peak reserved
// memory.
Table trace_table(std::vector<std::unique_ptr<Peer>>& peers, const std::vector<Trace>& traces);

// Without a GPU: what does not depend on one. Streampool's peak reserved / peak requested on the
// fake device for each trace, beside PyTorch's recorded figures where a torch_summary.json gives
// them (`torch_summary_path` empty: none). Throws std::runtime_error when the file cannot be read
// or is not JSON of the documented shape (docs/bench.md).
Table memory_table(const std::vector<Trace>& traces, const PoolOptions& options,
                   const std::string& torch_summary_path);

}  // namespace streampool::bench
