// The command line: every subcommand has its own --help and takes only its own options, values
// out of range are refused (never wrapped), and files it is pointed at must exist before anything
// runs. A bad command line exits with 2.
#include "cli_helpers.hpp"
#include "temp_dir.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

using namespace streampool::bench::testing;
using Catch::Matchers::Contains;

namespace {
const std::vector<std::string> commands{"replay", "tune", "compare", "workloads", "stress"};
}  // namespace

TEST_CASE("each subcommand has its own --help", "[cli]") {
  SECTION("the top level lists every subcommand") {
    const BenchRun run = run_bench({"--help"});
    CHECK(run.status == 0);
    for (const std::string& c : commands) CHECK_THAT(run.out, Contains(c));
  }
  SECTION("each subcommand's help names it and its own options, not the others'") {
    struct Own {
      std::string command, has, lacks;
    };
    for (const Own& own : {Own{"replay", "--timeline", "--top"}, Own{"tune", "--top", "--timeline"},
                           Own{"compare", "--torch-summary", "--wide"},
                           Own{"workloads", "--write", "--config"},
                           Own{"stress", "--max-in-flight", "--workload"}}) {
      CAPTURE(own.command);
      const BenchRun run = run_bench({own.command, "--help"});
      CHECK(run.status == 0);
      CHECK_THAT(run.out, Contains("streampool-bench " + own.command));
      CHECK_THAT(run.out, Contains(own.has));
      CHECK_THAT(run.out, !Contains(own.lacks));
      CHECK(run.err.empty());
    }
  }
}

TEST_CASE("an option a subcommand does not take is an error", "[cli]") {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"replay", "--top", "3"},
                                             {"--top", "3"},  // no subcommand: replay's options
                                             {"tune", "--timeline", "t.svg"},
                                             {"tune", "--fake"},
                                             {"compare", "--wide"},
                                             {"workloads", "--write", ".", "--json"},
                                             {"stress", "--workload", "random"},
                                             {"replay", "--no-such-option"}}) {
    CAPTURE(args);
    const BenchRun run = run_bench(args);
    CHECK(run.status == 2);
    CHECK_THAT(run.err, Contains("not expected"));
    CHECK(run.out.empty());
  }
}

TEST_CASE("nonsensical values are errors, and negative numbers are not wrapped", "[cli]") {
  struct Bad {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Bad& bad : {Bad{{"tune", "--threads", "0"}, "--threads"},
                         Bad{{"tune", "--threads", "-1"}, "--threads"},
                         Bad{{"tune", "--top", "-3"}, "--top"},
                         Bad{{"tune", "--top", "-1"}, "--top"},
                         Bad{{"tune", "--top", "0"}, "--top"},
                         Bad{{"tune", "--top", "2.5"}, "--top"},
                         Bad{{"replay", "--seed", "-1"}, "--seed"},
                         Bad{{"replay", "--seed", "0x10"}, "--seed"},
                         Bad{{"replay", "--workload", "nope"}, "--workload"},
                         Bad{{"tune", "--top"}, "--top"},
                         Bad{{"tune", "--top", "3", "--top", "4"}, "--top"},
                         Bad{{"stress", "--threads", "0"}, "--threads"},
                         Bad{{"stress", "--seed", "-1"}, "--seed"},
                         Bad{{"stress", "--seconds", "-2"}, "--seconds"}}) {
    CAPTURE(bad.args);
    const BenchRun run = run_bench(bad.args);
    CHECK(run.status == 2);
    CHECK_THAT(run.err, Contains(bad.says));
    CHECK(run.out.empty());
  }
}

TEST_CASE("files and folders the command line names must exist before anything runs", "[cli]") {
  const TempDir dir;
  SECTION("a --timeline in a folder that does not exist") {
    const std::string svg = dir.file("no/such/folder/t.svg");
    const BenchRun run = run_bench({"replay", "--fake", "--workload", "random", "--timeline", svg});
    CHECK(run.status == 2);
    CHECK_THAT(run.err, Contains("does not exist"));
    CHECK(run.out.empty());  // refused before the replay
    CHECK_FALSE(std::filesystem::exists(svg));
  }
  SECTION("a --torch-summary file that does not exist") {
    const BenchRun run =
        run_bench({"compare", "--fake", "--workload", "random", "--torch-summary", dir.file("x.json")});
    CHECK(run.status == 2);
    CHECK_THAT(run.err, Contains("--torch-summary"));
  }
  SECTION("a --torch-summary that is not the documented JSON") {
    write_text(dir.file("bad.json"), "{\"name\": ");
    const BenchRun run = run_bench(
        {"compare", "--fake", "--workload", "random", "--torch-summary", dir.file("bad.json")});
    CHECK(run.status == 1);
    CHECK_THAT(run.err, Contains("bad.json"));
  }
  SECTION("workloads --write into a folder that does not exist") {
    const BenchRun run = run_bench({"workloads", "--write", dir.file("missing")});
    CHECK(run.status == 2);
    CHECK_THAT(run.err, Contains("--write"));
  }
  SECTION("a trace file that does not exist") {
    const BenchRun run = run_bench({"replay", "--fake", dir.file("missing.csv")});
    CHECK(run.status == 1);
    CHECK_THAT(run.err, Contains("missing.csv"));
  }
}
