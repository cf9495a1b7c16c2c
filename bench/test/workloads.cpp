// The embedded workloads: deterministic, complete (everything allocated is freed) and of the
// intended size.
#include "workloads.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <stdexcept>

using namespace streampool::bench;
using Kind = TraceEvent::Kind;

namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;
constexpr std::uint64_t GB = 1'000'000'000;

bool same(const Trace& a, const Trace& b) {
  if (a.events.size() != b.events.size() || a.streams != b.streams) return false;
  return std::equal(a.events.begin(), a.events.end(), b.events.begin(),
                    [](const TraceEvent& x, const TraceEvent& y) {
                      return x.kind == y.kind && x.stream == y.stream && x.used_on == y.used_on &&
                             x.allocation == y.allocation && x.size == y.size &&
                             x.time_us == y.time_us;
                    });
}

// What parse_trace guarantees of a trace, checked of a generated one: allocations numbered in
// order, each freed at most once, by a free of its size on its stream.
void check_well_formed(const Trace& trace) {
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint32_t> streams;
  std::vector<bool> live;
  for (const TraceEvent& e : trace.events) {
    REQUIRE(e.stream < trace.streams.size());
    REQUIRE(e.thread < trace.threads.size());
    if (e.kind == Kind::alloc) {
      REQUIRE(e.allocation == sizes.size());
      REQUIRE(e.size > 0);
      sizes.push_back(e.size);
      streams.push_back(e.stream);
      live.push_back(true);
    } else {
      REQUIRE(e.allocation < sizes.size());
      REQUIRE(live[e.allocation]);
      REQUIRE(e.size == sizes[e.allocation]);
      REQUIRE(e.stream == streams[e.allocation]);
      REQUIRE((e.used_on == no_stream || (e.used_on < trace.streams.size() && e.used_on != e.stream)));
      live[e.allocation] = false;
    }
  }
  REQUIRE(trace.allocations == sizes.size());
  REQUIRE(std::is_sorted(trace.events.begin(), trace.events.end(),
                         [](const TraceEvent& a, const TraceEvent& b) { return a.time_us < b.time_us; }));
}

}  // namespace

TEST_CASE("workload_names lists the three embedded workloads, and make_workload builds each",
          "[workloads]") {
  CHECK(workload_names() == std::vector<std::string>{"random", "transformer", "pipeline"});
  for (const std::string& name : workload_names()) {
    INFO(name);
    const Trace trace = make_workload(name);
    CHECK(trace.name == name);
    CHECK_FALSE(trace.events.empty());
    check_well_formed(trace);
  }
}

TEST_CASE("make_workload rejects an unknown name", "[workloads]") {
  CHECK_THROWS_AS(make_workload("resnet"), std::invalid_argument);
}

TEST_CASE("A workload is the same for a seed and different for another", "[workloads]") {
  for (const std::string& name : workload_names()) {
    INFO(name);
    const Trace first = make_workload(name, 7);
    CHECK(same(first, make_workload(name, 7)));
    CHECK_FALSE(same(first, make_workload(name, 8)));
  }
}

TEST_CASE("Every workload frees everything it allocates", "[workloads]") {
  for (const std::string& name : workload_names()) {
    for (const std::uint64_t seed : {1, 2, 3}) {
      INFO(name << " seed " << seed);
      const Trace trace = make_workload(name, seed);
      CHECK(trace.left_live == 0);
      const auto frees = std::count_if(trace.events.begin(), trace.events.end(),
                                       [](const TraceEvent& e) { return e.kind == Kind::free; });
      CHECK(static_cast<std::uint64_t>(frees) == trace.allocations);
    }
  }
}

TEST_CASE("Each workload's peak lies in its intended range", "[workloads]") {
  const std::uint64_t seeds[] = {1, 2, 3};
  SECTION("random: at its 1 GiB cap on live bytes, within one allocation of it") {
    for (const std::uint64_t seed : seeds) {
      const std::uint64_t peak = make_workload("random", seed).peak_requested();
      CHECK(peak < GiB);
      CHECK(peak >= GiB - 4 * MiB);
    }
  }
  SECTION("transformer: between 1 and 2 GB") {
    for (const std::uint64_t seed : seeds) {
      const std::uint64_t peak = make_workload("transformer", seed).peak_requested();
      CHECK(peak >= 1 * GB);
      CHECK(peak <= 2 * GB);
    }
  }
  SECTION("pipeline: between 200 and 600 MB") {
    for (const std::uint64_t seed : seeds) {
      const std::uint64_t peak = make_workload("pipeline", seed).peak_requested();
      CHECK(peak >= 200'000'000);
      CHECK(peak <= 600'000'000);
    }
  }
}

TEST_CASE("The random workload makes count allocations of sizes 1 to max_size on one stream",
          "[workloads]") {
  const Trace trace = random_workload(5, 20000, 4 * MiB);
  CHECK(trace.allocations == 20000);
  CHECK(trace.streams.size() == 1);
  std::uint64_t smallest = ~std::uint64_t{0}, largest = 0;
  for (const TraceEvent& e : trace.events) {
    smallest = std::min(smallest, e.size);
    largest = std::max(largest, e.size);
  }
  CHECK(smallest >= 1);
  CHECK(largest <= 4 * MiB);
  CHECK(largest > 4 * MiB - 4 * MiB / 100);  // the range is covered
  CHECK(smallest < 4 * MiB / 100);
  const Trace small = random_workload(5, 100, 1000);
  CHECK(small.allocations == 100);
  CHECK(small.left_live == 0);
}

TEST_CASE("The transformer workload runs each of its steps at one of three sequence lengths, on "
          "one stream",
          "[workloads]") {
  const Trace trace = transformer_workload(1, 6);
  CHECK(trace.streams.size() == 1);
  // The fp32 log-probabilities, batch 2 x length x GPT-2's vocabulary, are the largest tensors
  // of a step: one size per sequence length.
  std::set<std::uint64_t> log_prob_sizes;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == Kind::alloc && e.size % (2 * 50257 * 4) == 0 && e.size >= 2 * 50257 * 4 * 256) {
      log_prob_sizes.insert(e.size / (2 * 50257 * 4));
    }
  }
  CHECK(log_prob_sizes == std::set<std::uint64_t>{256, 384, 512});
  CHECK(transformer_workload(1, 2).events.size() < trace.events.size());
}

TEST_CASE("The pipeline workload allocates each input on the producer stream and frees it after "
          "use on the consumer stream",
          "[workloads]") {
  const Trace trace = pipeline_workload(1, 200);
  REQUIRE(trace.streams.size() == 2);
  std::uint64_t used_elsewhere = 0, producer_allocations = 0;
  for (const TraceEvent& e : trace.events) {
    if (e.kind == Kind::alloc && e.stream == 1) ++producer_allocations;
    if (e.kind == Kind::free && e.used_on != no_stream) {
      ++used_elsewhere;
      CHECK(e.stream == 1);
      CHECK(e.used_on == 0);
    }
  }
  CHECK(used_elsewhere == 200);                 // one input per batch
  CHECK(producer_allocations == 3 * 200);       // and two scratch buffers
  CHECK(pipeline_workload(1, 10).allocations < trace.allocations);
}
