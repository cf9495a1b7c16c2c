// Trace::peak_requested: the high-water mark of live requested bytes.
#include "trace_helpers.hpp"

#include <catch2/catch.hpp>

using namespace streampool::bench;
using streampool::bench::testing::parse;

namespace {
const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
}  // namespace

TEST_CASE("peak_requested is the largest sum of live requested bytes at any point",
          "[trace][peak]") {
  SECTION("an empty trace peaks at zero") { CHECK(parse(header).peak_requested() == 0); }
  SECTION("the peak of a hand-computed sequence") {
    // live after each line: 100, 300, 200, 700, 200, 400, 900, 700, 500, 0
    const Trace trace = parse(header +
                              "0,1,allocate,0x100,100,0x0\n"
                              "0,2,allocate,0x200,200,0x0\n"
                              "0,3,free,0x100,100,0x0\n"
                              "0,4,allocate,0x300,500,0x1\n"
                              "0,5,free,0x300,500,0x1\n"
                              "0,6,allocate,0x400,200,0x0\n"
                              "0,7,allocate,0x500,500,0x0\n"
                              "0,8,free,0x200,200,0x0\n"
                              "0,9,free,0x400,200,0x0\n"
                              "0,10,free,0x500,500,0x0\n");
    CHECK(trace.peak_requested() == 900);
  }
  SECTION("frees of blocks allocated before recording began do not lower it") {
    const Trace trace = parse(header +
                              "0,1,allocate,0x100,100,0x0\n"
                              "0,2,free,0x900,1000,0x0\n"
                              "0,3,allocate,0x200,50,0x0\n");
    CHECK(trace.peak_requested() == 150);
  }
  SECTION("a PyTorch free counts when requested, whenever it completes") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,100,0x0\n"
                              "0,2,free_requested,0x100,100,0x0\n"
                              "0,3,alloc,0x200,60,0x0\n"
                              "0,4,free_completed,0x100,100,0x0\n");
    CHECK(trace.peak_requested() == 100);
  }
}
