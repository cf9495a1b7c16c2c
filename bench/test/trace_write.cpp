// write_trace: RMM's vocabulary, read back by parse_trace as the same trace.
#include "trace_helpers.hpp"
#include "workloads.hpp"

#include <catch2/catch.hpp>

#include <set>
#include <sstream>

using namespace streampool::bench;
using namespace streampool::bench::testing;

TEST_CASE("write_trace writes RMM's columns and vocabulary", "[trace][write]") {
  const Trace trace = parse(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0,0,alloc,0x7fd465400000,3072,0x0\n"
      "0,9,free_requested,0x7fd465400000,3072,0x0\n"
      "0,9,free_completed,0x7fd465400000,3072,0x0\n");
  std::istringstream lines(write(trace));
  std::string line;
  std::getline(lines, line);
  CHECK(line == "Thread,Time,Action,Pointer,Size,Stream");
  std::getline(lines, line);
  CHECK_THAT(line, Catch::Matchers::StartsWith("0,0,allocate,0x") &&
                       Catch::Matchers::EndsWith(",3072,0x0"));
  std::getline(lines, line);
  CHECK_THAT(line, Catch::Matchers::StartsWith("0,9,free,0x") &&
                       Catch::Matchers::EndsWith(",3072,0x0"));
  CHECK_FALSE(std::getline(lines, line));
}

TEST_CASE("A written trace parses back into the same events, streams and threads",
          "[trace][write]") {
  SECTION("a trace with several threads, streams and a free used on another stream") {
    const Trace trace = parse(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "11,1,allocate,0x100,8,0xa\n"
        "12,2,allocate,0x200,16,0xb\n"
        "11,3,free,0x100,8,0xb\n"
        "12,4,allocate,0x100,32,0xa\n"
        "11,5,free,0x200,16,0xb\n");
    const Trace back = parse(write(trace));
    CHECK(same_events(back, trace));
    CHECK(back.streams == trace.streams);
    CHECK(back.threads == trace.threads);
    CHECK(back.left_live == 1);
  }
  SECTION("a PyTorch trace of two streams keeps its inferred stream use") {
    const Trace trace = parse(
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "0,1,alloc,0x100,8,0x0\n"
        "0,2,alloc,0x200,8,0xb\n"
        "0,3,free_requested,0x200,8,0xb\n"
        "0,4,alloc,0x300,8,0x0\n"
        "0,5,free_completed,0x200,8,0xb\n");
    REQUIRE(trace.events[2].used_on == 0);
    const Trace back = parse(write(trace));
    CHECK(same_events(back, trace));
    CHECK(back.streams == trace.streams);
  }
  SECTION("every embedded workload") {
    for (const std::string& name : workload_names()) {
      INFO(name);
      const Trace trace = make_workload(name, 3);
      const Trace back = parse(write(trace), name);
      CHECK(same_events(back, trace));
      CHECK(back.streams == trace.streams);
      CHECK(back.threads == trace.threads);
      CHECK(back.allocations == trace.allocations);
      CHECK(back.left_live == trace.left_live);
    }
  }
}

TEST_CASE("Written pointers are unique among the allocations live at once", "[trace][write]") {
  const Trace trace = make_workload("pipeline", 1);
  std::istringstream lines(write(trace));
  std::string line;
  std::getline(lines, line);
  std::set<std::string> live;
  while (std::getline(lines, line)) {
    const auto action = line.find(",allocate,");
    const bool allocate = action != std::string::npos;
    const auto start = line.find(allocate ? ",allocate," : ",free,") + (allocate ? 10 : 6);
    const std::string pointer = line.substr(start, line.find(',', start) - start);
    if (allocate) {
      CHECK(live.insert(pointer).second);
    } else {
      CHECK(live.erase(pointer) == 1);
    }
  }
  CHECK(live.empty());
}
