#include "tune.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace streampool::bench {

std::vector<PoolOptions> tune_grid(const PoolOptions& base, bool wide) {
  constexpr std::size_t KiB = 1024;
  constexpr std::size_t MiB = 1024 * KiB;
  using Sizes = std::vector<std::size_t>;
  const Sizes largest = wide ? Sizes{128 * KiB, 256 * KiB, 1 * MiB} : Sizes{256 * KiB, 1 * MiB};
  const std::vector<unsigned> per_doubling = wide ? std::vector<unsigned>{2, 4, 8}
                                                  : std::vector<unsigned>{2, 4};
  const Sizes rounding = wide ? Sizes{32 * KiB, 128 * KiB, 256 * KiB, 1 * MiB, 2 * MiB}
                              : Sizes{32 * KiB, 256 * KiB, 2 * MiB};
  const Sizes segment = wide ? Sizes{16 * MiB, 20 * MiB, 32 * MiB, 64 * MiB, 128 * MiB}
                             : Sizes{20 * MiB, 64 * MiB, 128 * MiB};
  const Sizes slab = wide ? Sizes{256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB} : Sizes{base.slab_bytes};
  // The shelf buys speed, which a replay on the fake device does not weigh: the base's own
  // setting first, so that a tie in memory keeps it.
  const std::vector<std::uint32_t> shelf =
      wide ? std::vector<std::uint32_t>{base.large_shelf, base.large_shelf != 0 ? 0u : 4u}
           : std::vector<std::uint32_t>{base.large_shelf};
  std::vector<PoolOptions> grid{base};
  const auto add = [&grid](const PoolOptions& o) {  // no configuration twice
    if (std::find(grid.begin(), grid.end(), o) == grid.end()) grid.push_back(o);
  };
  for (std::size_t l : largest) {
    for (unsigned p : per_doubling) {
      for (std::size_t r : rounding) {
        for (std::size_t g : segment) {
          for (std::size_t b : slab) {
            for (std::uint32_t k : shelf) {
              PoolOptions o = base;
              o.size_classes.largest = l;
              o.size_classes.per_doubling = p;
              o.large_rounding = r;
              o.segment_bytes = g;
              o.slab_bytes = b;
              o.large_shelf = k;
              add(o);
            }
          }
        }
      }
    }
  }
  // The virtual-memory knobs, each varied alone on top of base (crossed with the rest they would
  // multiply the grid): the fixed segments of the fallback, and, in the wide grid only, smaller
  // mappings, which let memory move between streams (docs/design.md) at a price in driver calls
  // that the fake device does not weigh (4-13x slower growth on the H200; the rows show the
  // device allocations), so that the narrow grid never recommends them. One mapping per growth
  // (0) is always among them when base sets a size.
  Sizes mapping = wide ? Sizes{2 * MiB, 8 * MiB, 32 * MiB} : Sizes{};
  if (base.mapping_bytes != 0) mapping.push_back(0);
  for (std::size_t m : mapping) {
    PoolOptions o = base;
    o.mapping_bytes = m;
    add(o);
  }
  PoolOptions fixed = base;
  fixed.expandable_segments = !base.expandable_segments;
  add(fixed);
  return grid;
}

std::vector<TuneRow> tune(const std::vector<Trace>& traces, const std::vector<PoolOptions>& grid,
                          unsigned threads, const std::function<void(double)>& progress) {
  std::vector<TuneRow> rows(grid.size());
  const std::size_t jobs = grid.size() * traces.size();
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::mutex progress_mutex;
  for (std::size_t i = 0; i < grid.size(); ++i) {
    rows[i].options = grid[i];
    rows[i].reports.resize(traces.size());
  }
  std::atomic<bool> abandon{false};
  std::atomic<bool> go{false};  // no replay starts before every thread exists
  const auto worker = [&] {
    go.wait(false, std::memory_order_acquire);
    for (std::size_t job; !abandon && (job = next.fetch_add(1)) < jobs;) {
      const std::size_t row = job / traces.size();
      const std::size_t t = job % traces.size();
      ReplayOptions options;
      options.pool = grid[row];
      rows[row].reports[t] = replay(traces[t], fake_target(), options);
      const std::size_t finished = done.fetch_add(1) + 1;
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        progress(double(finished) / double(jobs));
      }
    }
  };
  std::string failure;
  const auto guarded = [&] {
    try {
      worker();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(progress_mutex);
      if (failure.empty()) failure = e.what();
      abandon = true;
    }
  };
  const std::size_t wanted = std::max<std::size_t>(1, std::min<std::size_t>(threads, jobs));
  std::vector<std::thread> pool;
  try {
    pool.reserve(wanted - 1);
    for (std::size_t i = 1; i < wanted; ++i) pool.emplace_back(guarded);
  } catch (const std::exception& e) {
    abandon = true;
    std::lock_guard<std::mutex> lock(progress_mutex);
    failure = fmt::format("cannot create thread {} of {} (--threads): {}", pool.size() + 2, wanted,
                          e.what());
  }
  go.store(true, std::memory_order_release);
  go.notify_all();
  if (!abandon) guarded();
  for (auto& t : pool) t.join();
  if (!failure.empty()) throw std::runtime_error(failure);

  if (!rows.empty()) rows.front().baseline = true;
  for (TuneRow& row : rows) {
    double ratios = 0;
    for (const ReplayReport& r : row.reports) {
      ratios += r.ratio();
      row.device_allocations += r.device_allocations;
      row.fences += r.fences;
      row.failed_allocations += r.failed_allocations;
    }
    row.mean_ratio = row.reports.empty() ? 0 : ratios / double(row.reports.size());
  }
  std::stable_sort(rows.begin(), rows.end(), ranks_before);
  return rows;
}

bool ranks_before(const TuneRow& a, const TuneRow& b) {
  if (a.failed_allocations != b.failed_allocations) return a.failed_allocations < b.failed_allocations;
  if (a.mean_ratio != b.mean_ratio) return a.mean_ratio < b.mean_ratio;
  if (a.device_allocations != b.device_allocations) return a.device_allocations < b.device_allocations;
  return a.fences < b.fences;
}

}  // namespace streampool::bench
