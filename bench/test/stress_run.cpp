// The stress command on the fake device: a short run passes its checks and reports figures that
// hang together, and the fake kernels do count a tag that is not there.
#include "stress.hpp"
#include "stress_target.hpp"
#include "temp_dir.hpp"

#include <streampool/device.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

using namespace streampool::bench;
using Catch::Matchers::Contains;
using streampool::bench::testing::TempDir;

namespace {
// A run of one configuration on the fake device, one progress line a second.
StressOptions fake_run(double seconds, unsigned threads) {
  StressOptions options;
  options.fake = true;
  options.seconds = seconds;
  options.threads = threads;
  options.interval = 1;
  return options;
}
}  // namespace

TEST_CASE("a short stress run on the fake device passes its checks with sane figures",
          "[stress][run]") {
  StressOptions options;
  options.fake = true;
  options.seconds = 1.5;
  options.threads = 2;
  options.interval = 0.5;
  options.configs = {"", "fence_every_free=true"};
  std::ostringstream log;
  const std::vector<StressResult> results = run_stress(options, log);
  INFO(log.str());
  REQUIRE(results.size() == 2);
  CHECK_THAT(log.str(), Contains("[default]") && Contains("[fence_every_free=true]") &&
                            Contains("buffers/s"));

  for (const StressResult& r : results) {
    CAPTURE(r.label);
    const auto failures = stress_failures(r, 0);
    INFO((failures.empty() ? std::string() : failures.front()));
    CHECK(failures.empty());
    CHECK(r.target == "fake device");
    CHECK(r.threads == 2);
    CHECK(r.streams_alive == 4);
    CHECK(r.seconds >= 1.5);
    CHECK(r.buffers > 100);
    CHECK(r.corrupted_words == 0);
    CHECK(r.hazard_count == 0);
    CHECK(r.error_count == 0);
    // Each thread holds one buffer at a time, of at most 8 MiB.
    CHECK(r.true_live_peak >= 1);
    CHECK(r.true_live_peak <= 2);
    CHECK(r.true_requested_peak <= 2 * (std::int64_t{8} << 20));
    // Everything was dropped; the pool held at least what was live.
    CHECK(r.stats.live_allocations.current == 0);
    CHECK(r.stats.live_allocations.total == static_cast<std::int64_t>(r.buffers));
    CHECK(r.stats.reserved_bytes.peak >= r.true_requested_peak);
    CHECK(r.stats.device_allocations > 0);
    // The windows lie within the run: neither peak above the run's.
    CHECK(r.window_seconds == Approx(0.3));
    CHECK(r.first_window_peak > 0);
    CHECK(r.first_window_peak <= r.stats.reserved_bytes.peak);
    CHECK(r.last_window_peak <= r.stats.reserved_bytes.peak);
    CHECK(r.allocate.samples > 0);
    CHECK(r.drop.samples > 0);
    CHECK(r.allocate.mean_ns > 0);
    // Progress every half second, and one at the end.
    CHECK(r.samples.size() >= 3);
    CHECK(r.samples.back().seconds == Approx(r.seconds).margin(0.01));
    CHECK(stress_table(r).rows.size() > 10);
  }
  // A third of the buffers are also used on the second stream: fence_every_free fences every
  // drop on each stream it was used on, so more than one fence per buffer.
  CHECK(results[1].fences_per_buffer() > 1.0);
  CHECK(results[1].fences_per_buffer() > results[0].fences_per_buffer());

  const Table csv = stress_samples_table(results);
  CHECK(csv.header.front() == "config");
  CHECK(csv.rows.size() == results[0].samples.size() + results[1].samples.size());
  const std::string svg = stress_plot(results);
  CHECK_THAT(svg, Contains("<svg") && Contains("fence_every_free=true") && Contains("default"));
}

TEST_CASE("with churn, the fake run renews streams and still sees no race or corruption",
          "[stress][run]") {
  StressOptions options = fake_run(1, 2);
  options.churn = 16;
  std::ostringstream log;
  const std::vector<StressResult> results = run_stress(options, log);
  REQUIRE(results.size() == 1);
  const StressResult& r = results.front();
  INFO(log.str());
  CHECK(r.buffers > 32);
  CHECK(r.corrupted_words == 0);
  CHECK(r.hazard_count == 0);
  CHECK(r.error_count == 0);
}

TEST_CASE("the fake kernels count the words that do not hold the tag", "[stress][run]") {
  const std::unique_ptr<StressTarget> target = make_fake_stress_target({}, 1);
  std::shared_ptr<streampool::Device> device = target->device();
  // A whole size class (4 KiB): the fake kernels name the block a pool would give for the words.
  constexpr std::size_t words = 1024;
  void* memory = nullptr;
  REQUIRE(device->malloc(&memory, words * sizeof(unsigned)) == cudaSuccess);
  auto* data = static_cast<unsigned*>(memory);
  {
    const std::unique_ptr<StressLane> lane = target->make_lane();
    SECTION("the tag written is the tag checked: no mismatch, on either stream") {
      lane->write_tag(data, words, 42, 0);
      lane->check_tag(data, words, 42, false);
      lane->check_tag(data, words, 42, true);
      CHECK(lane->finish() == 0);
    }
    SECTION("another tag: the first, middle and last words differ, on either stream") {
      lane->write_tag(data, words, 42, 0);
      lane->check_tag(data, words, 43, false);
      lane->check_tag(data, words, 43, true);
      CHECK(lane->finish() == 6);
    }
    SECTION("the work of a first stream destroyed by renew_first still completes") {
      const cudaStream_t old = lane->first();
      lane->write_tag(data, words, 7, 0);
      lane->check_tag(data, words, 8, false);
      lane->renew_first();
      CHECK(lane->first() == old);  // the handle goes to the next stream, as on CUDA
      CHECK(lane->finish() == 3);
    }
    target->stop();
  }
  const std::vector<std::string> hazards = target->hazards();
  INFO((hazards.empty() ? std::string() : hazards.front()));
  CHECK(hazards.empty());
  CHECK(device->free(memory) == cudaSuccess);
}

TEST_CASE("the fake kernels name the whole block, so a hand-over without a fence is a race",
          "[stress][run]") {
  // What a pool handing a block to another stream too early would look like: a second lane
  // writes the block while the first lane's check of it is pending. The fake kernels touch three
  // words, but name every byte: the race is seen even where their words differ.
  const std::unique_ptr<StressTarget> target = make_fake_stress_target({}, 1);
  std::shared_ptr<streampool::Device> device = target->device();
  constexpr std::size_t words = 1024;
  void* memory = nullptr;
  REQUIRE(device->malloc(&memory, words * sizeof(unsigned)) == cudaSuccess);
  auto* data = static_cast<unsigned*>(memory);
  {
    const std::unique_ptr<StressLane> a = target->make_lane();
    const std::unique_ptr<StressLane> b = target->make_lane();
    a->write_tag(data, words, 1, 0);
    a->check_tag(data, words, 1, false);
    b->write_tag(data + 256, words - 256, 2, 0);
    a->finish();
    b->finish();
    target->stop();
  }
  const std::vector<std::string> hazards = target->hazards();
  REQUIRE_FALSE(hazards.empty());
  CHECK_THAT(hazards.front(), Contains("race"));
  CHECK(device->free(memory) == cudaSuccess);
}

TEST_CASE("a bound on checks in flight keeps each thread within that many of its device",
          "[stress][run]") {
  StressOptions options = fake_run(1, 2);
  options.max_in_flight = 1;
  std::ostringstream log;
  const std::vector<StressResult> results = run_stress(options, log);
  INFO(log.str());
  REQUIRE(results.size() == 1);
  const StressResult& r = results.front();
  CHECK(stress_failures(r, 0).empty());
  CHECK(r.max_in_flight == 1);
  REQUIRE(r.in_flight.samples > 0);
  // Sampled just after the iteration's check was launched: the one allowed before it, and itself.
  CHECK(r.in_flight.p99_ns <= 2);
  CHECK_THAT(stress_table(r).title, Contains("at most 1 checks in flight"));
  CHECK_FALSE(r.mark_drops);
  CHECK_THAT(stress_table(r).title, !Contains("event recorded after every drop"));
}

TEST_CASE("stress with mark_drops carries it into the result and names it in the title", "[stress][run]") {
  StressOptions options = fake_run(0.5, 1);
  options.mark_drops = true;
  std::ostringstream log;
  const std::vector<StressResult> results = run_stress(options, log);
  INFO(log.str());
  REQUIRE(results.size() == 1);
  CHECK(stress_failures(results.front(), 0).empty());
  CHECK(results.front().mark_drops);
  CHECK_THAT(stress_table(results.front()).title, Contains("an event recorded after every drop"));
}

TEST_CASE("stress with host work spends it after every drop, and says so in the title",
          "[stress][run]") {
  StressOptions options = fake_run(0.5, 2);
  options.host_work_ns = 5'000'000;  // 5 ms: at most ~100 buffers a thread in 0.5 s
  std::ostringstream log;
  const std::vector<StressResult> results = run_stress(options, log);
  INFO(log.str());
  REQUIRE(results.size() == 1);
  const StressResult& r = results.front();
  CHECK(stress_failures(r, 0).empty());
  CHECK(r.host_work_ns == 5'000'000);
  REQUIRE(r.buffers > 0);
  // Each thread's buffers, but its last, were followed by 5 ms of work within the run (and a
  // thread may start a little before the run's clock).
  const double most = options.threads * (r.seconds / 0.005 + 2);
  CHECK(double(r.buffers) <= most);
  // The work is in no latency.
  CHECK(r.drop.mean_ns < 1e6);
  CHECK_THAT(stress_table(r).title, Contains("5000000 ns of host work after every drop"));
}

// Found in review (2026-12-06): stress --out wrote its files through streams it never checked, so
// a file it could not write (here a folder in its place) was reported written, with status 0.
TEST_CASE("stress --out that cannot write its files exits with 1 and says which", "[stress][run]") {
  const TempDir dir;
  const std::filesystem::path out = dir.file("out");
  std::filesystem::create_directories(out / "stress.csv");  // a folder where the file goes
  StressOptions options;
  options.fake = true;
  options.seconds = 0.5;
  options.threads = 1;
  options.interval = 1;
  options.out = out.string();
  std::ostringstream log;
  std::ostringstream err;
  CHECK(stress_command(options, log, err) == 1);
  CHECK_THAT(err.str(), Contains("cannot write") && Contains("stress.csv"));
  CHECK_THAT(log.str(), !Contains("wrote"));
}
