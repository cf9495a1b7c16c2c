// CapturePool lifetime: registered buffers live as long as the pool, the pool as long as any
// graph made with it, and everything goes back to the MemoryPool when the last reference goes.
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>

#include <mutex>
#include <thread>

using streampool::CapturedGraph;
using streampool::CapturePool;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {

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
