// The randomized model check of MemoryPool (test/model/pool_model.hpp) over many seeds: random
// operations on one pool over the fake device, a shadow model, every invariant checked after
// every step.
//
// They found 14 of the defects issue 8 lists in the pool core before its redesign, and one race
// after it (pool_fences.cpp, the slab carved from a range taken by waiting).
//
//   streampool_tests "[model]"             every seed; the first failure is printed with its log,
//                                          reduced to a short operation sequence, and its input;
//                                          and the replays of test/model/findings.txt and of the
//                                          fuzzer's seed corpus, test/fuzz/corpus (docs/fuzzing.md)
//
// Environment (all optional):
//   STREAMPOOL_MODEL_SEED=n      only seed n, its whole log printed (pass or fail)
//   STREAMPOOL_MODEL_BYTES=hex   replay this input (the "input" line of a failure, or what the
//                                fuzzer found), reduced too when it fails
//   STREAMPOOL_MODEL_SEEDS=n     how many seeds (default 400; concurrent 20, churn 6 per policy),
//                                from STREAMPOOL_MODEL_FIRST_SEED=n
//   STREAMPOOL_MODEL_STEPS=n     operations per seed (default 250)
//   STREAMPOOL_MODEL_SURVEY=1    run every seed and list each failure, instead of stopping
//   STREAMPOOL_MODEL_REDUCE=0    report the first failure as found, unreduced
//   STREAMPOOL_MODEL_PROFILE=basic  only allocations, drops, launches, record_stream, completions
//                                and trims on fixed streams (pool_model::Profile)
//   STREAMPOOL_MODEL_WITHOUT=a,b never decode these operations or variants (pool_model::op_names):
//                                to look past a failure that hides others; for the threads, the
//                                names of pool_model::ConcurrentOptions::without
//   STREAMPOOL_MODEL_IN_PROCESS=1  a replay runs in this process (for a debugger), not a child
#include "fuzz/fuzz_options.hpp"
#include "model/pool_model.hpp"

#include <streampool/device.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

using pool_model::RunOptions;
using pool_model::RunResult;

namespace {

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10) : fallback;
}

bool env_set(const char* name) { return std::getenv(name) != nullptr; }

// A failure is reduced unless STREAMPOOL_MODEL_REDUCE=0.
bool reducing() {
  const char* reduce = std::getenv("STREAMPOOL_MODEL_REDUCE");
  return reduce == nullptr || std::string(reduce) != "0";
}

// STREAMPOOL_MODEL_WITHOUT, split at commas.
std::vector<std::string> without_list() {
  std::vector<std::string> names;
  const char* value = std::getenv("STREAMPOOL_MODEL_WITHOUT");
  const std::string list = value != nullptr ? value : "";
  for (std::size_t at = 0; at < list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) names.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return names;
}

// Runs the seeds (or the one input the environment names) and fails on the first failure,
// printing it, reduced, so that it replays.
void check_seeds(const RunOptions& base, std::uint64_t default_seeds) {
  RunOptions options = base;
  options.without = without_list();
  if (const char* profile = std::getenv("STREAMPOOL_MODEL_PROFILE")) {
    if (std::string(profile) == "basic") options.profile = pool_model::Profile::basic;
  }
  options.max_steps = static_cast<int>(
      env_number("STREAMPOOL_MODEL_STEPS", static_cast<std::uint64_t>(base.max_steps)));
  if (const char* hex = std::getenv("STREAMPOOL_MODEL_BYTES")) {
    const auto input = pool_model::from_hex(hex);
    const RunResult result = env_set("STREAMPOOL_MODEL_IN_PROCESS")
                                 ? pool_model::run_bytes(input, options)
                                 : pool_model::run_bytes_isolated(input, options);
    WARN(pool_model::describe(result));
    CHECK(pool_model::operations_of(result) > 0);
    if (result.failure && reducing()) {
      const RunResult reduced = pool_model::reduce(result, options);
      WARN(fmt::format("reduced to {} operations:\n{}", reduced.log.size(),
                       pool_model::describe(reduced)));
    }
    REQUIRE_FALSE(result.failure);
    return;
  }
  if (env_set("STREAMPOOL_MODEL_SEED")) {
    const std::uint64_t seed = env_number("STREAMPOOL_MODEL_SEED", 0);
    const RunResult result = env_set("STREAMPOOL_MODEL_IN_PROCESS")
                                 ? pool_model::run_seed(seed, options)
                                 : pool_model::run_seed_isolated(seed, options);
    WARN(fmt::format("seed {}\n{}", seed, pool_model::describe(result)));
    CHECK(pool_model::operations_of(result) > 0);
    REQUIRE_FALSE(result.failure);
    return;
  }
  const std::uint64_t first = env_number("STREAMPOOL_MODEL_FIRST_SEED", 1);
  const std::uint64_t count = env_number("STREAMPOOL_MODEL_SEEDS", default_seeds);
  REQUIRE(count > 0);
  const bool survey = env_set("STREAMPOOL_MODEL_SURVEY");
  std::map<std::string, int> kinds;
  std::string survey_text;
  std::uint64_t idle = 0;  // seeds that applied no operation: they checked nothing
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    // Each seed in a child process: a crash of the pool is reported like any failure.
    const RunResult result = pool_model::run_seed_isolated(seed, options);
    idle += pool_model::operations_of(result) == 0;
    if (!result.failure) continue;
    if (survey) {
      ++kinds[result.failure->kind];
      survey_text += fmt::format("seed {}: after #{} of {}: {}: {}\n", seed, result.failure->step,
                                 result.log.size(), result.failure->kind, result.failure->what);
      continue;
    }
    std::string report = fmt::format("seed {} failed (replay: STREAMPOOL_MODEL_SEED={})\n{}", seed,
                                     seed, pool_model::describe(result, 40));
    if (reducing()) {
      const RunResult reduced = pool_model::reduce(result, options);
      report +=
          fmt::format("\nreduced to {} operations (replay: STREAMPOOL_MODEL_BYTES=<input>):\n{}",
                      reduced.log.size(), pool_model::describe(reduced));
    }
    FAIL(report);
  }
  if (survey) {
    std::string summary;
    for (const auto& [kind, n] : kinds) summary += fmt::format("  {} x {}\n", n, kind);
    WARN(fmt::format("{} seeds from {}:\n{}{}", count, first, survey_text, summary));
    REQUIRE(kinds.empty());
  }
  CHECK(idle == 0);
}

}  // namespace

TEST_CASE("random operations on the pool keep every invariant of the model", "[model]") {
  check_seeds(RunOptions{}, 400);
}

TEST_CASE("stream churn keeps reserved memory flat, whatever the fence policy", "[model]") {
  const std::uint64_t seeds = env_number("STREAMPOOL_MODEL_SEEDS", 6);
  REQUIRE(seeds > 0);
  streampool::PoolOptions base;  // the defaults (segments of 20 MiB: fragmentation stays small)
  base.stats_granule = 0;
  const auto policy = GENERATE(as<std::string>{}, "default", "fence_every_free",
                               "cross_stream_wait", "stream_checks=none");
  streampool::PoolOptions options = base;
  if (policy == "fence_every_free") options.fence_every_free = true;
  if (policy == "cross_stream_wait") options.cross_stream_wait = true;
  if (policy == "stream_checks=none") options.stream_checks = streampool::StreamChecks::none;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    const RunResult result = pool_model::run_churn(seed, options);
    if (result.failure)
      FAIL(fmt::format("{}: seed {}\n{}", policy, seed, pool_model::describe(result, 12)));
  }
}

TEST_CASE(
    "threads allocating, dropping, recording and churning streams while others trim keep "
    "every invariant",
    "[model]") {
  const std::uint64_t first = env_number("STREAMPOOL_MODEL_FIRST_SEED", 1);
  const std::uint64_t seeds = env_number("STREAMPOOL_MODEL_SEEDS", 20);
  REQUIRE(seeds > 0);
  pool_model::ConcurrentOptions options;
  options.without = without_list();
  for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
    // In a child process: what the threads race into may crash (a use after free).
    const RunResult result = pool_model::run_concurrent_isolated(seed, options);
    // The workers allocated (a run whose every allocation failed, or that never began, checked
    // nothing; a failed one may have stopped before its line).
    if (!result.failure) CHECK(pool_model::served_by(result).value_or(0) > 0);
    if (result.failure) {
      FAIL(
          fmt::format("seed {} (not deterministic: rerun it with STREAMPOOL_MODEL_FIRST_SEED={} "
                      "STREAMPOOL_MODEL_SEEDS=1, a few times)\n{}\n{}: {}",
                      seed, seed, result.setup, result.failure->kind, result.failure->what));
    }
  }
}

TEST_CASE("the reduced failures found on today's core (test/model/findings.txt) pass, each",
          "[model]") {
  std::ifstream file(STREAMPOOL_MODEL_FINDINGS);
  REQUIRE(file.good());
  std::string failing;
  int entries = 0;
  for (std::string line; std::getline(file, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    std::istringstream in(line);
    for (std::string field; std::getline(in, field, '|');) {
      const auto first = field.find_first_not_of(' ');
      const auto last = field.find_last_not_of(' ');
      fields.push_back(first == std::string::npos ? "" : field.substr(first, last - first + 1));
    }
    REQUIRE(fields.size() == 6);
    ++entries;
    RunOptions options;
    if (fields[2] != "-") {
      std::istringstream names(fields[2]);
      for (std::string name; std::getline(names, name, ',');) options.without.push_back(name);
    }
    // Found before the model joined streams to captures, they decode as they did without it;
    // those found after it are named "join-...". Likewise the framework route (prepare, attach,
    // detach around the caller's own begin and end), which came later still: those found with it
    // are named "framework-..." (and decode with "join" too).
    const bool framework = fields[0].rfind("framework-", 0) == 0;
    if (fields[0].rfind("join-", 0) != 0 && !framework) options.without.push_back("join");
    if (!framework) options.without.push_back("framework");
    if (fields[3] == "basic") options.profile = pool_model::Profile::basic;
    options.max_steps = std::stoi(fields[4]);
    const RunResult result =
        pool_model::run_bytes_isolated(pool_model::from_hex(fields[5]), options);
    if (result.failure && fields[0].rfind("kept-", 0) == 0) {
      // Behaviour kept on purpose (the file's header says why): reported here, not failed on.
      WARN(fmt::format("{}: {}: {}", fields[0], result.failure->kind, result.failure->what));
    } else if (result.failure) {
      failing += fmt::format("{} ({}): {}: {}\n", fields[0], fields[1], result.failure->kind,
                             result.failure->what);
    }
  }
  CAPTURE(entries);
  if (!failing.empty()) FAIL("still failing:\n" + failing);
}

TEST_CASE("every input of the fuzzer's seed corpus (test/fuzz/corpus) passes, run as the fuzzer "
          "runs it",
          "[model]") {
  std::vector<std::filesystem::path> inputs;
  for (const auto& entry : std::filesystem::directory_iterator(STREAMPOOL_FUZZ_CORPUS)) {
    if (entry.is_regular_file()) inputs.push_back(entry.path());
  }
  std::sort(inputs.begin(), inputs.end());
  REQUIRE_FALSE(inputs.empty());
  std::string failing;
  for (const auto& path : inputs) {
    std::ifstream file(path, std::ios::binary);
    const std::vector<std::uint8_t> input{std::istreambuf_iterator<char>(file),
                                          std::istreambuf_iterator<char>()};
    // In a child process, as the other replays: a crash of the pool is a failure like any.
    const RunResult result = pool_model::run_bytes_isolated(input, pool_fuzz::run_options());
    if (result.failure) {
      failing += fmt::format("{}: {}: {}\n", path.filename().string(), result.failure->kind,
                             result.failure->what);
    }
  }
  CAPTURE(inputs.size());
  if (!failing.empty()) FAIL("failing:\n" + failing);
}
