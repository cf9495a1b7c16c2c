// Allocation during capture: served from the CapturePool's private memory, pinned to it, never by
// a call CUDA refuses in the capture's mode.
#include "fake_helpers.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>

#include <optional>
#include <thread>

using streampool::CaptureMode;
using streampool::CapturePool;
using streampool::CaptureStatus;
using fake_test::capture_status;
using streampool::Errc;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;
using streampool::CapturedGraph;
using HazardKind = FakeDevice::Hazard::Kind;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

const CaptureMode all_modes[] = {CaptureMode::global, CaptureMode::thread_local_,
                                 CaptureMode::relaxed};
}  // namespace

namespace {
// Counts the capture status questions, with and without the capture's id, and the id questions.
// With `active_once`, the next status asked alone is "active": a capture that ended between that
// question and the next.
class StatusCounter final : public streampool::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  cudaError_t capture_info(cudaStream_t stream, CaptureStatus* status,
                           streampool::CaptureId* id) noexcept override {
    ++(id == nullptr ? alone : with_id);
    if (id == nullptr && active_once) {
      active_once = false;
      *status = CaptureStatus::active;
      return cudaSuccess;
    }
    return ForwardingDevice::capture_info(stream, status, id);
  }
  cudaError_t stream_id(cudaStream_t stream, streampool::StreamId* id) noexcept override {
    ++ids;
    return ForwardingDevice::stream_id(stream, id);
  }
  bool active_once = false;
  int alone = 0;
  int with_id = 0;
  int ids = 0;
};

streampool::PoolOptions every_check() {
  auto options = test_options();
  options.stream_checks = streampool::StreamChecks::full;
  return options;
}

// A pool with every stream check on the fake device, through a StatusCounter, and a stream.
struct CountedPool {
  std::shared_ptr<FakeDevice> fake = std::make_shared<FakeDevice>();
  std::shared_ptr<StatusCounter> device = std::make_shared<StatusCounter>(fake);
  streampool::MemoryPool pool{device, every_check()};
  cudaStream_t s = fake->create_stream();
};

// Completes the graph releases still queued when it goes out of scope, even when an assertion
// ends the test early (see capture_lifetime.cpp).
struct CompleteAtExit {
  CompleteAtExit() = default;
  CompleteAtExit(const CompleteAtExit&) = delete;
  CompleteAtExit& operator=(const CompleteAtExit&) = delete;
  ~CompleteAtExit() { streampool::complete_graph_releases(); }
};
}  // namespace

TEST_CASE("a checked allocation asks the capture status alone, and the capture's id only during "
          "a capture") {
  // The status alone is the cheaper question on the H200 (device_calls.def); the gate needs the
  // id only when there is a capture to serve.
  CountedPool counted;
  auto& [fake, device, pool, s] = counted;
  for (int i = 0; i < 3; ++i) {
    for (std::size_t bytes : {std::size_t{1000}, 3 * MiB}) {
      auto x = Bytes::alloc_async(pool, bytes, s);
    }
  }
  CHECK(device->alone == 6);
  CHECK(device->with_id == 0);

  auto capture = std::make_shared<CapturePool>(pool);
  capture->reserve(MiB);
  streampool::begin_capture_with_pool(capture, s, CaptureMode::global);
  const int alone_before = device->alone;
  const int with_id_before = device->with_id;
  {
    auto x = Bytes::alloc_async(pool, 1000, s);
    CHECK(x.data() != nullptr);
    fake->launch(s, {{x.data(), x.byte_size(), true}});
  }
  CHECK(device->alone > alone_before);
  CHECK(device->with_id > with_id_before);  // the gate found the capture by its id
  auto graph = streampool::end_capture_with_pool(s, capture);
  graph.launch(s);
  fake->complete_all();
  CHECK(fake->hazards().empty());
}

TEST_CASE("a checked allocation whose capture ended between the two status questions asks "
          "nothing again") {
  // As ask_id does: the second answer stands, and the id is asked next. Asking the status again
  // would be a call more, which a fault could fail or a new capture could answer otherwise.
  CountedPool counted;
  auto& [fake, device, pool, s] = counted;
  { auto warm = Bytes::alloc_async(pool, 1000, s); }
  device->alone = device->with_id = device->ids = 0;
  device->active_once = true;
  auto x = Bytes::alloc_async(pool, 1000, s);  // no gate: a gated allocation would throw
  CHECK(x.data() != nullptr);
  CHECK(device->alone == 1);
  CHECK(device->with_id == 1);
  CHECK(device->ids == 1);
}

TEST_CASE("an allocation during capture comes from the pool's private memory, under every "
          "stream check") {
  using streampool::StreamChecks;
  for (StreamChecks checks : {StreamChecks::none, StreamChecks::identity, StreamChecks::full})
  for (CaptureMode mode : all_modes) {
    CAPTURE(static_cast<int>(mode), static_cast<int>(checks));
    auto options = test_options();
    options.stream_checks = checks;
    PoolOnFake pool(options);
    FakeDevice& fake = pool.fake();
    cudaStream_t s = fake.create_stream();
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(MiB);
    const std::size_t free_before = capture->free_bytes();
    const auto mallocs_before = fake.calls(FakeDevice::Call::malloc);

    streampool::begin_capture_with_pool(capture, s, mode);
    auto x = Bytes::alloc_async(*pool, 1000, s);
    REQUIRE(capture->free_bytes() == free_before - 1024);
    fake.launch(s, {{x.data(), x.byte_size(), true}});
    auto graph = streampool::end_capture_with_pool(s, capture);
    REQUIRE(capture_status(fake, s) == CaptureStatus::none);
    REQUIRE(fake.calls(FakeDevice::Call::malloc) == mallocs_before);  // private memory only

    SECTION("the block stays pinned after the capture: a drop returns it to the pool") {
      void* pinned = x.data();
      x.reset();
      REQUIRE(capture->free_bytes() == free_before);
      auto shared = Bytes::alloc_async(*pool, 1000, s);  // not capturing: the shared cache
      REQUIRE(static_cast<void*>(shared.data()) != pinned);
    }
    graph.launch(s);
    fake.complete_all();
    REQUIRE(fake.hazards().empty());
  }
}

TEST_CASE("a drop during capture is reusable later in the same capture on the same stream") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t other = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  streampool::begin_capture_with_pool(capture, s);
  void* first = nullptr;
  {
    auto x = Bytes::alloc_async(*pool, 4096, s);
    fake.launch(s, {{x.data(), x.byte_size(), true}});
    first = x.data();
  }
  auto y = Bytes::alloc_async(*pool, 4096, s);
  REQUIRE(static_cast<void*>(y.data()) == first);
  fake.launch(s, {{y.data(), y.byte_size(), true}});
  auto graph = streampool::end_capture_with_pool(s, capture);
  REQUIRE(graph.valid());
  y.reset();
  (void)other;
  graph.launch(s);
  fake.complete_all();
  REQUIRE(fake.hazards().empty());
}

TEST_CASE("past the reservation, an allocation during capture fails and the capture survives") {
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_}) {
    PoolOnFake pool;
    FakeDevice& fake = pool.fake();
    cudaStream_t s = fake.create_stream();
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(MiB);
    streampool::begin_capture_with_pool(capture, s, mode);
    auto fits = Bytes::alloc_async(*pool, MiB / 2, s);
    std::error_code error;
    auto refused = Bytes::try_alloc_async(*pool, MiB, s, error);
    REQUIRE(refused.is_empty());
    REQUIRE(error == Errc::capture_pool_exhausted);
    REQUIRE_THROWS_AS(Bytes::alloc_async(*pool, MiB, s), streampool::Error);
    REQUIRE(capture_status(fake, s) == CaptureStatus::active);
    REQUIRE(fake.calls(FakeDevice::Call::malloc) == 1);  // the reservation, before the capture
    REQUIRE_NOTHROW(streampool::end_capture_with_pool(s, capture));
  }
}

TEST_CASE("in relaxed mode the pool grows during capture") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s, CaptureMode::relaxed);
  auto x = Bytes::alloc_async(*pool, 3 * MiB, s);
  REQUIRE(capture->reserved_bytes() >= 3 * MiB);
  REQUIRE(capture_status(fake, s) == CaptureStatus::active);
  REQUIRE_NOTHROW(streampool::end_capture_with_pool(s, capture));
}

TEST_CASE("with expandable segments a CapturePool grows during a capture of every mode, by "
          "mapping into the pool's reservation") {
  for (CaptureMode mode : all_modes) {
    CAPTURE(static_cast<int>(mode));
    auto options = test_options();
    options.expandable_segments = true;
    PoolOnFake pool(options);
    FakeDevice& fake = pool.fake();
    cudaStream_t s = fake.create_stream();
    {
      auto first = Bytes::alloc_async(*pool, 3 * MiB, s);  // the reservation, before the capture
    }
    const auto reservations = fake.calls(FakeDevice::Call::vm_reserve);
    const auto created = fake.calls(FakeDevice::Call::vm_create);
    auto capture = std::make_shared<CapturePool>(*pool);  // nothing reserved
    streampool::begin_capture_with_pool(capture, s, mode);
    std::vector<Bytes> buffers;
    for (int i = 0; i < 3; ++i) {
      buffers.push_back(Bytes::alloc_async(*pool, 5 * MiB, s));
      fake.launch(s, {{buffers.back().data(), buffers.back().byte_size(), true}});
    }
    CHECK(capture->reserved_bytes() >= 15 * MiB);
    CHECK(fake.calls(FakeDevice::Call::vm_create) > created);  // mapped during the capture
    CHECK(fake.calls(FakeDevice::Call::vm_reserve) == reservations);
    CHECK(fake.calls(FakeDevice::Call::malloc) == 0);
    REQUIRE(capture_status(fake, s) == CaptureStatus::active);
    buffers.clear();
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
    REQUIRE(graph.valid());
    graph.launch(s);  // the captured writes run, each checked against the live allocations
    graph.launch(s);
    fake.complete_all();
    CHECK(fake.hazards().empty());
  }
}

TEST_CASE("during a capture that forbids cudaMalloc, a pool that holds no reservation makes "
          "none: the CapturePool is exhausted and the capture survives") {
  for (const bool trimmed : {false, true})
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_}) {
    CAPTURE(trimmed, static_cast<int>(mode));
    auto options = test_options();
    options.expandable_segments = true;
    PoolOnFake pool(options);
    FakeDevice& fake = pool.fake();
    cudaStream_t s = fake.create_stream();
    if (trimmed) {  // it grew, and trim gave the empty reservation back
      Bytes::alloc_async(*pool, 3 * MiB, s).reset();
      fake.complete_all();
      pool->trim(0);
      REQUIRE(fake.live_reservations() == 0);
    }
    const auto reservations = fake.calls(FakeDevice::Call::vm_reserve);
    const auto queries = fake.calls(FakeDevice::Call::vm_granularity);
    auto capture = std::make_shared<CapturePool>(*pool);
    streampool::begin_capture_with_pool(capture, s, mode);
    std::error_code error;
    auto refused = Bytes::try_alloc_async(*pool, 3 * MiB, s, error);
    CHECK(refused.is_empty());
    CHECK(error == Errc::capture_pool_exhausted);
    CHECK(fake.calls(FakeDevice::Call::vm_reserve) == reservations);
    CHECK(fake.calls(FakeDevice::Call::vm_granularity) == queries);
    CHECK(fake.calls(FakeDevice::Call::malloc) == 0);
    REQUIRE(capture_status(fake, s) == CaptureStatus::active);
    REQUIRE_NOTHROW(streampool::end_capture_with_pool(s, capture));
  }
}

TEST_CASE("a sealed pool refuses allocations during capture, and the error reaches the caller") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  capture->seal();
  REQUIRE(capture->is_capture_pool_sealed());
  streampool::begin_capture_with_pool(capture, s);
  try {
    Bytes::alloc_async(*pool, 100, s);
    FAIL("allocated from a sealed pool");
  } catch (const streampool::Error& e) {
    REQUIRE(e.errc() == Errc::capture_pool_sealed);
  }
  capture->unseal();
  REQUIRE_FALSE(capture->is_capture_pool_sealed());
  auto x = Bytes::alloc_async(*pool, 100, s);
  REQUIRE(capture_status(fake, s) == CaptureStatus::active);
  REQUIRE_NOTHROW(streampool::end_capture_with_pool(s, capture));
}

TEST_CASE("an allocation on a stream captured without a pool fails with capture_without_pool; "
          "under full checks the capture is untouched") {
  using streampool::StreamChecks;
  for (StreamChecks checks : {StreamChecks::identity, StreamChecks::full}) {
    CAPTURE(static_cast<int>(checks));
    auto options = test_options();
    options.stream_checks = checks;
    PoolOnFake pool(options);
    FakeDevice& fake = pool.fake();
    cudaStream_t s = fake.create_stream();
    Bytes::alloc_async(*pool, 1000, s).reset();  // cached on s
    const auto before = pool->stats();
    REQUIRE(fake.begin_capture(s, CaptureMode::global) == cudaSuccess);
    // A size never cached (every mode catches a miss); and, under full checks, a cached one.
    std::vector<std::size_t> sizes{std::size_t{3} << 20};
    if (checks == StreamChecks::full) sizes.push_back(1000);
    for (std::size_t bytes : sizes) {
      std::error_code error;
      auto x = Bytes::try_alloc_async(*pool, bytes, s, error);
      REQUIRE(x.is_empty());
      REQUIRE(error == Errc::capture_without_pool);
    }
    cudaGraph_t graph = nullptr;
    if (checks == StreamChecks::full) {
      REQUIRE(capture_status(fake, s) == CaptureStatus::active);  // the capture is untouched
      REQUIRE(fake.end_capture(s, &graph) == cudaSuccess);
      fake.graph_destroy(graph);
    } else {
      // As documented: asking a capturing stream's id invalidates the capture (CUDA does so).
      REQUIRE(capture_status(fake, s) == CaptureStatus::invalidated);
      REQUIRE(fake.end_capture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    }
    REQUIRE(pool->stats().live_allocations.current == before.live_allocations.current);
    REQUIRE(pool->stats().reserved_bytes.current == before.reserved_bytes.current);
  }
}

TEST_CASE("no call CUDA refuses is made during capture, in any mode, even from other threads") {
  for (const bool expandable : {false, true})
  for (CaptureMode mode : all_modes) {
    CAPTURE(expandable, static_cast<int>(mode));
    auto options = test_options();
    options.expandable_segments = expandable;  // then the other thread grows by mapping
    options.fence_every_free = true;  // fences on every drop: they must avoid the capture
    PoolOnFake pool(options);
    FakeDevice& fake = pool.fake();
    cudaStream_t s = fake.create_stream();
    cudaStream_t elsewhere = fake.create_stream();
    auto before_capture = Bytes::alloc_async(*pool, 5000, s);
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(2 * MiB);

    streampool::begin_capture_with_pool(capture, s, mode);
    for (int i = 0; i < 20; ++i) {
      auto x = Bytes::alloc_async(*pool, 1000 + 5000 * i, s);
      fake.launch(s, {{x.data(), x.byte_size(), true}});
    }
    before_capture.reset();  // a shared block dropped during capture: adopted, no fence
    // Another thread works with the pool meanwhile, on a stream that is not captured. (Catch's
    // assertions are not for other threads: it records the errors, asserted after the join.)
    std::vector<std::error_code> errors;
    std::thread([&] {
      std::error_code error;
      for (int i = 0; i < 20; ++i) {
        auto y = Bytes::try_alloc_async(*pool, 1 << (10 + i % 10), elsewhere, error);
        if (mode == CaptureMode::global && !y.is_empty()) fake.launch(elsewhere);
        if (error) errors.push_back(error);
      }
    }).join();
    for (const std::error_code& error : errors) CHECK(error == Errc::capture_forbids_call);
    if (expandable) CHECK(errors.empty());  // the mappings are allowed in every mode
    REQUIRE(capture_status(fake, s) == CaptureStatus::active);
    auto graph = streampool::end_capture_with_pool(s, capture);
    REQUIRE(graph.valid());
    graph.launch(s);
    fake.complete_all();
    REQUIRE(fake.hazards().empty());
  }
}

TEST_CASE("a shared block dropped on the captured stream during capture is adopted by the pool") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto x = Bytes::alloc_async(*pool, 4096, s);
  void* adopted = x.data();
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  fake.launch(s, {{x.data(), x.byte_size(), true}});  // the graph uses it
  x.reset();
  auto graph = streampool::end_capture_with_pool(s, capture);
  auto after = Bytes::alloc_async(*pool, 4096, s);
  REQUIRE(static_cast<void*>(after.data()) != adopted);  // not back in the cache
  REQUIRE(pool->stats().live_allocations.current == 2);
  capture.reset();
  graph = streampool::CapturedGraph();
  REQUIRE(pool->stats().live_allocations.current == 1);  // released with the pool
}

// An adopted block that only the capture's own stream used needs, once its CapturePool and graphs
// are gone, only the fence recorded as the capture began and the graphs' replays (complete when
// CUDA releases the pool). It got a need that only a device synchronize covers (its other uses,
// none, were taken as unknown), and stayed parked until a trim or the out-of-memory ladder
// synchronized the device (found in review, 2026-12-06).
TEST_CASE("a block adopted from the captured stream alone comes back once its work is done") {
  // A large range: a small block could come back to a list the next allocation does not look at
  // before it takes another block of a slab (the same need, a different order).
  constexpr std::size_t bytes = 3 * MiB;
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto x = Bytes::alloc_async(*pool, bytes, s);
  void* adopted = x.data();
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  fake.launch(s, {{x.data(), x.byte_size(), true}});  // the graph uses it
  x.reset();
  {
    auto graph = streampool::end_capture_with_pool(s, capture);
    graph.launch(s);
  }
  capture.reset();
  fake.complete_all();  // the replay done; no device synchronize
  streampool::complete_graph_releases();  // the graph's reference on the CapturePool goes
  // A stream with nothing cached: its allocation looks at what is parked, and finds it clean.
  cudaStream_t t = fake.create_stream();
  auto again = Bytes::alloc_async(*pool, bytes, t);
  CHECK(pool->breakdown().parked_bytes == 0);
  CHECK(static_cast<void*>(again.data()) == adopted);
}

TEST_CASE("a capture that fails or is abandoned leaks nothing and leaves the stream") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  const auto baseline = pool->stats().live_allocations.current;

  SECTION("invalidated: end_capture_with_pool throws, the stream is out of capture") {
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(MiB);
    streampool::begin_capture_with_pool(capture, s);
    auto x = Bytes::alloc_async(*pool, 1000, s);
    void* p = nullptr;
    REQUIRE(fake.malloc(&p, 100) == cudaErrorStreamCaptureUnsupported);  // invalidates it
    try {
      streampool::end_capture_with_pool(s, capture);
      FAIL("ended an invalidated capture");
    } catch (const streampool::Error& e) {
      REQUIRE(e.errc() == Errc::capture_invalidated);
    }
    REQUIRE(capture_status(fake, s) == CaptureStatus::none);
    x.reset();
    capture.reset();
  }
  SECTION("abandoned: the pool's last reference goes mid-capture") {
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(MiB);
    streampool::begin_capture_with_pool(capture, s);
    {
      auto x = Bytes::alloc_async(*pool, 1000, s);
    }
    capture.reset();
    REQUIRE(capture_status(fake, s) == CaptureStatus::none);
  }
  REQUIRE(pool->stats().live_allocations.current == baseline);
  // The stream is usable again, outside capture.
  auto y = Bytes::alloc_async(*pool, 1000, s);
  REQUIRE_FALSE(y.is_empty());
}

TEST_CASE("begin and end refuse a mismatched stream or pool") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  auto other = std::make_shared<CapturePool>(*pool);
  REQUIRE_THROWS_AS(streampool::begin_capture_with_pool(nullptr, s), streampool::Error);
  streampool::begin_capture_with_pool(capture, s);
  REQUIRE_THROWS_WITH(streampool::begin_capture_with_pool(capture, t),
                      Catch::Contains("already capturing"));
  REQUIRE_THROWS_WITH(streampool::begin_capture_with_pool(other, s),
                      Catch::Contains("already captured"));
  REQUIRE_THROWS_AS(streampool::end_capture_with_pool(t, capture), streampool::Error);
  REQUIRE_THROWS_AS(streampool::end_capture_with_pool(s, other), streampool::Error);
  REQUIRE(capture_status(fake, s) == CaptureStatus::active);
  REQUIRE_NOTHROW(streampool::end_capture_with_pool(s, capture));
}

// Issue 8, item 10 (before the core's redesign): the raw API's free on another stream than the
// allocation's re-implements the drop and knows nothing of private pieces: then a CapturePool's
// piece freed on another stream (or on its own stream after release_stream, which gives that stream
// a new state) lands in the shared cache as a block of the smallest class. It is handed out there,
// larger than the piece, over a live private buffer, while graphs replay into it; and the piece
// never goes back to its CapturePool, whose memory leaks with it unless the block happens to be
// freed again.
TEST_CASE("a private buffer freed through the raw API goes back to its CapturePool, on whatever "
          "stream it is freed") {
  auto fake = std::make_shared<FakeDevice>();
  {
    streampool::MemoryPool pool(fake, test_options());
    cudaStream_t s = fake->create_stream();
    cudaStream_t o = fake->create_stream();
    auto capture = std::make_shared<CapturePool>(pool);
    capture->reserve(MiB);
    const std::size_t reserved = capture->free_bytes();
    streampool::begin_capture_with_pool(capture, s);
    void* p = pool.allocate(200, s);          // a private piece of 256 bytes
    void* neighbour = pool.allocate(200, s);  // the next piece, alive throughout
    REQUIRE(static_cast<std::byte*>(neighbour) == static_cast<std::byte*>(p) + 256);
    fake->launch(s, {{p, 200, true}, {neighbour, 200, true}});  // replayed by every launch
    CapturedGraph graph = streampool::end_capture_with_pool(s, capture);

    cudaStream_t freed_on = o;
    SECTION("freed on another stream") {}
    SECTION("freed on its own stream, after release_stream") {
      pool.release_stream(s);
      freed_on = s;
    }
    pool.deallocate(p, 200, freed_on);
    CHECK(capture->free_bytes() == reserved - 256);  // back to the CapturePool; the neighbour not

    void* q = pool.allocate(512, freed_on);  // the smallest class of the shared cache
    CHECK(q != p);
    graph.launch(s);
    fake->launch(freed_on, {{q, 512, true}});
    INFO(first_hazard(*fake));
    CHECK(fake->hazards().empty());
    fake->complete_all();
    pool.deallocate(q, 512, freed_on);
    pool.deallocate(neighbour, 200, s);
  }
  CHECK(fake->live_bytes() == 0);
}

// Found in review, 2026-12-07: a buffer of CapturePool B's private memory (allocated in B's
// capture and kept), used in capture A and dropped there (record_stream naming A's stream, or a
// raw free on it), went back to B, since a private piece always went to its own pool. A's graph
// uses it: once B and its graphs were gone, B's memory went back to the shared cache, and the
// cache handed it out while A's graph still replayed. A adopts it now, as a shared buffer, and
// gives it back to B only when A goes.
TEST_CASE("another CapturePool's private buffer dropped during a capture is kept for that "
          "capture's graph") {
  const int how = GENERATE(0, 1);  // record_stream and a drop on its own stream; a raw free
  CAPTURE(how);
  auto fake = std::make_shared<FakeDevice>();
  {
    streampool::MemoryPool pool(fake, test_options());
    cudaStream_t a = fake->create_stream("a");
    cudaStream_t b = fake->create_stream("b");
    cudaStream_t other = fake->create_stream("other");
    CompleteAtExit at_exit;
    auto B = std::make_shared<CapturePool>(pool);
    B->reserve(MiB);
    streampool::begin_capture_with_pool(B, b);
    Bytes x;
    void* p = nullptr;
    if (how == 0) {
      x = Bytes::alloc_async(pool, 4096, b);
      p = x.data();
    } else {
      p = pool.allocate(4096, b);
    }
    fake->launch(b, {{p, 4096, true}}, {}, "graph B writes x");
    CapturedGraph graph_b = streampool::end_capture_with_pool(b, B);

    auto A = std::make_shared<CapturePool>(pool);
    streampool::begin_capture_with_pool(A, a);
    fake->launch(a, {{p, 4096, false}}, {}, "graph A reads x");
    if (how == 0) {
      x.record_stream(a);
      x.reset();
    } else {
      pool.deallocate(p, 4096, a);
    }
    CapturedGraph graph_a = streampool::end_capture_with_pool(a, A);
    CHECK(capture_status(*fake, a) == CaptureStatus::none);
    A.reset();
    graph_b = CapturedGraph();
    B.reset();  // B and its graph gone: B's memory goes back to the shared cache, but not x's
    streampool::complete_graph_releases();
    fake->complete_all();
    pool.trim();
    {
      auto y = Bytes::alloc_async(pool, 4096, other);
      CHECK(static_cast<void*>(y.data()) != p);
      fake->launch(other, {{y.data(), y.byte_size(), true}}, {}, "ordinary work");
    }
    graph_a.launch(a);  // A's graph still reads x's memory
    fake->complete_all();
    INFO(first_hazard(*fake));
    CHECK(fake->hazards().empty());
    graph_a = CapturedGraph();  // the last of A: x goes back to B, and B's memory to the pool
    streampool::complete_graph_releases();
    fake->complete_all();
    CHECK(pool.stats().live_allocations.current == 0);
  }
  CHECK(fake->live_bytes() == 0);
}

// Two CapturePools each holding a buffer of the other's private memory for their graphs: each
// gives the other's back when it goes (its CapturePool and graphs gone), not when its binding
// goes (which its own buffer, held by the other, would put off for good: found by the model
// check, seed 232, in the first version of the fix above).
TEST_CASE("two CapturePools that each keep a buffer of the other's for their graphs leak nothing") {
  auto fake = std::make_shared<FakeDevice>();
  {
    streampool::MemoryPool pool(fake, test_options());
    cudaStream_t a = fake->create_stream("a");
    cudaStream_t b = fake->create_stream("b");
    CompleteAtExit at_exit;
    auto A = std::make_shared<CapturePool>(pool);
    auto B = std::make_shared<CapturePool>(pool);
    A->reserve(MiB);
    B->reserve(MiB);
    streampool::begin_capture_with_pool(B, b);
    auto of_b = Bytes::alloc_async(pool, 4096, b);
    write_on(*fake, b, of_b);
    CapturedGraph graph_b = streampool::end_capture_with_pool(b, B);
    streampool::begin_capture_with_pool(A, a);
    auto of_a = Bytes::alloc_async(pool, 4096, a);
    write_on(*fake, a, of_a);
    fake->launch(a, {{of_b.data(), of_b.byte_size(), false}}, {}, "graph A reads B's buffer");
    of_b.record_stream(a);
    of_b.reset();  // A keeps it for its graph
    CapturedGraph graph_a = streampool::end_capture_with_pool(a, A);
    streampool::begin_capture_with_pool(B, b);
    fake->launch(b, {{of_a.data(), of_a.byte_size(), false}}, {}, "graph B2 reads A's buffer");
    of_a.record_stream(b);
    of_a.reset();  // B keeps it for its graph
    CapturedGraph graph_b2 = streampool::end_capture_with_pool(b, B);
    graph_b.launch(a);  // one after another: they share memory
    graph_a.launch(a);
    graph_b2.launch(a);
    fake->complete_all();
    INFO(first_hazard(*fake));
    CHECK(fake->hazards().empty());
    graph_a = CapturedGraph();
    graph_b = CapturedGraph();
    graph_b2 = CapturedGraph();
    A.reset();
    B.reset();
    streampool::complete_graph_releases();
    fake->complete_all();
    CHECK(pool.stats().live_allocations.current == 0);
  }
  CHECK(fake->live_bytes() == 0);
}

// Issue 8, item 12: a buffer whose stream was released before the capture keeps the released
// stream's state; dropped during the capture on that stream, it is not adopted (the drop looks
// at the old state, which is not bound to the capture) and goes to the old state's list. A trim
// then hands it to another stream while the graph replays into it.
TEST_CASE("a buffer of a released stream dropped during a capture on that stream is adopted") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, s));
  pool->release_stream(s);  // x is alive: allowed
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  fake.launch(s, {{x->data(), x->byte_size(), true}});  // the graph writes x
  x.reset();
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  CHECK(pool->stats().live_allocations.current == 1);  // held by the CapturePool

  pool->trim(std::size_t{1} << 40);  // keeps the memory
  auto y = Bytes::alloc_async(*pool, 4096, b);
  graph.launch(s);
  write_on(fake, b, y);
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Issue 8, item 13: a CapturePool's free pieces coalesce with free neighbours by address alone,
// so two ranges from different device allocations that happen to be adjacent (two reserves, or
// relaxed-mode growth, each its own cudaMalloc) merge, and a buffer can be cut across the
// boundary: one buffer in two device allocations, which no kernel may touch as one.
TEST_CASE("a private buffer never spans two device allocations") {
  auto options = test_options();
  options.segment_bytes = MiB;  // each reservation or growth is a device allocation of its own
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  std::vector<Bytes> buffers;
  std::error_code error;

  SECTION("two reservations, then one larger allocation") {
    capture->reserve(MiB);
    capture->reserve(MiB);
    streampool::begin_capture_with_pool(capture, s);
    // Either refused (no single range holds it) or inside one device allocation.
    buffers.push_back(Bytes::try_alloc_async(*pool, 3 * MiB / 2, s, error));
    if (error) CHECK(error == Errc::capture_pool_exhausted);
  }
  SECTION("growth in relaxed mode") {
    streampool::begin_capture_with_pool(capture, s, CaptureMode::relaxed);
    for (int i = 0; i < 2; ++i) buffers.push_back(Bytes::alloc_async(*pool, 3 * MiB / 2, s));
  }
  for (const Bytes& buffer : buffers) {
    if (!buffer.is_empty()) fake.launch(s, {{buffer.data(), buffer.byte_size(), true}});
  }
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  graph.launch(s);  // the captured writes run, each checked against the live allocations
  fake.complete_all();
  const auto outside = fake_test::hazards_of(fake, HazardKind::out_of_bounds);
  INFO((outside.empty() ? std::string("none") : outside.front().what));
  CHECK(outside.empty());
}

// Issue 8, item 16: record_stream on a buffer cut from a CapturePool's private memory is ignored
// by its drop, which returns the piece to the CapturePool at once: the recorded stream gets no
// fence (and the list of recorded streams leaks). A later capture with the same CapturePool gets
// the piece, and its graph's replay writes it while the recorded stream still reads it.
TEST_CASE("a private buffer recorded on another stream is reused only after that stream's work") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t r = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);

  streampool::begin_capture_with_pool(capture, s);
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, s));
  fake.launch(s, {{x->data(), x->byte_size(), true}});
  CapturedGraph first = streampool::end_capture_with_pool(s, capture);
  first.launch(s);
  fake_test::order_after(fake, r, s);
  fake.launch(r, {{x->data(), x->byte_size(), false}});  // R reads what the replay wrote
  x->record_stream(r);
  x.reset();  // R's read is pending

  streampool::begin_capture_with_pool(capture, s);
  std::error_code error;
  auto y = Bytes::try_alloc_async(*pool, 4096, s, error);
  if (!y.is_empty()) fake.launch(s, {{y.data(), y.byte_size(), true}});
  CapturedGraph second = streampool::end_capture_with_pool(s, capture);
  second.launch(s);
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Found in review (2026-12-05): the gate adopted a buffer dropped during a capture only when its
// own stream was the captured one; one that record_stream named the captured stream for, dropped
// on its own stream, was fenced on the capturing stream (which records no fence) and went back
// to the cache while the graph could still replay into it.
TEST_CASE("a buffer recorded on the captured stream and dropped during the capture is not "
          "handed out while the graph may replay") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, o));
  write_on(fake, o, *x);
  fake_test::order_after(fake, s, o);  // s's work follows o's
  void* x_ptr = x->data();
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  fake.launch(s, {{x->data(), x->byte_size(), true}});  // the graph writes x
  x->record_stream(s);
  x.reset();  // on o, during the capture
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  fake.complete_all();
  pool->trim(std::size_t{1} << 40);  // learns what completed; keeps the memory
  auto y = Bytes::alloc_async(*pool, 4096, o);
  write_on(fake, o, y);
  graph.launch(s);
  INFO(first_hazard(fake));
  CHECK(static_cast<void*>(y.data()) != x_ptr);
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Found in review, 2026-12-07, of the fix above: X's capture launched Y's graph (X kept Y's
// CapturePool until X's binding went), and Y later adopted one of X's pieces (the piece keeps X's
// binding; Y gives it back when Y's CapturePool goes): neither went. X lets Y's CapturePool go
// once no graph of its own is left.
TEST_CASE("a CapturePool that keeps a piece of one whose capture launched its graph leaks "
          "nothing") {
  auto fake = std::make_shared<FakeDevice>();
  {
    streampool::MemoryPool pool(fake, test_options());
    cudaStream_t xs = fake->create_stream("x");
    cudaStream_t ys = fake->create_stream("y");
    CompleteAtExit at_exit;
    auto X = std::make_shared<CapturePool>(pool);
    auto Y = std::make_shared<CapturePool>(pool);
    X->reserve(MiB);
    Y->reserve(MiB);
    streampool::begin_capture_with_pool(Y, ys);
    { auto t = Bytes::alloc_async(pool, 4096, ys); write_on(*fake, ys, t); }
    CapturedGraph graph_y = streampool::end_capture_with_pool(ys, Y);
    streampool::begin_capture_with_pool(X, xs);
    graph_y.launch(xs);  // X keeps Y's CapturePool
    auto p = Bytes::alloc_async(pool, 4096, xs);  // a piece of X
    write_on(*fake, xs, p);
    CapturedGraph graph_x = streampool::end_capture_with_pool(xs, X);
    streampool::begin_capture_with_pool(Y, ys);
    fake->launch(ys, {{p.data(), 4096, false}}, {}, "graph Y2 reads p");
    p.record_stream(ys);
    p.reset();  // Y adopts X's piece
    CapturedGraph graph_y2 = streampool::end_capture_with_pool(ys, Y);
    graph_x = CapturedGraph();
    graph_y = CapturedGraph();
    graph_y2 = CapturedGraph();
    X.reset();
    Y.reset();
    streampool::complete_graph_releases();
    fake->complete_all();
    streampool::complete_graph_releases();
    CHECK(pool.stats().live_allocations.current == 0);
  }
  CHECK(fake->live_bytes() == 0);
}
