// used_on: the stream use a trace shows beyond the allocating stream, which the replay turns
// into record_stream.
#include "trace_helpers.hpp"

#include <catch2/catch.hpp>

using namespace streampool::bench;
using streampool::bench::testing::parse;

namespace {
const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
}  // namespace

TEST_CASE("An RMM free on another stream keeps the allocation's stream and names the other in "
          "used_on",
          "[trace][streams]") {
  const Trace trace = parse(header +
                            "0,1,allocate,0x100,8,0xa\n"
                            "0,2,allocate,0x200,8,0xb\n"
                            "0,3,free,0x100,8,0xb\n"
                            "0,4,free,0x200,8,0xb\n");
  REQUIRE(trace.streams == std::vector<std::uint64_t>{0xa, 0xb});
  CHECK(trace.events[2].stream == 0);
  CHECK(trace.events[2].used_on == 1);
  CHECK(trace.events[3].stream == 1);
  CHECK(trace.events[3].used_on == no_stream);
}

TEST_CASE("A stream that only frees is listed among the trace's streams", "[trace][streams]") {
  const Trace trace = parse(header +
                            "0,1,allocate,0x100,8,0xa\n"
                            "0,2,free,0x100,8,0xc\n");
  CHECK(trace.streams == std::vector<std::uint64_t>{0xa, 0xc});
  CHECK(trace.events[1].used_on == 1);
}

TEST_CASE("In a PyTorch trace of two streams, a free completed only after other events was used "
          "on the other stream",
          "[trace][streams]") {
  SECTION("a completion delayed past other events sets used_on to the other stream") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,8,0xb\n"     // side stream
                              "0,2,alloc,0x200,8,0x0\n"     // compute stream
                              "0,3,free_requested,0x100,8,0xb\n"
                              "0,4,free_requested,0x200,8,0x0\n"
                              "0,4,free_completed,0x200,8,0x0\n"
                              "0,5,free_completed,0x100,8,0xb\n");
    REQUIRE(trace.streams == std::vector<std::uint64_t>{0xb, 0x0});
    REQUIRE(trace.events.size() == 4);
    CHECK(trace.events[2].stream == 0);
    CHECK(trace.events[2].used_on == 1);
    CHECK(trace.events[3].used_on == no_stream);  // completed at once
  }
  SECTION("a delayed free on the first stream gets the second, and the other way round") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,8,0x0\n"
                              "0,2,alloc,0x200,8,0xb\n"
                              "0,3,free_requested,0x100,8,0x0\n"
                              "0,4,alloc,0x300,8,0x0\n"
                              "0,5,free_completed,0x100,8,0x0\n");
    CHECK(trace.events[2].used_on == 1);
  }
  SECTION("a free never completed, with events after it, was still in use on the other stream") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,8,0xb\n"
                              "0,2,alloc,0x200,8,0x0\n"
                              "0,3,free_requested,0x100,8,0xb\n"
                              "0,4,free_requested,0x200,8,0x0\n"
                              "0,4,free_completed,0x200,8,0x0\n");
    CHECK(trace.events[2].used_on == 1);
    CHECK(trace.events[3].used_on == no_stream);
  }
  SECTION("a free never completed as the trace's last line says nothing") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,8,0xb\n"
                              "0,2,alloc,0x200,8,0x0\n"
                              "0,3,free_requested,0x200,8,0x0\n"
                              "0,3,free_completed,0x200,8,0x0\n"
                              "0,4,free_requested,0x100,8,0xb\n");
    CHECK(trace.events[3].used_on == no_stream);
  }
  SECTION("a trace without free_completed lines says nothing of delays") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,8,0xb\n"
                              "0,2,alloc,0x200,8,0x0\n"
                              "0,3,free_requested,0x100,8,0xb\n"
                              "0,4,free_requested,0x200,8,0x0\n");
    CHECK(trace.events[2].used_on == no_stream);
    CHECK(trace.events[3].used_on == no_stream);
  }
}

TEST_CASE("With one stream or more than two, a delayed completion leaves used_on unset",
          "[trace][streams]") {
  SECTION("one stream") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,8,0x0\n"
                              "0,2,free_requested,0x100,8,0x0\n"
                              "0,3,alloc,0x200,8,0x0\n"
                              "0,4,free_completed,0x100,8,0x0\n");
    CHECK(trace.events[1].used_on == no_stream);
  }
  SECTION("three streams") {
    const Trace trace = parse(header +
                              "0,1,alloc,0x100,8,0xa\n"
                              "0,2,alloc,0x200,8,0xb\n"
                              "0,3,alloc,0x300,8,0xc\n"
                              "0,4,free_requested,0x100,8,0xa\n"
                              "0,5,alloc,0x400,8,0xa\n"
                              "0,6,free_completed,0x100,8,0xa\n");
    CHECK(trace.events[3].used_on == no_stream);
  }
}
