// CapturePool lifetime: registered buffers live as long as the pool, the pool as long as any
// graph made with it, and everything goes back to the MemoryPool when the last reference goes.
#include "fake_helpers.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <mutex>
#include <optional>
#include <thread>
#include <utility>

using streampool::CapturedGraph;
using streampool::CapturePool;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Completes the graph releases still queued when it goes out of scope, even when an assertion
// ends the test early: a release left queued would run, in a later test, against owners that
// lived on this test's stack. Declared after those owners, so that it goes first.
struct CompleteReleasesAtExit {
  CompleteReleasesAtExit() = default;
  CompleteReleasesAtExit(const CompleteReleasesAtExit&) = delete;
  CompleteReleasesAtExit& operator=(const CompleteReleasesAtExit&) = delete;
  ~CompleteReleasesAtExit() { streampool::complete_graph_releases(); }
};

// A user's own owner of GPU memory: reports its destruction.
struct Tracked {
  std::vector<int>* log;
  int id;
  Tracked(std::vector<int>* l, int i) : log(l), id(i) {}
  Tracked(Tracked&& other) noexcept : log(std::exchange(other.log, nullptr)), id(other.id) {}
  ~Tracked() {
    if (log != nullptr) log->push_back(id);
  }
};

// Captures one unit of work on `stream` and returns the graph.
CapturedGraph capture_one(PoolOnFake& pool, const std::shared_ptr<CapturePool>& capture,
                          cudaStream_t stream) {
  streampool::begin_capture_with_pool(capture, stream);
  pool.fake().launch(stream);
  return streampool::end_capture_with_pool(stream, capture);
}

// Captures a write into 4 KiB of the CapturePool's private memory on `stream`.
CapturedGraph capture_write(PoolOnFake& pool, const std::shared_ptr<CapturePool>& capture,
                            cudaStream_t stream) {
  streampool::begin_capture_with_pool(capture, stream);
  {
    auto x = Bytes::alloc_async(*pool, 4 * KiB, stream);
    pool.fake().launch(stream, {{x.data(), x.byte_size(), true}});
  }
  return streampool::end_capture_with_pool(stream, capture);
}

// Captures a launch of `inner` on `stream` with `outer`: the outer graph replays inner's work.
CapturedGraph capture_launch(CapturedGraph& inner, const std::shared_ptr<CapturePool>& outer,
                             cudaStream_t stream) {
  streampool::begin_capture_with_pool(outer, stream);
  inner.launch(stream);
  return streampool::end_capture_with_pool(stream, outer);
}

// An owner given to record_buffer: notes how many device synchronizes the fake had seen when it
// was destroyed.
struct SyncProbe {
  FakeDevice* fake;
  std::uint64_t* seen;
  SyncProbe(FakeDevice* f, std::uint64_t* s) : fake(f), seen(s) {}
  SyncProbe(SyncProbe&& o) noexcept
      : fake(std::exchange(o.fake, nullptr)), seen(std::exchange(o.seen, nullptr)) {}
  ~SyncProbe() {
    if (fake != nullptr) *seen = fake->calls(FakeDevice::Call::device_synchronize);
  }
};

}  // namespace

TEST_CASE("when the last reference goes, registered buffers are dropped in registration order") {
  PoolOnFake pool;
  std::vector<int> log;
  {
    auto capture = std::make_shared<CapturePool>(*pool);
    for (int i = 0; i < 5; ++i) REQUIRE(capture->record_buffer(Tracked(&log, i)) == std::size_t(i));
    REQUIRE(capture->buffer_count() == 5);
    REQUIRE(log.empty());
  }
  REQUIRE(log == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("record_buffer keeps any movable owner: PooledBuffer, shared_ptr, a user's type") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->record_buffer(Bytes::alloc_async(*pool, 1000, s));
  auto shared = std::make_shared<Bytes>(Bytes::alloc_async(*pool, 1000, s));
  capture->record_buffer(shared);
  std::vector<int> log;
  capture->record_buffer(Tracked(&log, 7));
  REQUIRE(pool->stats().live_allocations.current == 2);
  shared.reset();
  REQUIRE(pool->stats().live_allocations.current == 2);  // the pool holds the other reference
  capture.reset();
  REQUIRE(pool->stats().live_allocations.current == 0);
  REQUIRE(log == std::vector<int>{7});
}

TEST_CASE("clear_buffers drops every registered buffer now, in order, and the pool stays usable") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  std::vector<int> log;
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->record_buffer(Tracked(&log, 1));
  capture->record_buffer(Tracked(&log, 2));

  SECTION("with no graph") {
    capture->clear_buffers();
    REQUIRE(log == std::vector<int>{1, 2});
    REQUIRE(capture->buffer_count() == 0);
    REQUIRE(capture->record_buffer(Tracked(&log, 3)) == 0);
    capture.reset();
    REQUIRE(log == std::vector<int>{1, 2, 3});
  }
  SECTION("while a graph still holds the pool") {
    CapturedGraph graph = capture_one(pool, capture, s);
    capture->clear_buffers();
    REQUIRE(log == std::vector<int>{1, 2});
    capture->record_buffer(Tracked(&log, 3));
    capture.reset();  // the graph still holds it
    REQUIRE(log == std::vector<int>{1, 2});
    graph.launch(s);
    pool.fake().complete_all();
    graph = CapturedGraph();  // the last reference
    REQUIRE(log == std::vector<int>{1, 2, 3});
  }
}

TEST_CASE("a graph keeps its pool alive after the caller and the wrapper drop theirs") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  std::vector<int> log;
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->record_buffer(Tracked(&log, 1));
  CapturedGraph graph = capture_one(pool, capture, s);
  REQUIRE(capture.use_count() >= 3);  // caller, wrapper, graph
  capture.reset();

  SECTION("the CapturedGraph wrapper holds it") {
    graph.launch(s);
    graph.launch(s);
    REQUIRE(graph.replay_count() == 2);
    REQUIRE(log.empty());
    fake.complete_all();
    graph = CapturedGraph();
    REQUIRE(log == std::vector<int>{1});
  }
  SECTION("the raw executable graph holds it after the wrapper is gone") {
    cudaGraphExec_t exec = graph.release();
    graph = CapturedGraph();
    REQUIRE(log.empty());
    REQUIRE(fake.graph_launch(exec, s) == cudaSuccess);
    REQUIRE(fake.graph_exec_destroy(exec) == cudaSuccess);
    REQUIRE(log.empty());  // the replay is still pending: CUDA keeps the object until it is done
    fake.complete_all();
    // The release came from the user object's destructor, where no CUDA call is allowed: it is
    // completed at the library's next safe point.
    REQUIRE(fake.hazards().empty());
    streampool::complete_graph_releases();
    REQUIRE(log == std::vector<int>{1});
  }
}

TEST_CASE("record_buffer may be called from several threads at once") {
  PoolOnFake pool;
  auto capture = std::make_shared<CapturePool>(*pool);
  std::vector<int> log;
  std::mutex log_mutex;
  struct Counted {
    std::atomic<int>* drops;
    explicit Counted(std::atomic<int>* d) : drops(d) {}
    Counted(Counted&& o) noexcept : drops(std::exchange(o.drops, nullptr)) {}
    ~Counted() {
      if (drops != nullptr) drops->fetch_add(1);
    }
  };
  std::atomic<int> drops{0};
  std::vector<std::thread> threads;
  std::vector<std::vector<std::size_t>> indices(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) indices[t].push_back(capture->record_buffer(Counted(&drops)));
    });
  }
  for (auto& thread : threads) thread.join();
  REQUIRE(capture->buffer_count() == 2000);
  std::vector<std::size_t> all;
  for (auto& v : indices) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  for (std::size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == i);  // each index once
  capture.reset();
  REQUIRE(drops == 2000);
}

TEST_CASE("the pool's private memory goes back to the MemoryPool when the pool goes") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  const auto before = pool->stats();
  {
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->reserve(std::size_t{4} << 20);
    REQUIRE(capture->reserved_bytes() >= (std::size_t{4} << 20));
    REQUIRE(pool->stats().live_allocations.current == before.live_allocations.current + 1);
    CapturedGraph graph = capture_one(pool, capture, s);
    capture.reset();
    REQUIRE(pool->stats().live_allocations.current == before.live_allocations.current + 1);
  }
  REQUIRE(pool->stats().live_allocations.current == before.live_allocations.current);
  // ... and is reused by the MemoryPool, not allocated again.
  const auto mallocs = pool.fake().calls(FakeDevice::Call::malloc);
  auto reuse = Bytes::alloc_async(*pool, std::size_t{4} << 20, s);
  REQUIRE(pool.fake().calls(FakeDevice::Call::malloc) == mallocs);
}

TEST_CASE("a MemoryPool destroyed before its CapturePool stays alive until the CapturePool goes") {
  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<streampool::MemoryPool>(fake, test_options());
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(std::size_t{1} << 20);
  pool.reset();
  REQUIRE(fake->live_bytes() > 0);
  capture.reset();
  REQUIRE(fake->live_bytes() == 0);
}

// Issue 8, item 8 (before the core's redesign): a block the CapturePool adopted (a shared buffer
// dropped during the capture) is dropped again when the CapturePool goes, and then that drop
// records the fence another stream asked of its stream (or, under fence_every_free, its own)
// through the stream's handle. The user dropped every buffer of that stream and destroyed it, as
// the contract allows, and CUDA gave the handle to a new stream: the fence covers the new stream's
// work, not the old one's, and the old stream's blocks go to another stream early.
TEST_CASE("a CapturePool's adopted blocks are not fenced, when it goes, through a handle their "
          "destroyed stream gave to another stream") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, s));
  write_on(fake, s, *x);
  {
    auto y = Bytes::alloc_async(*pool, 4096, s);
    write_on(fake, s, y);  // dropped on S with its write pending
  }
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  fake.launch(s, {{x->data(), x->byte_size(), false}});  // the graph reads x
  x.reset();                                             // adopted by the CapturePool
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);

  auto on_b = Bytes::alloc_async(*pool, 4096, b);  // B misses and asks S for a fence
  write_on(fake, b, on_b);
  fake.destroy_stream(s);  // every buffer of S is dropped: S may go, its work still pending
  cudaStream_t t = fake.create_stream();
  REQUIRE(t == s);  // the handle now names T

  graph = CapturedGraph();
  capture.reset();  // the CapturePool goes, and drops its adopted block
  auto again = Bytes::alloc_async(*pool, 4096, b);
  write_on(fake, b, again);
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Issue 8, item 11 (before the core's redesign): when the last reference to a CapturePool's private
// memory goes, its ranges return to the arena as clean. But a buffer allocated during the capture
// may be used by ordinary work after it, and be the last reference, dropped while that work is
// pending: then the next allocation of another stream gets its memory at once.
TEST_CASE("private memory used by ordinary work after its capture goes back to the pool only "
          "after that work") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  streampool::begin_capture_with_pool(capture, s);
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 64 * KiB, s));
  fake.launch(s, {{x->data(), x->byte_size(), true}});
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  graph.launch(s);
  fake.complete_all();
  graph = CapturedGraph();
  capture.reset();  // x alone holds the private memory now

  write_on(fake, s, *x);  // ordinary work, after the capture
  x.reset();              // the last reference: the private memory goes back
  auto y = Bytes::alloc_async(*pool, MiB, b);
  write_on(fake, b, y);
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Issue 8, item 14 (before the core's redesign): a graph's release is queued by its user object's
// destructor (where CUDA forbids CUDA calls) and completed at a library safe point. Then neither
// trim nor ~MemoryPool is one: when the last replay completes after the CapturedGraph is gone, or
// the caller destroys the executable graph itself, the CapturePool, its registered owners and its
// private memory wait for the next safe point of whatever pool the process uses next, which then
// runs them against a destroyed pool and owners.
TEST_CASE("a release a graph queued is completed by trim, and at the latest by its MemoryPool's "
          "destruction") {
  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<streampool::MemoryPool>(fake, test_options());
  cudaStream_t s = fake->create_stream();
  std::vector<int> log;
  CompleteReleasesAtExit complete_at_exit;
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  capture->record_buffer(Tracked(&log, 1));
  std::optional<CapturedGraph> graph;
  streampool::begin_capture_with_pool(capture, s);
  fake->launch(s);
  graph.emplace(streampool::end_capture_with_pool(s, capture));
  capture.reset();

  SECTION("trim, after the last replay outlived the CapturedGraph") {
    graph->launch(s);
    graph.reset();     // the replay is pending: its user object stays until it completes
    pool->trim();      // synchronizes: the replay completes and its destructor queues the release
    CHECK(log == std::vector<int>{1});
  }
  SECTION("the MemoryPool's destruction, after the last replay outlived the CapturedGraph") {
    graph->launch(s);
    graph.reset();
    fake->complete_all();  // the replay completes: the release is queued
    REQUIRE(log.empty());
    pool.reset();
    CHECK(log == std::vector<int>{1});
    CHECK(fake->live_bytes() == 0);
  }
  SECTION("the MemoryPool's destruction, after the caller destroyed the executable graph") {
    const cudaGraphExec_t exec = graph->release();
    graph.reset();
    REQUIRE(fake->graph_exec_destroy(exec) == cudaSuccess);  // the release is queued
    REQUIRE(log.empty());
    pool.reset();
    CHECK(log == std::vector<int>{1});
    CHECK(fake->live_bytes() == 0);
  }
}

// Issue 8, item 15 (during a capture): ~CapturePool ended a capture still under way through its
// MemoryPool (source().device()), which may be gone: a use after free (a segmentation fault in a
// release build; an AddressSanitizer build names it).
TEST_CASE("a CapturePool that outlives its MemoryPool during a capture ends the capture safely") {
  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<streampool::MemoryPool>(fake, test_options());
  cudaStream_t s = fake->create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  streampool::begin_capture_with_pool(capture, s);
  pool.reset();
  capture.reset();
  REQUIRE(fake_test::capture_status(*fake, s) == streampool::CaptureStatus::none);
  REQUIRE(fake->live_bytes() == 0);
}

// Issue 8, item 15 (with no memory): the core outlived the MemoryPool object only while live
// blocks counted on it, and a CapturePool that reserved nothing held none: the core was deleted
// with the MemoryPool and the CapturePool's next reserve read freed memory.
TEST_CASE("a CapturePool keeps its MemoryPool's core alive even when it holds no memory") {
  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<streampool::MemoryPool>(fake, test_options());
  auto capture = std::make_shared<CapturePool>(*pool);
  pool.reset();
  try {
    capture->reserve(MiB);  // may succeed, or refuse with an Error: it must not touch freed memory
  } catch (const streampool::Error&) {
  }
  capture.reset();
  REQUIRE(fake->live_bytes() == 0);
}

// Issue 8, "also": every allocation's slow path completes the graph releases queued anywhere in
// the process, so a user's owner given to record_buffer is destroyed inside an allocate() of an
// unrelated pool, on that caller's thread and under whatever locks it holds.
TEST_CASE("owners given to record_buffer are never destroyed inside another pool's allocation") {
  PoolOnFake pool;
  PoolOnFake unrelated;
  cudaStream_t s = pool.fake().create_stream();
  cudaStream_t u = unrelated.fake().create_stream();
  std::vector<int> log;
  CompleteReleasesAtExit complete_at_exit;
  cudaGraphExec_t exec = nullptr;
  {
    auto capture = std::make_shared<CapturePool>(*pool);
    capture->record_buffer(Tracked(&log, 1));
    exec = capture_one(pool, capture, s).release();  // the caller destroys it: no safe point
  }
  REQUIRE(pool.fake().graph_exec_destroy(exec) == cudaSuccess);  // queues the release
  REQUIRE(log.empty());
  void* p = unrelated->allocate(4096, u);  // a first allocation: the slow path
  CHECK(log.empty());
  unrelated->deallocate(p, 4096, u);
}

// Found in review: a private piece dropped during a later capture, on its stream, lost every use:
// ordinary work since its own capture (named by record_stream) was not fenced, and the piece was
// reused in the capture at once.
TEST_CASE("a private piece dropped in a later capture keeps the needs of its ordinary uses") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  auto cp = std::make_shared<streampool::CapturePool>(*pool);
  cp->reserve((std::size_t{1} << 20));
  streampool::begin_capture_with_pool(cp, s);
  auto p = Bytes::alloc_async(*pool, 4096, s);
  fake.launch(s, {{p.data(), p.byte_size(), true}});
  auto graph1 = streampool::end_capture_with_pool(s, cp);
  // Ordinary work on o uses p, as record_stream's contract asks.
  p.record_stream(o);
  fake.launch(o, {{p.data(), p.byte_size(), true}});  // stays pending
  void* p_ptr = p.data();
  streampool::begin_capture_with_pool(cp, s);
  p.reset();  // during capture 2, on its stream
  auto q = Bytes::alloc_async(*pool, 4096, s);
  fake.launch(s, {{q.data(), q.byte_size(), true}});
  void* q_ptr = q.data();
  auto graph2 = streampool::end_capture_with_pool(s, cp);
  graph2.launch(s);
  INFO(first_hazard(fake));
  CHECK(q_ptr != p_ptr);
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Found in review (2026-12-05): PoolCore::keep() after the MemoryPool was gone (orphaned) raised
// the keepers but not the orphan's count, which the matching let_go() counted down: a graph
// destroy that CUDA refused (and the library deferred) after the MemoryPool went destroyed the
// core while the CapturePool's binding still used it, a use after free once the frees succeed.
// Here they are refused, so that the core waits in the graveyard and the test sees it begin.
TEST_CASE("a graph destroy CUDA refused after the MemoryPool went does not destroy the pool's "
          "core while its CapturePool holds it") {
  using Call = FakeDevice::Call;
  CompleteReleasesAtExit complete;
  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<streampool::MemoryPool>(fake, test_options());
  cudaStream_t s = fake->create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(MiB);
  std::uint64_t syncs_when_owner_died = ~std::uint64_t{0};
  capture->record_buffer(SyncProbe(fake.get(), &syncs_when_owner_died));
  streampool::begin_capture_with_pool(capture, s);
  fake->launch(s);
  std::optional<CapturedGraph> graph;
  std::uint64_t syncs_before = 0;
  SECTION("the graph's exec, destroyed with the CapturedGraph") {
    graph.emplace(streampool::end_capture_with_pool(s, capture));
    capture.reset();
    pool.reset();  // orphaned: the core lives on for the CapturePool's binding
    fake->fail_next(Call::graph_exec_destroy, 1);  // deferred: keep() on the orphaned core
    fake->fail_next(Call::free, 1000);  // an early destruction then waits instead of freeing
    syncs_before = fake->calls(Call::device_synchronize);
    graph.reset();  // retried at its safe point: the graph's release and the let_go() run
  }
  SECTION("the graph, destroyed at the end of a capture whose MemoryPool went during it") {
    pool.reset();  // mid-capture: the core waits for the binding
    fake->fail_next(Call::graph_destroy, 1);  // end_capture_with_pool's destroy: deferred
    fake->fail_next(Call::free, 1000);
    syncs_before = fake->calls(Call::device_synchronize);
    graph.emplace(streampool::end_capture_with_pool(s, capture));
    capture.reset();
    graph->launch(s);
    fake->complete_all();
    graph.reset();
  }
  // The CapturePool's owners go before its private memory, and that before the core: the core's
  // destruction (a device synchronize) must not have begun when the owner went.
  CHECK(syncs_when_owner_died == syncs_before);

  fake->fail_next(Call::free, 0);
  streampool::complete_graph_releases();
  { streampool::MemoryPool next(fake, test_options()); }  // a safe point buries the core
  CHECK(fake->live_bytes() == 0);
}

// Found in review (2026-12-05): a CapturedGraph launched into another capture becomes part of the
// graph being captured (a child graph), which then writes the launched graph's private memory;
// CUDA gives the outer graph no reference to the inner graph's user objects. With the inner
// CapturedGraph and its pool's handles gone, the pool went and its memory went back to the
// MemoryPool while the outer graph still replayed into it. The capture's CapturePool keeps the
// launched graph's pool now.
TEST_CASE("a CapturedGraph launched into another capture keeps its pool for the outer graph") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  CompleteReleasesAtExit at_exit;

  auto inner_pool = std::make_shared<CapturePool>(*pool);
  inner_pool->reserve(MiB);
  CapturedGraph inner = capture_write(pool, inner_pool, s);
  inner_pool.reset();
  auto outer_pool = std::make_shared<CapturePool>(*pool);
  // The launch is captured as a child graph: the outer graph writes inner's memory.
  CapturedGraph outer = capture_launch(inner, outer_pool, t);
  outer_pool.reset();

  inner = CapturedGraph();  // the inner graph goes; the outer one still replays its work
  streampool::complete_graph_releases();
  {
    // The shared cache hands out nothing of inner's memory while the outer graph may replay.
    auto other = Bytes::alloc_async(*pool, 4 * KiB, s);
    fake.launch(s, {{other.data(), other.byte_size(), true}}, {}, "ordinary work");
  }
  outer.launch(t);
  fake.complete_all();
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
}

TEST_CASE("a CapturedGraph launched into a capture with no CapturePool of its MemoryPool throws "
          "capture_without_pool, and launches nothing") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  CompleteReleasesAtExit at_exit;
  auto capture_pool = std::make_shared<CapturePool>(*pool);
  capture_pool->reserve(MiB);
  streampool::begin_capture_with_pool(capture_pool, s);
  { auto x = Bytes::alloc_async(*pool, 4 * KiB, s); }
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture_pool);

  REQUIRE(fake.begin_capture(t, streampool::CaptureMode::relaxed) == cudaSuccess);
  try {
    graph.launch(t);
    FAIL("launched");
  } catch (const streampool::Error& e) {
    CHECK(e.errc() == streampool::Errc::capture_without_pool);
  }
  cudaGraph_t ended = nullptr;
  REQUIRE(fake.end_capture(t, &ended) == cudaSuccess);
  CHECK(graph.replay_count() == 0);
  fake.graph_destroy(ended);
}

// Found in review, 2026-12-07: a graph's buffers allocated and dropped in its capture leave free
// memory that later captures of its CapturePool reuse (its graphs replay one after another).
// Launched into such a later capture, the graph's replay wrote that memory while the capture's
// own buffer, allocated there before the launch and used after it, lay in it.
TEST_CASE("a CapturedGraph launched into a capture of its own CapturePool throws capture_mismatch, "
          "and launches nothing") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  CompleteReleasesAtExit at_exit;
  auto capture_pool = std::make_shared<CapturePool>(*pool);
  capture_pool->reserve(MiB);
  streampool::begin_capture_with_pool(capture_pool, s);
  const std::byte* temporary = nullptr;
  {
    auto t = Bytes::alloc_async(*pool, 4 * KiB, s);
    temporary = t.data();
    fake.launch(s, {{t.data(), t.byte_size(), true}}, {}, "the graph writes its temporary");
  }
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture_pool);

  streampool::begin_capture_with_pool(capture_pool, s);
  {
    auto x = Bytes::alloc_async(*pool, 4 * KiB, s);
    CHECK(x.data() == temporary);  // the graph's freed memory, reused: why the launch is refused
    fake.launch(s, {{x.data(), x.byte_size(), true}}, {}, "the outer graph writes x");
    try {
      graph.launch(s);
      FAIL("launched");
    } catch (const streampool::Error& e) {
      CHECK(e.errc() == streampool::Errc::capture_mismatch);
    }
    fake.launch(s, {{x.data(), x.byte_size(), false}}, {}, "the outer graph reads x");
  }
  CHECK(fake_test::capture_status(fake, s) == streampool::CaptureStatus::active);
  CapturedGraph outer = streampool::end_capture_with_pool(s, capture_pool);
  CHECK(graph.replay_count() == 0);
  outer.launch(s);
  graph.launch(s);  // outside a capture, in stream order after the outer graph: as ever
  fake.complete_all();
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  CHECK(graph.replay_count() == 1);
}

// The pools a capture's CapturePool keeps for the graphs launched into it go when it goes, at the
// latest when their MemoryPool goes: a release that queues another (the outer CapturePool lets go
// of the inner one) is completed in the same round.
TEST_CASE("a CapturePool kept for a graph launched into another capture goes with its MemoryPool") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  {
    auto inner_pool = std::make_shared<CapturePool>(*pool);
    inner_pool->reserve(MiB);
    CapturedGraph inner = capture_write(pool, inner_pool, s);
    auto outer_pool = std::make_shared<CapturePool>(*pool);
    outer_pool->reserve(MiB);
    CapturedGraph outer = capture_launch(inner, outer_pool, t);
    outer.launch(t);
  }  // every handle gone: the outer graph's release is queued, and it keeps the inner pool
  fake.complete_all();
  fake.destroy_stream(s);
  fake.destroy_stream(t);
  pool.pool.reset();  // completes its CapturePools' releases: both of them
  CHECK(fake.live_bytes() == 0);
  CHECK(fake.live_graphs() == 0);
}

// Found in review (2026-12-06): the binding that keeps a launched graph's CapturePool dropped it in
// its own destructor, wherever its last reference went - there the drop of a private piece that
// outlived its CapturePool, made while another capture (global mode) was under way. The kept
// pool's registered owner was destroyed there, and its cudaFree, which a global capture forbids,
// was refused and invalidated that capture. A release is completed at a safe point, never while a
// capture is under way (capture_pool.hpp). Since 2026-12-07 the kept pool goes once the keeping
// CapturePool has gone (with it every graph that could launch the kept one), however long its
// binding stays: here the keeping CapturePool's last handle goes during the other capture.
TEST_CASE("a CapturePool kept by another capture's binding is released at a safe point, not "
          "during a capture") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  cudaStream_t u = fake.create_stream();
  // A user's own owner of device memory, which frees it when it goes.
  struct OwnMemory {
    FakeDevice* fake;
    void* ptr;
    std::vector<cudaError_t>* freed;
    OwnMemory(FakeDevice* f, void* p, std::vector<cudaError_t>* l) : fake(f), ptr(p), freed(l) {}
    OwnMemory(OwnMemory&& o) noexcept
        : fake(o.fake), ptr(std::exchange(o.ptr, nullptr)), freed(o.freed) {}
    ~OwnMemory() {
      if (ptr != nullptr) freed->push_back(fake->free(ptr));
    }
  };
  std::vector<cudaError_t> freed;
  CompleteReleasesAtExit at_exit;

  std::optional<CapturedGraph> inner;
  {
    auto inner_pool = std::make_shared<CapturePool>(*pool);
    inner_pool->reserve(MiB);
    void* own = nullptr;
    REQUIRE(fake.malloc(&own, 4 * KiB) == cudaSuccess);
    inner_pool->record_buffer(OwnMemory(&fake, own, &freed));
    inner.emplace(capture_one(pool, inner_pool, s));
  }
  std::optional<Bytes> outlives;  // private memory of the outer pool, kept past its graph
  auto outer_pool = std::make_shared<CapturePool>(*pool);
  outer_pool->reserve(MiB);
  {
    streampool::begin_capture_with_pool(outer_pool, t);
    inner->launch(t);  // the outer pool's binding keeps the inner pool
    outlives.emplace(Bytes::alloc_async(*pool, 4 * KiB, t));
    CapturedGraph outer = streampool::end_capture_with_pool(t, outer_pool);
  }
  inner.reset();
  streampool::complete_graph_releases();  // the outer graph goes; the outer CapturePool stays
  REQUIRE(freed.empty());                 // the inner pool is kept by the outer binding

  auto third = std::make_shared<CapturePool>(*pool);
  third->reserve(MiB);
  streampool::begin_capture_with_pool(third, u, streampool::CaptureMode::global);
  outer_pool.reset();  // the outer CapturePool goes during the third capture
  CHECK(freed.empty());  // not released during the capture
  pool.fake().launch(u);
  std::optional<CapturedGraph> graph;
  CHECK_NOTHROW(graph.emplace(streampool::end_capture_with_pool(u, third)));
  streampool::complete_graph_releases();
  // At the next safe point, though the outer binding stays for the piece still live.
  CHECK(freed == std::vector<cudaError_t>{cudaSuccess});
  outlives.reset();
  fake.complete_all();
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
}

// Found in review (2026-12-06): each launch into a capture added one more reference to the launched
// graph's pool to the capture's binding, for the binding's whole life: a CapturePool that captures
// again and again (one per step of a loop), each time replaying the same graph, grew without bound.
TEST_CASE("a graph launched into many captures of one CapturePool is kept once") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  CompleteReleasesAtExit at_exit;
  auto inner_pool = std::make_shared<CapturePool>(*pool);
  inner_pool->reserve(MiB);
  CapturedGraph inner = capture_one(pool, inner_pool, s);
  const long before = inner_pool.use_count();
  auto outer_pool = std::make_shared<CapturePool>(*pool);
  for (int step = 0; step < 100; ++step) {
    capture_launch(inner, outer_pool, t);  // the step's graph goes at once
    streampool::complete_graph_releases();
  }
  CHECK(inner_pool.use_count() == before + 1);
}

// Noticed in review (2026-12-07): a capture into which a graph was launched (its CapturePool keeps
// the launched graph's), abandoned as its own CapturePool goes mid-capture. The discarded capture
// makes no graph: the kept pool, and with it the launched graph's memory, goes once the launched
// graph has gone too, and the stream is out of capture.
TEST_CASE("a CapturePool that goes during its own capture lets go of the pools of the graphs "
          "launched into it") {
  const bool nested = GENERATE(false, true);  // the launched graph itself launched another
  CAPTURE(nested);
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  cudaStream_t u = fake.create_stream();
  CompleteReleasesAtExit at_exit;
  auto inner_pool = std::make_shared<CapturePool>(*pool);
  inner_pool->reserve(MiB);
  CapturedGraph inner = capture_write(pool, inner_pool, s);
  inner_pool.reset();
  if (nested) {
    auto middle_pool = std::make_shared<CapturePool>(*pool);
    CapturedGraph middle = capture_launch(inner, middle_pool, u);
    inner = std::move(middle);  // launches the first one's work, keeping its pool
  }
  auto outer_pool = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(outer_pool, t);
  inner.launch(t);
  outer_pool.reset();  // mid-capture: ended, what it captured discarded
  CHECK(fake_test::capture_status(fake, t) == streampool::CaptureStatus::none);
  inner.launch(s);  // the launched graph still replays, into memory still kept
  fake.complete_all();
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  inner = CapturedGraph();
  streampool::complete_graph_releases();
  fake.complete_all();
  pool->trim(0);
  CHECK(fake.live_bytes() == 0);
  CHECK(fake.live_graphs() == 0);
}
