// The libFuzzer entry point of the model check (test/model/pool_model.hpp): each input is a run
// of random operations on one MemoryPool over the fake device, every invariant of the model
// checked after every step. A model failure prints the run and aborts, so that libFuzzer saves the
// input as a crash; a crash of the pool itself is AddressSanitizer's or UBSan's report.
//
// tools/fuzz.sh builds and runs it (build-fuzz/); docs/fuzzing.md says how to replay what it finds.
//
// Environment (optional): STREAMPOOL_MODEL_WITHOUT=a,b never decodes these operations
// (pool_model::op_names), to look past a failure while it is being fixed.
#include "fuzz_options.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

namespace {

// Set once, before the first input (LLVMFuzzerInitialize).
pool_model::RunOptions fuzz_options = pool_fuzz::run_options();

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* value = std::getenv("STREAMPOOL_MODEL_WITHOUT");
  const std::string list = value != nullptr ? value : "";
  for (std::size_t at = 0; at < list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) fuzz_options.without.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const pool_model::RunResult result =
      pool_model::run_bytes(std::span<const std::uint8_t>(data, size), fuzz_options);
  if (!result.failure) return 0;
  // The last operations, the failure, and how to replay it in the test suite.
  std::fputs(fmt::format("\n== model failure: {}: {}\n{}\nreplay: STREAMPOOL_MODEL_BYTES={} "
                         "STREAMPOOL_MODEL_STEPS={} build/test/streampool_tests "
                         "\"random operations on the pool*\"\n",
                         result.failure->kind, result.failure->what,
                         pool_model::describe(result, 40), pool_model::to_hex(result.bytes),
                         pool_fuzz::fuzz_max_steps)
                 .c_str(),
             stderr);
  std::abort();
}
