// The stress command's checks, on numbers given to them directly: each fails a result for the
// reason it names, and only for it. No run can make today's pool fail every one on demand, so
// this is where the failing side of each check is tested.
#include "stress.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace streampool::bench;
using Catch::Matchers::Contains;

namespace {

constexpr std::int64_t MiB = std::int64_t{1} << 20;

// What a healthy run of 12 threads looks like: nothing wrong with it.
StressResult healthy() {
  StressResult r;
  r.label = "default";
  r.threads = 12;
  r.streams_alive = 24;
  r.stats_granule = std::size_t{1} << 20;
  r.seconds = 60;
  r.buffers = 1'000'000;
  r.window_seconds = 12;
  r.first_window_peak = 800 * MiB;
  r.last_window_peak = 840 * MiB;
  r.true_live_peak = 12;
  r.true_requested_peak = 100 * MiB;
  r.stats.live_allocations.peak = 12;
  r.stats.requested_bytes.peak = 100 * MiB;
  return r;
}

}  // namespace

TEST_CASE("stress checks: a healthy result passes, and growth is checked only when asked for",
          "[stress][checks]") {
  CHECK(stress_failures(healthy(), 0).empty());
  CHECK(stress_failures(healthy(), 1.5).empty());
  StressResult r = healthy();
  r.last_window_peak = 10 * r.first_window_peak;
  CHECK(stress_failures(r, 0).empty());
}

TEST_CASE("stress checks: each failure is reported with the configuration's label",
          "[stress][checks]") {
  StressResult r = healthy();
  SECTION("a corrupted word") {
    r.corrupted_words = 3;
    const auto failures = stress_failures(r, 0);
    REQUIRE(failures.size() == 1);
    CHECK_THAT(failures[0], Contains("[default]") && Contains("3 corrupted words"));
  }
  SECTION("a hazard of the fake device, quoting the first") {
    r.hazard_count = 2;
    r.hazards = {"race: write on stream 4 races with a read on stream 5", "race: another"};
    const auto failures = stress_failures(r, 0);
    REQUIRE(failures.size() == 1);
    CHECK_THAT(failures[0], Contains("2 hazards") && Contains("write on stream 4"));
  }
  SECTION("a failed allocation, and the error that ended the run") {
    r.failed_allocations = 1;
    r.error_count = 1;
    r.errors = {"thread 3: allocation of 4096 bytes failed: out of memory"};
    const auto failures = stress_failures(r, 0);
    REQUIRE(failures.size() == 2);
    CHECK_THAT(failures[0], Contains("1 failed allocations"));
    CHECK_THAT(failures[1], Contains("thread 3: allocation of 4096 bytes failed"));
  }
  SECTION("a failed device call") {
    r.error_count = 1;
    r.errors = {"thread 0: launch of spin_then_write_tag: cudaErrorMemoryAllocation"};
    const auto failures = stress_failures(r, 0);
    REQUIRE(failures.size() == 1);
    CHECK_THAT(failures[0], Contains("cudaErrorMemoryAllocation"));
  }
}

TEST_CASE("stress checks: growth is the last window's peak over the first's", "[stress][checks]") {
  StressResult r = healthy();
  SECTION("growth above --max-growth fails, naming both peaks") {
    r.last_window_peak = 2 * r.first_window_peak;
    const auto failures = stress_failures(r, 1.5);
    REQUIRE(failures.size() == 1);
    CHECK_THAT(failures[0], Contains("grew 2.00x") && Contains("1.56 GiB") &&
                                Contains("800.0 MiB") && Contains("--max-growth 1.5"));
  }
  SECTION("growth at the limit passes") {
    r.last_window_peak = r.first_window_peak * 3 / 2;
    CHECK(stress_failures(r, 1.5).empty());
  }
  SECTION("a pool that ran the device out of memory fails, whatever the windows say") {
    // Filling the device in the first window caps both peaks at its capacity: ratio about 1.
    r.first_window_peak = r.last_window_peak = 139 * 1024 * MiB;
    r.stats.oom_retries = 5;
    const auto failures = stress_failures(r, 1.5);
    REQUIRE(failures.size() == 1);
    CHECK_THAT(failures[0], Contains("ran out of device memory") && Contains("5 out-of-memory"));
    CHECK(stress_failures(r, 0).empty());  // without --max-growth, memory is not checked
  }
  SECTION("the ratio's edges") {
    CHECK(growth_ratio(100, 150) == 1.5);
    CHECK(growth_ratio(0, 0) == 0);
    CHECK(std::isinf(growth_ratio(0, 1)));
  }
  SECTION("the windows: a fifth of a short run, a minute of a run of five minutes or more") {
    CHECK(window_seconds(20) == 4);
    CHECK(window_seconds(299) == Approx(59.8));
    CHECK(window_seconds(300) == 60);
    CHECK(window_seconds(3600) == 60);
  }
}

TEST_CASE("stress checks: stats peaks may exceed the truth by the slack of the streams alive",
          "[stress][checks]") {
  SECTION("the slack: per stream two granules of bytes, 2 x max(1, granule >> 14) allocations") {
    const StatsSlack slack = stats_slack(std::size_t{1} << 20, 24);
    CHECK(slack.bytes == 24 * 2 * MiB);
    CHECK(slack.allocations == 24 * 2 * 64);
    CHECK(stats_slack(1024, 2).allocations == 4);  // at least one allocation per granule
    CHECK(stats_slack(0, 24).bytes == 0);          // granule 0: exact
    CHECK(stats_slack(0, 24).allocations == 0);
  }
  StressResult r = healthy();
  const StatsSlack slack = stats_slack(r.stats_granule, r.streams_alive);
  SECTION("peaks at the truth plus the slack pass") {
    r.stats.live_allocations.peak = r.true_live_peak + slack.allocations;
    r.stats.requested_bytes.peak = r.true_requested_peak + slack.bytes;
    CHECK(stress_failures(r, 0).empty());
  }
  SECTION("what the H200 showed under churn fails: 39,339 live with 12 ever live") {
    r.stats.live_allocations.peak = 39'339;
    const auto failures = stress_failures(r, 0);
    REQUIRE(failures.size() == 1);
    CHECK_THAT(failures[0], Contains("live_allocations.peak 39339") &&
                                Contains("true peak 12 plus the slack 3072") &&
                                Contains("24 streams alive"));
  }
  SECTION("and 16 GB requested with about 100 MB ever live") {
    r.stats.requested_bytes.peak = 16'000'000'000;
    const auto failures = stress_failures(r, 0);
    REQUIRE(failures.size() == 1);
    CHECK_THAT(failures[0], Contains("requested_bytes.peak 16000000000"));
  }
  SECTION("one allocation or one byte over the slack fails") {
    r.stats.live_allocations.peak = r.true_live_peak + slack.allocations + 1;
    r.stats.requested_bytes.peak = r.true_requested_peak + slack.bytes + 1;
    CHECK(stress_failures(r, 0).size() == 2);
  }
  SECTION("with stats_granule 0 the peaks must be exact") {
    r.stats_granule = 0;
    r.stats.live_allocations.peak = r.true_live_peak + 1;
    CHECK(stress_failures(r, 0).size() == 1);
  }
}

TEST_CASE("stress latency: mean and 99th percentile of the samples", "[stress][checks]") {
  std::vector<std::uint32_t> ns;
  for (std::uint32_t i = 1; i <= 100; ++i) ns.push_back(i);
  const Latency l = summarize_latency(ns);
  CHECK(l.samples == 100);
  CHECK(l.mean_ns == Approx(50.5));
  CHECK(l.p99_ns == 99);
  CHECK(summarize_latency({}).samples == 0);
}
