// replay --calls: the device calls of a replay, by kind, beside its figures. Each count must
// match what the pool says it did (a growth is one cuMemCreate, a fixed segment one cudaMalloc),
// and a replay that was not asked to count reports no calls at all.
#include "cli_helpers.hpp"
#include "replay.hpp"
#include "workloads.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

using namespace streampool::bench;
using namespace streampool::bench::testing;
using Catch::Matchers::Contains;

namespace {

std::uint64_t calls_of(const ReplayReport& report, const std::string& call) {
  const auto it = std::find_if(report.device_calls.begin(), report.device_calls.end(),
                               [&](const DeviceCallCount& c) { return c.call == call; });
  return it == report.device_calls.end() ? 0 : it->calls;
}

}  // namespace

TEST_CASE("a replay counts the device calls of each kind when asked", "[replay]") {
  const Trace trace = make_workload("transformer", 1);
  ReplayOptions options;
  SECTION("not asked: no calls reported") {
    const ReplayReport report = replay(trace, fake_target(), options);
    CHECK(report.device_allocations > 0);
    CHECK(report.device_calls.empty());
  }
  options.count_calls = true;
  SECTION("expandable segments: one cuMemCreate, map and set-access a growth, all released") {
    const ReplayReport report = replay(trace, fake_target(), options);
    REQUIRE(report.device_allocations > 0);
    CHECK(calls_of(report, "vm_create") == report.device_allocations);
    CHECK(calls_of(report, "vm_map") == report.device_allocations);
    CHECK(calls_of(report, "vm_set_access") == report.device_allocations);
    // Counted through the pool's destruction: every mapping made is unmapped and released.
    CHECK(calls_of(report, "vm_release") == report.device_allocations);
    CHECK(calls_of(report, "malloc") == 0);
  }
  SECTION("fixed segments: one cudaMalloc a segment, each freed") {
    options.pool.expandable_segments = false;
    const ReplayReport report = replay(trace, fake_target(), options);
    REQUIRE(report.device_allocations > 0);
    CHECK(calls_of(report, "malloc") == report.device_allocations);
    CHECK(calls_of(report, "free") == report.device_allocations);
    CHECK(calls_of(report, "vm_create") == 0);
  }
}

TEST_CASE("replay --calls prints the device calls in the text and the JSON", "[replay][cli]") {
  const BenchRun text = run_bench({"replay", "--fake", "--calls", "--workload", "pipeline"});
  CHECK(text.status == 0);
  CHECK_THAT(text.out, Contains("### Device calls"));
  CHECK_THAT(text.out, Contains("| pipeline | vm_create |"));

  const BenchRun json = run_bench({"replay", "--fake", "--calls", "--workload", "pipeline", "--json"});
  REQUIRE(json.status == 0);
  const nlohmann::json report = nlohmann::json::parse(json.out).at(0);
  const nlohmann::json& calls = report.at("device_calls");
  REQUIRE(calls.is_array());
  const auto create = std::find_if(calls.begin(), calls.end(),
                                   [](const nlohmann::json& c) { return c.at("call") == "vm_create"; });
  REQUIRE(create != calls.end());
  CHECK(create->at("calls") == report.at("device_allocations"));
  CHECK(create->contains("ns"));

  const BenchRun plain = run_bench({"replay", "--fake", "--workload", "pipeline", "--json"});
  REQUIRE(plain.status == 0);
  CHECK_FALSE(nlohmann::json::parse(plain.out).at(0).contains("device_calls"));
  CHECK_THAT(run_bench({"replay", "--fake", "--workload", "pipeline"}).out,
             !Contains("Device calls"));
}
