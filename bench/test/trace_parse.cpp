// parse_trace: what a well-formed trace becomes in memory.
#include "trace_helpers.hpp"

#include <catch2/catch.hpp>

using namespace streampool::bench;
using streampool::bench::testing::parse;
using Kind = TraceEvent::Kind;

TEST_CASE("A trace in RMM's vocabulary becomes allocations and frees in file order", "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "7,10,allocate,0x1000,256,0x0\n"
      "7,11,allocate,0x2000,512,0x0\n"
      "7,12,free,0x1000,256,0x0\n"
      "7,13,free,0x2000,512,0x0\n",
      "rmm");

  SECTION("every line is an event, in order, with its kind and time") {
    REQUIRE(trace.name == "rmm");
    REQUIRE(trace.events.size() == 4);
    CHECK(trace.events[0].kind == Kind::alloc);
    CHECK(trace.events[1].kind == Kind::alloc);
    CHECK(trace.events[2].kind == Kind::free);
    CHECK(trace.events[3].kind == Kind::free);
    for (std::size_t i = 0; i < 4; ++i) CHECK(trace.events[i].time_us == 10 + i);
  }
  SECTION("allocations are numbered in order, and every free names the allocation it ends") {
    CHECK(trace.allocations == 2);
    CHECK(trace.events[0].allocation == 0);
    CHECK(trace.events[1].allocation == 1);
    CHECK(trace.events[2].allocation == 0);
    CHECK(trace.events[3].allocation == 1);
  }
  SECTION("a free carries its allocation's size") {
    CHECK(trace.events[2].size == 256);
    CHECK(trace.events[3].size == 512);
  }
  SECTION("streams and threads become indices, and nothing is left live or unmatched") {
    CHECK(trace.streams == std::vector<std::uint64_t>{0});
    CHECK(trace.threads == std::vector<std::uint64_t>{7});
    for (const TraceEvent& e : trace.events) {
      CHECK(e.stream == 0);
      CHECK(e.thread == 0);
      CHECK(e.used_on == no_stream);
    }
    CHECK(trace.left_live == 0);
    CHECK(trace.unmatched_frees == 0);
    CHECK(trace.completed_frees == 0);
  }
}

TEST_CASE("A trace in PyTorch's vocabulary replays free_requested and counts free_completed",
          "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0,0,alloc,0x7fd465400000,3072,0x0\n"
      "0,5,alloc,0x7fd465400c00,3072,0x0\n"
      "0,9,free_requested,0x7fd465400000,3072,0x0\n"
      "0,9,free_completed,0x7fd465400000,3072,0x0\n");
  REQUIRE(trace.events.size() == 3);
  CHECK(trace.events[2].kind == Kind::free);
  CHECK(trace.events[2].allocation == 0);
  CHECK(trace.events[2].time_us == 9);
  CHECK(trace.completed_frees == 1);
  CHECK(trace.left_live == 1);
}

TEST_CASE("Columns are found by name, in any order, and extra columns are ignored", "[trace]") {
  const Trace trace = parse(
      "Size, stream ,Comment,Action,pointer,TIME,Thread\r\n"
      "64,0x5,first,allocate,0xa0,3,1\r\n"
      "64,0x5,second,free,0xa0,4,1\r\n");
  REQUIRE(trace.events.size() == 2);
  CHECK(trace.events[0].kind == Kind::alloc);
  CHECK(trace.events[0].size == 64);
  CHECK(trace.events[0].time_us == 3);
  CHECK(trace.events[1].kind == Kind::free);
  CHECK(trace.events[1].time_us == 4);
  CHECK(trace.streams == std::vector<std::uint64_t>{5});
  CHECK(trace.threads == std::vector<std::uint64_t>{1});
}

TEST_CASE("Pointers, streams and threads may be hexadecimal or decimal", "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0x10,1,allocate,4096,8,16\n"
      "16,2,free,0x1000,8,0x10\n");
  REQUIRE(trace.events.size() == 2);
  CHECK(trace.events[1].allocation == 0);
  CHECK(trace.streams == std::vector<std::uint64_t>{16});
  CHECK(trace.threads == std::vector<std::uint64_t>{16});
}

TEST_CASE("Time may be RMM's clock HH:MM:SS.ffffff, read as microseconds since midnight",
          "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,01:02:03.000004,allocate,0x100,8,0x0\n"
      "1,01:02:03.5,free,0x100,8,0x0\n");
  CHECK(trace.events[0].time_us == ((1 * 60 + 2) * 60 + 3) * 1'000'000ull + 4);
  CHECK(trace.events[1].time_us == ((1 * 60 + 2) * 60 + 3) * 1'000'000ull + 500'000);
}

TEST_CASE("A trace recorded mid-run drops the frees of blocks it never saw allocated, and counts "
          "them",
          "[trace]") {
  SECTION("in RMM's vocabulary") {
    const Trace trace = parse(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "0,1,free,0x900,100,0x0\n"
        "0,2,allocate,0x100,8,0x0\n"
        "0,3,free,0x800,100,0x0\n"
        "0,4,free,0x100,8,0x0\n");
    CHECK(trace.unmatched_frees == 2);
    REQUIRE(trace.events.size() == 2);
    CHECK(trace.events[0].kind == Kind::alloc);
    CHECK(trace.events[1].kind == Kind::free);
  }
  SECTION("in PyTorch's vocabulary, where their free_completed lines are counted as completions") {
    const Trace trace = parse(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "0,1,free_requested,0x900,100,0x0\n"
        "0,1,free_completed,0x900,100,0x0\n"
        "0,2,alloc,0x100,8,0x0\n");
    CHECK(trace.unmatched_frees == 1);
    CHECK(trace.completed_frees == 1);
    REQUIRE(trace.events.size() == 1);
    CHECK(trace.left_live == 1);
  }
  SECTION("a dropped free adds no stream or thread to the trace") {
    const Trace trace = parse(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "9,1,free,0x900,100,0x99\n"
        "0,2,allocate,0x100,8,0x0\n");
    CHECK(trace.streams == std::vector<std::uint64_t>{0});
    CHECK(trace.threads == std::vector<std::uint64_t>{0});
  }
}

TEST_CASE("Allocations never freed in the trace are counted as left live", "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0,1,allocate,0x100,8,0x0\n"
      "0,2,allocate,0x200,8,0x0\n"
      "0,3,allocate,0x300,8,0x0\n"
      "0,4,free,0x200,8,0x0\n");
  CHECK(trace.allocations == 3);
  CHECK(trace.left_live == 2);
}

TEST_CASE("A pointer freed and allocated again is a new allocation", "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0,1,allocate,0x100,8,0x0\n"
      "0,2,free,0x100,8,0x0\n"
      "0,3,allocate,0x100,16,0x0\n"
      "0,4,free,0x100,16,0x0\n");
  REQUIRE(trace.events.size() == 4);
  CHECK(trace.events[2].allocation == 1);
  CHECK(trace.events[3].allocation == 1);
  CHECK(trace.events[3].size == 16);
}

TEST_CASE("Streams and threads are listed in order of first use", "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "3,1,allocate,0x100,8,0x30\n"
      "2,2,allocate,0x200,8,0x20\n"
      "3,3,allocate,0x300,8,0x30\n"
      "1,4,allocate,0x400,8,0x10\n");
  CHECK(trace.streams == std::vector<std::uint64_t>{0x30, 0x20, 0x10});
  CHECK(trace.threads == std::vector<std::uint64_t>{3, 2, 1});
  CHECK(trace.events[2].stream == 0);
  CHECK(trace.events[3].stream == 2);
  CHECK(trace.events[3].thread == 2);
}

TEST_CASE("Blank lines are skipped and line numbers still count them", "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "\n"
      "0,1,allocate,0x100,8,0x0\n"
      "\n");
  CHECK(trace.events.size() == 1);
  CHECK_THROWS_WITH(parse("Thread,Time,Action,Pointer,Size,Stream\n\n0,1,bad,0x100,8,0x0\n"),
                    Catch::Matchers::StartsWith("t:3: "));
}

// Found in review (2026-12-06): a request of 0 bytes was parsed as an allocation, which the
// replay then counted as one the pool failed (no allocator hands out memory for 0 bytes), and the
// command exited with 1. Now such a request and its free are counted and left out: they change
// no figure, and CUDA's allocators give every one of them the same null pointer.
TEST_CASE("A request of no bytes, and its free, are counted and left out of the replay",
          "[trace]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0,1,allocate,0x0,0,0x0\n"
      "0,2,allocate,0x0,0,0x0\n"
      "0,3,allocate,0x100,8,0x0\n"
      "0,4,free,0x0,0,0x0\n"
      "0,5,free,0x100,8,0x0\n"
      "0,6,free,0x0,0,0x0\n");
  CHECK(trace.empty_allocations == 2);
  CHECK(trace.unmatched_frees == 0);
  CHECK(trace.allocations == 1);
  REQUIRE(trace.events.size() == 2);
  CHECK(trace.events[0].size == 8);
  CHECK(trace.left_live == 0);
  SECTION("a free of a live allocation with Size 0 is still an error") {
    CHECK_THROWS_AS(parse("Thread,Time,Action,Pointer,Size,Stream\n"
                          "0,1,allocate,0x100,8,0x0\n"
                          "0,2,free,0x100,0,0x0\n"),
                    TraceError);
  }
}

// Found in review of the change above (2026-12-06): a free of Size 0 returned before the double
// free check and before any count, so a double free with Size 0 passed, and a Size 0 free of a
// pointer the trace never allocated was counted nowhere.
TEST_CASE("A free of Size 0 pairs with a request of no bytes, or is a double or unmatched free",
          "[trace]") {
  SECTION("a double free is an error whatever its Size") {
    CHECK_THROWS_AS(parse("Thread,Time,Action,Pointer,Size,Stream\n"
                          "0,1,allocate,0x100,8,0x0\n"
                          "0,2,free,0x100,8,0x0\n"
                          "0,3,free,0x100,0,0x0\n"),
                    TraceError);
  }
  SECTION("with no request of no bytes to pair with, it is an unmatched free") {
    const Trace trace = parse(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "0,1,allocate,0x100,8,0x0\n"
        "0,2,free,0x2000,0,0x0\n"
        "0,3,free,0x100,8,0x0\n");
    CHECK(trace.unmatched_frees == 1);
    CHECK(trace.empty_allocations == 0);
  }
}
