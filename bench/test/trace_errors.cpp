// parse_trace refuses what it cannot read: every error names the trace, the line and the fault.
#include "trace_helpers.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace streampool::bench;
using streampool::bench::testing::parse;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {
const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
const std::string good = "0,1,allocate,0x100,8,0x0\n";
}  // namespace

TEST_CASE("Every malformed line is an error naming the trace, its line number and the fault",
          "[trace][errors]") {
  SECTION("an empty text has no header line") {
    CHECK_THROWS_WITH(parse("", "run"), StartsWith("run:1: ") && Contains("header"));
  }
  SECTION("a header without one of the six columns names the missing column") {
    CHECK_THROWS_WITH(parse("Thread,Time,Action,Pointer,Size\n" + good),
                      StartsWith("t:1: ") && Contains("no Stream column"));
  }
  SECTION("a data line in place of the header is no header") {
    CHECK_THROWS_WITH(parse(good), StartsWith("t:1: ") && Contains("no Thread column"));
  }
  SECTION("a column named twice") {
    CHECK_THROWS_WITH(parse("Thread,Time,Action,Pointer,Size,Stream,Size\n"),
                      StartsWith("t:1: ") && Contains("Size twice"));
  }
  SECTION("a line with fewer fields than the header") {
    CHECK_THROWS_WITH(parse(header + good + "0,2,allocate,0x200,8\n"),
                      StartsWith("t:3: ") && Contains("5 fields where the header has 6"));
  }
  SECTION("a line with more fields than the header") {
    CHECK_THROWS_WITH(parse(header + good + "0,2,allocate,0x200,8,0x0\n" + "0,3,allocate,0x300,8,0x0,9\n"),
                      StartsWith("t:4: ") && Contains("7 fields"));
  }
  SECTION("a pointer that is no number") {
    CHECK_THROWS_WITH(parse(header + "0,1,allocate,0xzz,8,0x0\n"),
                      StartsWith("t:2: ") && Contains("bad Pointer '0xzz'"));
  }
  SECTION("an empty field") {
    CHECK_THROWS_WITH(parse(header + "0,1,allocate,0x100,,0x0\n"),
                      StartsWith("t:2: ") && Contains("bad Size ''"));
  }
  SECTION("a size in hexadecimal, which Size does not allow") {
    CHECK_THROWS_WITH(parse(header + good + "0,1,allocate,0x200,0x10,0x0\n"),
                      StartsWith("t:3: ") && Contains("bad Size '0x10'"));
  }
  SECTION("a negative size") {
    CHECK_THROWS_WITH(parse(header + "0,1,allocate,0x100,-8,0x0\n"),
                      StartsWith("t:2: ") && Contains("bad Size '-8'"));
  }
  SECTION("a number too large for 64 bits") {
    CHECK_THROWS_WITH(parse(header + "0,1,allocate,0x100,18446744073709551616,0x0\n"),
                      StartsWith("t:2: ") && Contains("bad Size"));
  }
  SECTION("a stream that is no number") {
    CHECK_THROWS_WITH(parse(header + "0,1,allocate,0x100,8,default\n"),
                      StartsWith("t:2: ") && Contains("bad Stream 'default'"));
  }
  SECTION("a thread that is no number") {
    CHECK_THROWS_WITH(parse(header + "main,1,allocate,0x100,8,0x0\n"),
                      StartsWith("t:2: ") && Contains("bad Thread 'main'"));
  }
  SECTION("a time that is neither microseconds nor a clock") {
    CHECK_THROWS_WITH(parse(header + "0,1.5,allocate,0x100,8,0x0\n"),
                      StartsWith("t:2: ") && Contains("bad Time '1.5'"));
    CHECK_THROWS_WITH(parse(header + "0,25:00:00.0,allocate,0x100,8,0x0\n"),
                      StartsWith("t:2: ") && Contains("bad Time"));
  }
  SECTION("an unknown action, RMM's allocate failure included") {
    CHECK_THROWS_WITH(parse(header + good + "0,1,malloc,0x200,8,0x0\n"),
                      StartsWith("t:3: ") && Contains("unknown action 'malloc'"));
    CHECK_THROWS_WITH(parse(header + "0,1,allocate failure,0x0,8,0x0\n"),
                      StartsWith("t:2: ") && Contains("unknown action 'allocate failure'"));
  }
  SECTION("an action of the other vocabulary than the trace's first") {
    CHECK_THROWS_WITH(parse(header + good + "0,2,free_requested,0x100,8,0x0\n"),
                      StartsWith("t:3: ") && Contains("vocabulary of line 2"));
  }
  SECTION("an allocation of a pointer that is live names the line that allocated it") {
    CHECK_THROWS_WITH(parse(header + good + "0,2,allocate,0x200,8,0x0\n" +
                            "0,3,allocate,0x100,16,0x0\n"),
                      StartsWith("t:4: ") && Contains("0x100") && Contains("line 2"));
  }
  SECTION("a free whose size is not its allocation's") {
    CHECK_THROWS_WITH(parse(header + good + "0,2,free,0x100,9,0x0\n"),
                      StartsWith("t:3: ") && Contains("Size 9") && Contains("Size 8 at line 2"));
  }
  SECTION("a free_completed before its free_requested") {
    CHECK_THROWS_WITH(parse(header + "0,1,alloc,0x100,8,0x0\n0,2,free_completed,0x100,8,0x0\n"),
                      StartsWith("t:3: ") && Contains("before its free_requested"));
  }
}

// Found in review (2026-12-05). A free of a pointer the trace allocated and already freed was
// counted as a free of a block allocated before recording began, where it is a double free.
TEST_CASE("A second free of a pointer the trace allocated and freed is an error",
          "[trace][errors]") {
  SECTION("RMM's vocabulary") {
    CHECK_THROWS_WITH(parse(header + good + "0,2,free,0x100,8,0x0\n" + "0,3,free,0x100,8,0x0\n"),
                      StartsWith("t:4: ") && Contains("0x100") && Contains("line 3"));
  }
  SECTION("PyTorch's vocabulary") {
    CHECK_THROWS_WITH(parse(header + "0,1,alloc,0x100,8,0x0\n" +
                            "0,2,free_requested,0x100,8,0x0\n" +
                            "0,3,free_completed,0x100,8,0x0\n" +
                            "0,4,free_requested,0x100,8,0x0\n"),
                      StartsWith("t:5: ") && Contains("0x100"));
  }
  SECTION("allocated again in between, the pointer's frees are one each") {
    const Trace trace = parse(header + good + "0,2,free,0x100,8,0x0\n" + good +
                              "0,4,free,0x100,8,0x0\n" + "0,5,free,0x999,8,0x0\n");
    CHECK(trace.allocations == 2);
    CHECK(trace.unmatched_frees == 1);  // 0x999: allocated before recording began
  }
}

// Found in review (2026-12-05). Sizes were any 64-bit number, and the replay and
// Trace::peak_requested sum live sizes in 63 and 64 bits: a size of 2^63 counted as negative in
// the replay, and two of them made the peak wrap around.
TEST_CASE("Live allocations that would hold more than 2^63 - 1 bytes are an error",
          "[trace][errors]") {
  const std::string half = "4611686018427387904";  // 2^62
  CHECK_THROWS_WITH(parse(header + "0,1,allocate,0x100,9223372036854775808,0x0\n"),
                    StartsWith("t:2: ") && Contains("2^63"));
  CHECK_THROWS_WITH(parse(header + "0,1,allocate,0x100," + half + ",0x0\n" +
                          "0,2,allocate,0x200," + half + ",0x0\n"),
                    StartsWith("t:3: ") && Contains("2^63"));
  // Freed in between, they are never live together.
  const Trace trace = parse(header + "0,1,allocate,0x100," + half + ",0x0\n" +
                            "0,2,free,0x100," + half + ",0x0\n" +
                            "0,3,allocate,0x200," + half + ",0x0\n");
  CHECK(trace.peak_requested() == std::uint64_t{1} << 62);
}
