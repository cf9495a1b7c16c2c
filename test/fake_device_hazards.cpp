// FakeDevice hazards: accesses to the same bytes from work that neither stream order, event waits
// nor completion orders are races; accesses outside live allocations are out of bounds.
#include "fake_helpers.hpp"

using namespace fake_test;

namespace {

// Two streams and a buffer, on a device that may or may not back it with host memory.
struct RaceFixture {
  explicit RaceFixture(bool host_backed = false) : device(options(host_backed)) {}

  static FakeDevice::Options options(bool host_backed) {
    FakeDevice::Options o;
    o.host_backed = host_backed;
    return o;
  }

  std::size_t races() const { return hazards_of(device, HazardKind::race).size(); }
  std::size_t out_of_bounds() const { return hazards_of(device, HazardKind::out_of_bounds).size(); }

  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  cudaStream_t c = device.create_stream();
  void* buffer = must_malloc(device, 1024);
};

}  // namespace

// --- races ------------------------------------------------------------------------------------

TEST_CASE("accesses to the same bytes on unordered streams race when one of them writes",
          "[fake][hazards]") {
  RaceFixture f(GENERATE(false, true));
  SECTION("a write, then a read") {
    f.device.launch(f.a, {write_of(f.buffer, 1024)});
    f.device.launch(f.b, {read_of(f.buffer, 1024)});
  }
  SECTION("a read, then a write") {
    f.device.launch(f.a, {read_of(f.buffer, 1024)});
    f.device.launch(f.b, {write_of(f.buffer, 1024)});
  }
  SECTION("two writes") {
    f.device.launch(f.a, {write_of(f.buffer, 1024)});
    f.device.launch(f.b, {write_of(f.buffer, 1024)});
  }
  REQUIRE(f.races() == 1);
  REQUIRE(f.device.hazards().size() == 1);
}

TEST_CASE("a race names both streams and the bytes the accesses share", "[fake][hazards]") {
  RaceFixture f;
  f.device.launch(f.a, {write_of(f.buffer, 512)});
  f.device.launch(f.b, {read_of(offset(f.buffer, 256), 512)});
  const auto races = hazards_of(f.device, HazardKind::race);
  REQUIRE(races.size() == 1);
  const std::string& what = races[0].what;
  REQUIRE_THAT(what, Catch::Contains(fmt::format("stream {} (id {})", fmt::ptr(f.a),
                                                 id_of(f.device, f.a))));
  REQUIRE_THAT(what, Catch::Contains(fmt::format("stream {} (id {})", fmt::ptr(f.b),
                                                 id_of(f.device, f.b))));
  REQUIRE_THAT(what, Catch::Contains(fmt::format("[{}, {})", hex(address(f.buffer) + 256),
                                                 hex(address(f.buffer) + 512))));
}

TEST_CASE("an access races once with each unordered earlier access, over all the bytes they share",
          "[fake][hazards]") {
  RaceFixture f;
  f.device.launch(f.a, {write_of(f.buffer, 1024)});
  f.device.launch(f.b, {read_of(offset(f.buffer, 256), 256)});  // cuts the range in three
  f.device.clear_hazards();
  f.device.launch(f.c, {write_of(f.buffer, 1024)});
  const auto races = hazards_of(f.device, HazardKind::race);
  REQUIRE(races.size() == 2);  // one with a's write, one with b's read
  const std::string whole = fmt::format("[{}, {})", hex(address(f.buffer)),
                                        hex(address(f.buffer) + 1024));
  const std::string middle = fmt::format("[{}, {})", hex(address(f.buffer) + 256),
                                         hex(address(f.buffer) + 512));
  const bool write_first = races[0].what.find(whole) != std::string::npos;
  REQUIRE_THAT(races[write_first ? 0 : 1].what, Catch::Contains(whole));
  REQUIRE_THAT(races[write_first ? 1 : 0].what, Catch::Contains(middle));
}

TEST_CASE("a write races with each unordered read before it, one hazard per read",
          "[fake][hazards]") {
  RaceFixture f;
  f.device.launch(f.a, {read_of(f.buffer, 1024)});
  f.device.launch(f.b, {read_of(f.buffer, 1024)});
  REQUIRE(f.races() == 0);
  f.device.launch(f.c, {write_of(f.buffer, 1024)});
  REQUIRE(f.races() == 2);
}

TEST_CASE("accesses that cannot conflict never race", "[fake][hazards]") {
  RaceFixture f;
  SECTION("reads on different streams") {
    f.device.launch(f.a, {read_of(f.buffer, 1024)});
    f.device.launch(f.b, {read_of(f.buffer, 1024)});
  }
  SECTION("writes on the same stream") {
    f.device.launch(f.a, {write_of(f.buffer, 1024)});
    f.device.launch(f.a, {read_of(f.buffer, 1024), write_of(f.buffer, 1024)});
  }
  SECTION("writes to disjoint bytes on different streams") {
    f.device.launch(f.a, {write_of(f.buffer, 512)});
    f.device.launch(f.b, {write_of(offset(f.buffer, 512), 512)});
  }
  REQUIRE(f.device.hazards().empty());
}

TEST_CASE("an event wait orders the waiting stream's later work after the work the event covers",
          "[fake][hazards]") {
  RaceFixture f;
  f.device.launch(f.a, {write_of(f.buffer, 1024)});

  SECTION("a wait on an event recorded after the write suppresses the race") {
    order_after(f.device, f.b, f.a);
    f.device.launch(f.b, {read_of(f.buffer, 1024)});
    REQUIRE(f.races() == 0);
  }
  SECTION("the order is transitive through a chain of waits") {
    order_after(f.device, f.b, f.a);
    order_after(f.device, f.c, f.b);
    f.device.launch(f.c, {write_of(f.buffer, 1024)});
    REQUIRE(f.races() == 0);
  }
  SECTION("a wait on an event recorded before the write does not order it") {
    cudaStream_t d = f.device.create_stream();
    void* other = must_malloc(f.device, 256);
    f.device.launch(d, {write_of(other, 256)});
    cudaEvent_t early = recorded_event(f.device, d);
    f.device.launch(d, {write_of(other, 256)});
    REQUIRE(f.device.stream_wait_event(f.b, early) == cudaSuccess);
    f.device.launch(f.b, {read_of(other, 256)});
    REQUIRE(f.races() == 1);
    REQUIRE(f.device.event_destroy(early) == cudaSuccess);
  }
  SECTION("a wait orders only the waiting stream, not a third one") {
    order_after(f.device, f.b, f.a);
    f.device.launch(f.c, {read_of(f.buffer, 1024)});
    REQUIRE(f.races() == 1);
  }
}

TEST_CASE("work that completed before the later access was launched never races",
          "[fake][hazards]") {
  RaceFixture f;
  f.device.launch(f.a, {write_of(f.buffer, 1024)});
  SECTION("completed by complete") { f.device.complete(f.a); }
  SECTION("completed by stream_synchronize") {
    REQUIRE(f.device.stream_synchronize(f.a) == cudaSuccess);
  }
  SECTION("completed at launch, with auto-complete") {
    f.device.set_auto_complete(true);
    f.device.launch(f.a, {write_of(f.buffer, 1024)});
  }
  f.device.launch(f.b, {write_of(f.buffer, 1024)});
  REQUIRE(f.device.hazards().empty());
}

TEST_CASE("a graph's replays are race-checked like ordinary work", "[fake][hazards]") {
  RaceFixture f;
  REQUIRE(f.device.begin_capture(f.a, CaptureMode::global) == cudaSuccess);
  f.device.launch(f.a, {write_of(f.buffer, 1024)});
  cudaGraph_t graph = nullptr;
  REQUIRE(f.device.end_capture(f.a, &graph) == cudaSuccess);
  REQUIRE(f.races() == 0);  // captured work touches nothing until it runs
  cudaGraphExec_t exec = nullptr;
  REQUIRE(f.device.graph_instantiate(&exec, graph) == cudaSuccess);

  REQUIRE(f.device.graph_launch(exec, f.b) == cudaSuccess);
  REQUIRE(f.device.graph_launch(exec, f.b) == cudaSuccess);
  REQUIRE(f.races() == 0);  // one stream orders its replays
  SECTION("a replay on another stream races with the pending one") {
    REQUIRE(f.device.graph_launch(exec, f.c) == cudaSuccess);
    REQUIRE(f.races() == 1);
  }
  SECTION("a replay on a stream that waited for the pending one does not race") {
    order_after(f.device, f.c, f.b);
    REQUIRE(f.device.graph_launch(exec, f.c) == cudaSuccess);
    REQUIRE(f.races() == 0);
  }
  SECTION("a replay touching freed memory is out of bounds") {
    f.device.complete_all();
    REQUIRE(f.device.free(f.buffer) == cudaSuccess);
    REQUIRE(f.device.graph_launch(exec, f.c) == cudaSuccess);
    REQUIRE(f.out_of_bounds() == 1);
  }
  REQUIRE(f.device.graph_exec_destroy(exec) == cudaSuccess);
  REQUIRE(f.device.graph_destroy(graph) == cudaSuccess);
}

TEST_CASE("clear_hazards forgets the hazards seen so far", "[fake][hazards]") {
  RaceFixture f;
  f.device.launch(f.a, {write_of(f.buffer, 1024)});
  f.device.launch(f.b, {write_of(f.buffer, 1024)});
  REQUIRE(f.device.hazards().size() == 1);
  f.device.clear_hazards();
  REQUIRE(f.device.hazards().empty());
}

// --- out of bounds ----------------------------------------------------------------------------

TEST_CASE("an access not inside one live allocation is out of bounds", "[fake][hazards]") {
  RaceFixture f(GENERATE(false, true));
  SECTION("memory already freed") {
    void* freed = must_malloc(f.device, 256);
    REQUIRE(f.device.free(freed) == cudaSuccess);
    f.device.launch(f.a, {read_of(freed, 256)});
  }
  SECTION("bytes past the end of the allocation") {
    f.device.launch(f.a, {write_of(offset(f.buffer, 1000), 25)});
  }
  SECTION("memory never allocated") {
    int on_host = 0;
    f.device.launch(f.a, {write_of(&on_host, sizeof on_host)});
  }
  const auto hazards = hazards_of(f.device, HazardKind::out_of_bounds);
  REQUIRE(hazards.size() == 1);
  REQUIRE_THAT(hazards[0].what, Catch::Contains(fmt::format("stream {} (id {})", fmt::ptr(f.a),
                                                            id_of(f.device, f.a))));
}

TEST_CASE("an access spanning two allocations, even adjacent ones, is out of bounds",
          "[fake][hazards]") {
  RaceFixture f;
  void* next = must_malloc(f.device, 1024);
  REQUIRE(address(next) == address(f.buffer) + 1024);  // the bump allocator packs them
  f.device.launch(f.a, {write_of(offset(f.buffer, 1000), 48)});
  REQUIRE(f.out_of_bounds() == 1);
}

TEST_CASE("an access inside a live allocation, up to its last byte, or of no bytes, is in "
          "bounds",
          "[fake][hazards]") {
  RaceFixture f;
  f.device.launch(f.a, {write_of(f.buffer, 1024), read_of(offset(f.buffer, 1023), 1)});
  f.device.launch(f.b, {write_of(nullptr, 0)});  // touches no byte: nothing to check
  REQUIRE(f.device.hazards().empty());
}

// --- memory unmapped under pending work ---------------------------------------------------------

TEST_CASE("unmapping memory that pending work uses is a hazard, and the work still runs",
          "[fake][hazards]") {
  const bool host_backed = GENERATE(false, true);
  CAPTURE(host_backed);
  RaceFixture f(host_backed);
  const std::size_t granule = std::size_t{2} << 20;
  void* base = nullptr;
  streampool::VmHandle handle = 0;
  REQUIRE(f.device.vm_reserve(&base, 2 * granule) == cudaSuccess);
  REQUIRE(f.device.vm_create(&handle, granule) == cudaSuccess);
  REQUIRE(f.device.vm_map(base, granule, handle) == cudaSuccess);
  REQUIRE(f.device.vm_set_access(base, granule, f.device.own_access()) == cudaSuccess);
  const bool reads = GENERATE(false, true);
  CAPTURE(reads);
  bool ran = false;
  const auto access = reads ? read_of(offset(base, 64), 64) : write_of(offset(base, 64), 64);
  f.device.launch(f.a, {access}, [&] {
    // What a kernel would do: touch the bytes (the fake's host memory, where it backs them).
    if (host_backed) {
      volatile unsigned char* byte = static_cast<unsigned char*>(base) + 64;
      *byte = static_cast<unsigned char>(*byte + 1);
    }
    ran = true;
  });
  const bool completed_first = GENERATE(false, true);
  CAPTURE(completed_first);
  if (completed_first) f.device.complete_all();
  // CUDA does not refuse the call: the pool must not make it while work uses the memory.
  REQUIRE(f.device.vm_unmap(base, granule) == cudaSuccess);
  f.device.complete_all();
  CHECK(ran);
  const auto hazards = hazards_of(f.device, HazardKind::unmapped_in_use);
  if (completed_first) {
    CHECK(f.device.hazards().empty());
  } else {
    REQUIRE(hazards.size() == 1);
    CHECK_THAT(hazards[0].what, Catch::Contains(reads ? "read" : "write"));
    CHECK_THAT(hazards[0].what, Catch::Contains(fmt::format("stream {} (id {})", fmt::ptr(f.a),
                                                            id_of(f.device, f.a))));
  }
  REQUIRE(f.device.vm_release(handle) == cudaSuccess);
  REQUIRE(f.device.vm_unreserve(base, 2 * granule) == cudaSuccess);
}

// On an H100 (test/gpu/probes.cpp, 2026-12-07) CUDA's capture-status query of a destroyed
// stream's handle crashed the process: the fake reports every device call that names one, and
// none once another stream has taken the handle.
TEST_CASE("a device call naming a destroyed stream's handle that no stream took since is a "
          "hazard",
          "[fake][hazards]") {
  FakeDevice device;
  cudaStream_t s = device.create_stream("gone");
  device.destroy_stream(s);
  CaptureStatus status = CaptureStatus::none;
  CHECK(device.capture_info(s, &status, nullptr) == cudaErrorInvalidResourceHandle);
  streampool::StreamId id = 0;
  CHECK(device.stream_id(s, &id) == cudaErrorInvalidResourceHandle);
  const auto hazards = hazards_of(device, HazardKind::destroyed_handle);
  REQUIRE(hazards.size() == 2);
  CHECK_THAT(hazards[0].what, Catch::Contains("cudaStreamGetCaptureInfo"));
  CHECK_THAT(hazards[1].what, Catch::Contains("cudaStreamGetId"));
  cudaStream_t reused = device.create_stream("new");
  REQUIRE(reused == s);
  CHECK(device.capture_info(reused, &status, nullptr) == cudaSuccess);
  CHECK(device.hazards().size() == 2);
}
