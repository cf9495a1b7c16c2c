// tune starts from the configuration in use (the defaults, then STREAMPOOL_CONF, then --config),
// shows it as the baseline row, never recommends anything that ranks after it, and recommends
// only the keys it changed, on top of the user's own items.
#include "cli_helpers.hpp"
#include "settings.hpp"
#include "temp_dir.hpp"
#include "tune.hpp"
#include "workloads.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>

using namespace streampool::bench;
using namespace streampool::bench::testing;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using streampool::PoolOptions;

TEST_CASE("the grid starts from the baseline, and nothing ranks after it is recommended",
          "[tune]") {
  PoolOptions base;
  base.large_rounding = std::size_t{64} << 10;  // in neither grid's values
  const auto grid = tune_grid(base);
  REQUIRE(grid.front() == base);
  for (std::size_t i = 1; i < grid.size(); ++i) CHECK(grid[i] != base);
  const auto rows = tune({make_workload("pipeline", 1), make_workload("random", 1)}, grid, 2);
  REQUIRE(std::count_if(rows.begin(), rows.end(), [](const TuneRow& r) { return r.baseline; }) == 1);
  const TuneRow& baseline = *std::find_if(rows.begin(), rows.end(), [](const TuneRow& r) { return r.baseline; });
  CHECK(baseline.options == base);
  CHECK_FALSE(ranks_before(baseline, rows.front()));
}

TEST_CASE("tune recommends the keys it changed on top of the user's settings", "[tune][cli]") {
  const ScopedConf conf("unfenced=512K");
  const std::vector<std::string> args{"tune",      "--workload", "transformer", "--threads", "2",
                                      "--config",  "stream_checks=none,max_reserved=64G", "--top",
                                      "3"};
  const BenchRun run = run_bench(args);
  REQUIRE(run.status == 0);
  SECTION("the table shows the baseline row, named as such") {
    CHECK_THAT(run.out, Contains("| baseline ("));
    CHECK_THAT(run.out, Contains("(baseline) |"));
    CHECK_THAT(run.out, Contains("baseline: STREAMPOOL_CONF=unfenced=512K, then --config "
                                 "stream_checks=none,max_reserved=64G"));
  }
  SECTION("the recommended line keeps every key of the user's and parses to the rank-1 row") {
    const std::string line = last_line(run.out);
    REQUIRE_THAT(line, StartsWith("STREAMPOOL_CONF="));
    const auto items = conf_items(line.substr(std::string("STREAMPOOL_CONF=").size()));
    REQUIRE(items.size() >= 3);
    CHECK(items[0] == ConfItem{"unfenced", "512K"});
    CHECK(items[1] == ConfItem{"stream_checks", "none"});
    CHECK(items[2] == ConfItem{"max_reserved", "64G"});

    std::vector<std::string> json_args = args;
    json_args.push_back("--json");
    const BenchRun json_run = run_bench(json_args);
    REQUIRE(json_run.status == 0);
    const nlohmann::json json = nlohmann::json::parse(json_run.out);
    CHECK(json.at("recommended") == line.substr(std::string("STREAMPOOL_CONF=").size()));
    const nlohmann::json& best = json.at("configurations").at(0);
    CHECK(PoolOptions::parse(json.at("recommended").get<std::string>()).to_conf() ==
          best.at("config").get<std::string>());
    // Only the keys it changed are added: each differs from the baseline's value.
    const Settings settings = user_settings("stream_checks=none,max_reserved=64G");
    const auto baseline_items = conf_items(settings.options.to_conf());
    for (const ConfItem& change : conf_items(json.at("changes").get<std::string>())) {
      CAPTURE(change.key);
      CHECK(std::find(baseline_items.begin(), baseline_items.end(), change) == baseline_items.end());
    }
    CHECK(items.size() == 3 + conf_items(json.at("changes").get<std::string>()).size());
  }
}

TEST_CASE("where nothing beats the baseline, tune says so and changes nothing", "[tune][cli]") {
  const ScopedConf conf(std::nullopt);
  const TempDir dir;
  // One small block: every configuration of the grid reserves the same slab for it.
  write_text(dir.file("one.csv"),
             "Thread,Time,Action,Pointer,Size,Stream\n0,1,allocate,0x1000,512,0x0\n"
             "0,2,free,0x1000,512,0x0\n");
  const BenchRun run =
      run_bench({"tune", dir.file("one.csv"), "--threads", "2", "--config", "max_reserved=8G"});
  REQUIRE(run.status == 0);
  CHECK_THAT(run.out, Contains("recommended: the baseline"));
  CHECK(last_line(run.out) == "STREAMPOOL_CONF=max_reserved=8G");
}

TEST_CASE("tune --out names the chosen configuration in its plots", "[tune][cli]") {
  const ScopedConf conf(std::nullopt);
  const TempDir dir;
  const BenchRun run = run_bench(
      {"tune", "--workload", "random", "--threads", "2", "--out", dir.file("out")});
  REQUIRE(run.status == 0);
  for (const char* name : {"tune-timeline.svg", "tune-tradeoff.svg"}) {
    CAPTURE(name);
    std::stringstream svg;
    svg << std::ifstream(dir.file(std::string("out/") + name)).rdbuf();
    CHECK_THAT(svg.str(), Contains("chosen: ") || Contains("recommended"));
  }
}
