// Replay and tune on the fake device: the invariants every report keeps, the ranking order, and
// the STREAMPOOL_CONF line tune recommends being accepted by the pool.
#include "replay.hpp"
#include "tune.hpp"
#include "workloads.hpp"

#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>

using namespace streampool::bench;

TEST_CASE("a replay frees every allocation and reports the trace's own peak") {
  // Through PooledBuffer and record_stream, and through the raw API (--raw).
  const bool raw = GENERATE(false, true);
  for (const std::string& name : workload_names()) {
    CAPTURE(name, raw);
    const Trace trace = make_workload(name, 3);
    const Target target = fake_target();
    ReplayOptions options;
    options.timeline_points = 50;
    options.raw = raw;
    const ReplayReport report = replay(trace, target, options);
    REQUIRE(report.failed_allocations == 0);
    REQUIRE(report.peak_requested == trace.peak_requested());
    // One thread: the replay runs the trace's order, so it reaches the trace's peak exactly.
    REQUIRE(report.replayed_peak_requested == report.peak_requested);
    REQUIRE(report.peak_reserved >= report.peak_requested);
    REQUIRE(report.events == trace.events.size());
    REQUIRE(report.cache_hits + report.cache_misses >= trace.allocations);
    REQUIRE_FALSE(report.timeline.empty());
    // Every allocation was freed: the pool, gone, left nothing on the device.
    auto* fake = dynamic_cast<streampool::FakeDevice*>(target.device.get());
    REQUIRE(fake != nullptr);
    REQUIRE(fake->live_bytes() == 0);
    REQUIRE(fake->hazards().empty());
  }
}

TEST_CASE("tune ranks configurations by failures, then mean ratio, then device allocations") {
  const std::vector<Trace> traces{make_workload("transformer", 1), make_workload("pipeline", 1)};
  auto grid = tune_grid();
  REQUIRE(grid.size() >= 12);
  const auto rows = tune(traces, grid, 2);
  REQUIRE(rows.size() == grid.size());
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const TuneRow& a = rows[i - 1];
    const TuneRow& b = rows[i];
    REQUIRE(a.failed_allocations <= b.failed_allocations);
    if (a.failed_allocations == b.failed_allocations) {
      REQUIRE(a.mean_ratio <= b.mean_ratio);
      if (a.mean_ratio == b.mean_ratio) REQUIRE(a.device_allocations <= b.device_allocations);
    }
  }
  for (const TuneRow& row : rows) {
    REQUIRE(row.reports.size() == traces.size());
    double sum = 0;
    for (const ReplayReport& r : row.reports) sum += r.ratio();
    REQUIRE(row.mean_ratio == Approx(sum / double(traces.size())));
  }
}

TEST_CASE("the configuration tune recommends is accepted by the pool through STREAMPOOL_CONF") {
  const auto rows = tune({make_workload("random", 1)}, tune_grid(), 2);
  const std::string line = rows.front().options.to_conf();
  REQUIRE(setenv("STREAMPOOL_CONF", line.c_str(), 1) == 0);
  streampool::MemoryPool pool(std::make_shared<streampool::FakeDevice>());
  unsetenv("STREAMPOOL_CONF");
  REQUIRE(pool.options() == rows.front().options);
}

TEST_CASE("the wide grid searches the shelf, the base's setting first; the narrow one keeps it") {
  streampool::PoolOptions base;
  base.large_shelf = 7;
  const auto wide = tune_grid(base, true);
  REQUIRE(wide.size() >= 3);
  CHECK(wide[0] == base);  // the baseline, then pairs: the base's shelf, then none
  CHECK(wide[1].large_shelf == 7);
  CHECK(wide[2].large_shelf == 0);
  // The base itself is one of the pairs' first halves, and is not searched twice.
  CHECK(std::count(wide.begin(), wide.end(), base) == 1);
  // The virtual-memory knobs are varied alone, after the crossed part.
  const auto crossed = std::count_if(wide.begin(), wide.end(), [&](const auto& o) {
    return o.mapping_bytes == base.mapping_bytes && o.expandable_segments == base.expandable_segments;
  });
  CHECK(std::count_if(wide.begin(), wide.end(), [](const auto& o) { return o.large_shelf == 0; }) ==
        crossed / 2);
  for (const auto& o : tune_grid(base, false)) CHECK(o.large_shelf == 7);
}

TEST_CASE("both grids vary expandable segments, the wide one the mapping size too, each alone on "
          "top of the base") {
  streampool::PoolOptions base;
  base.large_shelf = 3;
  for (const bool wide : {false, true}) {
    CAPTURE(wide);
    const auto grid = tune_grid(base, wide);
    std::vector<std::size_t> mappings;
    int fixed = 0;
    for (const auto& o : grid) {
      if (o.mapping_bytes != base.mapping_bytes) {
        mappings.push_back(o.mapping_bytes);
        streampool::PoolOptions alone = base;
        alone.mapping_bytes = o.mapping_bytes;
        CHECK(o == alone);
      }
      if (o.expandable_segments != base.expandable_segments) {
        ++fixed;
        streampool::PoolOptions alone = base;
        alone.expandable_segments = o.expandable_segments;
        CHECK(o == alone);
      }
    }
    CHECK(fixed == 1);
    CHECK(mappings.size() == (wide ? 3u : 0u));  // the narrow grid never makes growth slower
    if (wide) CHECK(std::count(mappings.begin(), mappings.end(), std::size_t{8} << 20) == 1);
  }
  base.mapping_bytes = std::size_t{8} << 20;  // a user's own size: one per growth is tried too
  for (const bool wide : {false, true}) {
    const auto grid = tune_grid(base, wide);
    CHECK(std::count_if(grid.begin(), grid.end(),
                        [](const auto& o) { return o.mapping_bytes == 0; }) == 1);
  }
}
