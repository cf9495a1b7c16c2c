// Writes the fuzzer's seed corpus (test/fuzz/corpus/): the inputs of seeded model runs of a few
// lengths (a seeded ByteSource records the bytes it drew) and the input of every reduced failure
// in test/model/findings.txt. Each is checked to pass as the fuzzer runs it (fuzz_options.hpp);
// one that fails is reported and not written: it is a finding.
//
// Usage: streampool_fuzz_corpus OUT_DIR FINDINGS_FILE [SEEDS]   (SEEDS default 24)
#include "fuzz_options.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Runs `bytes` as the fuzzer would and writes them to `dir/name` when the run passes.
bool write_input(const std::filesystem::path& dir, const std::string& name,
                 const std::vector<std::uint8_t>& bytes) {
  const pool_model::RunResult result = pool_model::run_bytes_isolated(bytes, pool_fuzz::run_options());
  if (result.failure) {
    std::fputs(fmt::format("{}: fails as the fuzzer runs it, not written: {}: {}\ninput: {}\n",
                           name, result.failure->kind, result.failure->what,
                           pool_model::to_hex(bytes))
                   .c_str(),
               stderr);
    return false;
  }
  std::ofstream out(dir / name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  std::printf("%s: %zu bytes, %zu operations\n", name.c_str(), bytes.size(), result.log.size());
  return out.good();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fputs("usage: streampool_fuzz_corpus OUT_DIR FINDINGS_FILE [SEEDS]\n", stderr);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const int seeds = argc > 3 ? std::atoi(argv[3]) : 24;
  bool ok = true;

  // Seeded runs, short to long: the short ones are cheap for libFuzzer to mutate, the long ones
  // reach states (captures under way, streams churned, faults) that take many operations.
  const int lengths[] = {20, 60, 150, 300};
  for (int seed = 1; seed <= seeds; ++seed) {
    pool_model::RunOptions options = pool_fuzz::run_options();
    options.max_steps = lengths[static_cast<std::size_t>(seed) % std::size(lengths)];
    const pool_model::RunResult seeded =
        pool_model::run_seed_isolated(static_cast<std::uint64_t>(seed), options);
    if (seeded.failure) {
      std::fputs(fmt::format("seed {} fails: {}: {}\n", seed, seeded.failure->kind,
                             seeded.failure->what)
                     .c_str(),
                 stderr);
      ok = false;
      continue;
    }
    ok = write_input(dir, fmt::format("seed-{:02}", seed), seeded.bytes) && ok;
  }

  // The findings' inputs: each name | kind | without | profile | steps | hex.
  std::ifstream findings(argv[2]);
  if (!findings.good()) {
    std::fputs(fmt::format("cannot read {}\n", argv[2]).c_str(), stderr);
    return 1;
  }
  for (std::string line; std::getline(findings, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    std::istringstream in(line);
    for (std::string field; std::getline(in, field, '|');) {
      const auto first = field.find_first_not_of(' ');
      const auto last = field.find_last_not_of(' ');
      fields.push_back(first == std::string::npos ? "" : field.substr(first, last - first + 1));
    }
    if (fields.size() != 6) continue;
    ok = write_input(dir, "finding-" + fields[0], pool_model::from_hex(fields[5])) && ok;
  }
  return ok ? 0 : 1;
}
