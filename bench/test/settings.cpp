// The user's settings: the defaults, then STREAMPOOL_CONF, then --config, as the library reads
// STREAMPOOL_CONF; every subcommand that builds a pool takes them.
#include "cli_helpers.hpp"
#include "peers.hpp"
#include "settings.hpp"
#include "stress.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sstream>

using namespace streampool::bench;
using namespace streampool::bench::testing;
using Catch::Matchers::Contains;
using streampool::PoolOptions;
using streampool::StreamChecks;

TEST_CASE("conf lines as items: in order, trimmed, a repeated key in its first place",
          "[settings]") {
  CHECK(conf_items(" a = 1 ,, b=2,a=3 ") == std::vector<ConfItem>{{"a", "3"}, {"b", "2"}});
  CHECK(conf_line(merge_items({{"a", "1"}, {"b", "2"}}, {{"b", "5"}, {"c", "6"}})) == "a=1,b=5,c=6");
  PoolOptions changed;
  changed.segment_bytes = std::size_t{64} << 20;
  changed.stream_checks = StreamChecks::none;
  CHECK(conf_line(changed_items(PoolOptions{}, changed)) == "segment=64M,stream_checks=none");
  CHECK(changed_items(changed, changed).empty());
}

TEST_CASE("settings are the defaults, then STREAMPOOL_CONF, then --config", "[settings]") {
  SECTION("neither: the defaults") {
    const ScopedConf conf(std::nullopt);
    const Settings s = user_settings("");
    CHECK(s.options.to_conf() == PoolOptions{}.to_conf());
    CHECK(s.line().empty());
    CHECK(s.origin() == "the defaults");
  }
  SECTION("the environment's keys, --config's on top, key by key") {
    const ScopedConf conf("max_reserved=1G,stream_checks=none");
    const Settings s = user_settings("stream_checks=identity,segment=32M");
    CHECK(s.options.max_reserved_bytes == std::size_t{1} << 30);
    CHECK(s.options.stream_checks == StreamChecks::identity);
    CHECK(s.options.segment_bytes == std::size_t{32} << 20);
    CHECK_FALSE(s.options.read_environment);  // applied once, here
    CHECK(s.line() == "max_reserved=1G,stream_checks=identity,segment=32M");
    CHECK(PoolOptions::parse(s.line()).to_conf() == s.options.to_conf());
  }
  SECTION("a bad value says where it came from") {
    {
      const ScopedConf conf("no_such_key=1");
      CHECK_THROWS_WITH(user_settings(""), Contains("environment") && Contains("no_such_key"));
    }
    const ScopedConf conf(std::nullopt);
    CHECK_THROWS_WITH(user_settings("slab=0"), Contains("--config") && Contains("slab"));
  }
}

TEST_CASE("the bench honours STREAMPOOL_CONF like the library, --config on top", "[settings]") {
  SECTION("replay replays with the environment's settings") {
    const ScopedConf conf("large_shelf=9,unfenced=512K");
    const BenchRun run =
        run_bench({"replay", "--fake", "--workload", "random", "--config", "large_shelf=3", "--json"});
    REQUIRE(run.status == 0);
    const auto config = nlohmann::json::parse(run.out).at(0).at("config").get<std::string>();
    CHECK_THAT(config, Contains("large_shelf=3"));
    CHECK_THAT(config, Contains("unfenced=512K"));
  }
  SECTION("a bad STREAMPOOL_CONF is a bad command line, as the library refuses it") {
    const ScopedConf conf("segment=banana");
    const BenchRun run = run_bench({"replay", "--fake", "--workload", "random"});
    CHECK(run.status == 2);
    CHECK_THAT(run.err, Contains("STREAMPOOL_CONF") && Contains("segment"));
  }
  SECTION("stress runs each --config on top of the environment") {
    const ScopedConf conf("stream_checks=identity");
    StressOptions o = parse_stress_options(
        {"--fake", "--seconds", "0.2", "--threads", "1", "--config", "", "--config", "segment=32M"});
    std::ostringstream log;
    const std::vector<StressResult> results = run_stress(o, log);
    REQUIRE(results.size() == 2);
    CHECK_THAT(results[0].config, Contains("stream_checks=identity"));
    CHECK_THAT(results[1].config, Contains("stream_checks=identity") && Contains("segment=32M"));
  }
  SECTION("stress refuses a bad STREAMPOOL_CONF before anything runs") {
    const ScopedConf conf("segment=banana");
    CHECK_THROWS_AS(parse_stress_options({"--fake"}), StressUsageError);
  }
}

// compare's GPU rows: each streampool row is the settings with at most one key changed, so that
// `compare --config` measures the configuration it names and not the defaults.
TEST_CASE("compare's streampool rows are the settings and one change each", "[settings][compare]") {
  const ScopedConf conf("max_reserved=1G");
  const Settings s = user_settings("slab=512K,large_rounding=64K");
  const std::vector<StreampoolVariant> rows = streampool_variants(s);
  REQUIRE(rows.size() == 4);
  const std::string base = s.options.to_conf();
  PoolOptions none = s.options;
  none.stream_checks = StreamChecks::none;
  PoolOptions no_shelf = s.options;
  no_shelf.large_shelf = 0;
  PoolOptions fixed = s.options;
  fixed.expandable_segments = false;
  CHECK(rows[0].options.to_conf() == none.to_conf());
  CHECK(rows[1].options.to_conf() == base);
  CHECK(rows[2].options.to_conf() == no_shelf.to_conf());
  CHECK(rows[3].options.to_conf() == fixed.to_conf());
  CHECK(rows[1].options.slab_bytes == std::size_t{512} << 10);  // not the default
  CHECK(rows[1].options.max_reserved_bytes == std::size_t{1} << 30);
  CHECK_FALSE(rows[1].options.read_environment);
  CHECK(rows[0].name == "streampool (max_reserved=1G,slab=512K,large_rounding=64K, stream_checks=none)");
  CHECK(rows[1].name == "streampool (max_reserved=1G,slab=512K,large_rounding=64K)");
  CHECK(rows[3].name ==
        "streampool (max_reserved=1G,slab=512K,large_rounding=64K, expandable_segments=false)");

  const ScopedConf none_set(std::nullopt);
  const std::vector<StreampoolVariant> defaults = streampool_variants(user_settings(""));
  CHECK(defaults[0].name == "streampool (stream_checks=none)");
  CHECK(defaults[1].name == "streampool (default: every check)");
  CHECK(defaults[2].name == "streampool (default, large_shelf=0)");
  CHECK(defaults[1].options.to_conf() == PoolOptions{}.to_conf());
}
