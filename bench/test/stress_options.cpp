// parse_stress_options: the stress command's options, their defaults, and the command lines it
// refuses before anything runs.
#include "stress.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace streampool::bench;
using Catch::Matchers::Contains;

namespace {
StressOptions parse(std::vector<std::string> args) { return parse_stress_options(args); }
}  // namespace

TEST_CASE("stress options: defaults, every option, and --config repeated", "[stress][options]") {
  SECTION("no options: the defaults, one configuration with the pool's defaults") {
    const StressOptions o = parse({});
    CHECK(o.seconds == 30);
    CHECK(o.threads == 0);  // chosen by the target: 12 on the GPU, fewer on the fake
    CHECK(o.churn == 0);
    CHECK(o.configs == std::vector<std::string>{""});
    CHECK_FALSE(o.fake);
    CHECK(o.out.empty());
    CHECK(o.interval == 5);
    CHECK(o.seed == 1);
    CHECK(o.max_growth == 0);
    CHECK(o.max_in_flight == 0);
    CHECK_FALSE(o.mark_drops);
    CHECK(o.host_work_ns == 0);
    CHECK_FALSE(o.help);
  }
  SECTION("every option takes its value") {
    const StressOptions o =
        parse({"--seconds", "2.5", "--threads", "3", "--churn", "64", "--fake", "--out", "dir",
               "--interval", "0.5", "--seed", "7", "--max-growth", "1.5", "--max-in-flight", "16",
               "--mark-drops", "--host-work-ns", "4000"});
    CHECK(o.seconds == 2.5);
    CHECK(o.threads == 3);
    CHECK(o.churn == 64);
    CHECK(o.fake);
    CHECK(o.out == "dir");
    CHECK(o.interval == 0.5);
    CHECK(o.seed == 7);
    CHECK(o.max_growth == 1.5);
    CHECK(o.max_in_flight == 16);
    CHECK(o.mark_drops);
    CHECK(o.host_work_ns == 4000);
  }
  SECTION("each --config adds a configuration, in order; \"\" stands for the defaults") {
    const StressOptions o = parse({"--config", "", "--config", "fence_every_free=true"});
    CHECK(o.configs == std::vector<std::string>{"", "fence_every_free=true"});
  }
  SECTION("--help asks for the usage") {
    CHECK(parse({"--help"}).help);
    CHECK(parse({"-h"}).help);
  }
}

TEST_CASE("stress refuses a bad command line, saying what is wrong", "[stress][options]") {
  SECTION("an option without its value") {
    CHECK_THROWS_AS(parse({"--seconds"}), StressUsageError);
    CHECK_THROWS_WITH(parse({"--config"}), Contains("--config") && Contains("missing"));
  }
  SECTION("an unknown option") {
    CHECK_THROWS_WITH(parse({"--churns", "4"}), Contains("not expected") && Contains("--churns"));
  }
  SECTION("an argument that is no option") {
    CHECK_THROWS_WITH(parse({"trace.csv"}), Contains("not expected: trace.csv"));
  }
  SECTION("an option given twice that takes one value") {
    CHECK_THROWS_AS(parse({"--seconds", "1", "--seconds", "2"}), StressUsageError);
  }
  SECTION("seconds, interval and growth must be positive numbers") {
    CHECK_THROWS_WITH(parse({"--seconds", "0"}), Contains("--seconds: needs a positive number"));
    CHECK_THROWS_WITH(parse({"--seconds", "-1"}), Contains("positive number"));
    CHECK_THROWS_WITH(parse({"--interval", "1s"}), Contains("not '1s'"));
    CHECK_THROWS_WITH(parse({"--max-growth", "nan"}), Contains("positive number"));
    CHECK_THROWS_WITH(parse({"--seconds", "inf"}), Contains("positive number"));
  }
  SECTION("threads, churn and seed must be whole numbers; threads at least one") {
    CHECK_THROWS_WITH(parse({"--threads", "0"}), Contains("--threads: needs a whole number"));
    CHECK_THROWS_WITH(parse({"--threads", "2.5"}), Contains("whole number"));
    CHECK_THROWS_WITH(parse({"--churn", "-1"}), Contains("whole number"));
    CHECK_THROWS_WITH(parse({"--seed", "-1"}), Contains("not '-1'"));
    CHECK_THROWS_WITH(parse({"--seed", "x"}), Contains("whole number"));
  }
  SECTION("host work is a whole number of nanoseconds up to one second") {
    CHECK_THROWS_WITH(parse({"--host-work-ns", "-5"}),
                      Contains("--host-work-ns") && Contains("not '-5'"));
    CHECK_THROWS_WITH(parse({"--host-work-ns", "1.5"}), Contains("whole number"));
    CHECK_THROWS_WITH(parse({"--host-work-ns", "1000000001"}),
                      Contains("0 to 1000000000") && Contains("not '1000000001'"));
    CHECK(parse({"--host-work-ns", "1000000000"}).host_work_ns == 1'000'000'000);
  }
  SECTION("a configuration the pool would refuse, named with the pool's reason") {
    CHECK_THROWS_WITH(parse({"--config", "no_such_key=1"}),
                      Contains("--config 'no_such_key=1'") && Contains("no_such_key"));
    CHECK_THROWS_WITH(parse({"--config", "fence_every_free=maybe"}),
                      Contains("expected true or false"));
    CHECK_THROWS_WITH(parse({"--config", "smallest=100"}), Contains("--config 'smallest=100'"));
  }
}
