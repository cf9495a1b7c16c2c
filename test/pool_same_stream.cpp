// Same-stream reuse: a block dropped on a stream goes to the next allocation on that stream at
// once, with no device call and no fence.
#include "pool_helpers.hpp"

using streampool::FakeDevice;
using streampool::PooledBuffer;

TEST_CASE("a block dropped on a stream is handed to the next allocation on that stream at once") {
  auto options = test_options();
  options.stream_checks = streampool::StreamChecks::none;
  PoolOnFake pool(options);
  cudaStream_t s = pool.fake().create_stream();
  void* first = nullptr;
  {
    auto a = PooledBuffer<float>::alloc_async(*pool, 1000, s);
    write_on(pool.fake(), s, a);  // still pending when dropped
    first = a.data();
  }
  const auto calls_before = pool.fake().total_calls();
  const auto stats_before = pool->stats();

  SECTION("the same size gets the same block, with no device call of any kind") {
    auto b = PooledBuffer<float>::alloc_async(*pool, 1000, s);
    REQUIRE(b.data() == first);
    b.reset();
    REQUIRE(pool.fake().total_calls() == calls_before);
    REQUIRE(pool->stats().cache_hits == stats_before.cache_hits + 1);
    REQUIRE(pool->stats().fences_recorded == stats_before.fences_recorded);
  }
  SECTION("another size of the same class gets it too") {
    auto b = PooledBuffer<std::byte>::alloc_async(*pool, 3900, s);
    REQUIRE(static_cast<void*>(b.data()) == first);
  }
  SECTION("work on the stream that uses it again is ordered after the old work: no race") {
    auto b = PooledBuffer<float>::alloc_async(*pool, 1000, s);
    write_on(pool.fake(), s, b);
    REQUIRE(pool.fake().hazards().empty());
  }
  pool.fake().complete_all();
}

TEST_CASE("the fast path makes no device call under StreamChecks::none, one id query under "
          "identity, and two queries under full") {
  using streampool::StreamChecks;
  for (auto [checks, per_allocation] : {std::pair{StreamChecks::none, 0},
                                       std::pair{StreamChecks::identity, 1},
                                       std::pair{StreamChecks::full, 2}}) {
    auto options = test_options();
    options.stream_checks = checks;
    PoolOnFake pool(options);
    cudaStream_t s = pool.fake().create_stream();
    PooledBuffer<int>::alloc_async(*pool, 64, s).reset();  // warm: the class has a block on s
    const auto before = pool.fake().total_calls();
    for (int i = 0; i < 100; ++i) PooledBuffer<int>::alloc_async(*pool, 64, s).reset();
    CAPTURE(static_cast<int>(checks));
    REQUIRE(pool.fake().total_calls() - before == 100u * per_allocation);
    REQUIRE(pool.fake().calls(FakeDevice::Call::event_record) == 0);
  }
}

TEST_CASE("large blocks are reused on their stream at once too") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  void* first = nullptr;
  {
    auto a = PooledBuffer<std::byte>::alloc_async(*pool, 48 << 20, s);
    write_on(pool.fake(), s, a);
    first = a.data();
  }
  const auto mallocs = pool.fake().calls(FakeDevice::Call::malloc);
  auto b = PooledBuffer<std::byte>::alloc_async(*pool, 48 << 20, s);
  REQUIRE(static_cast<void*>(b.data()) == first);
  REQUIRE(pool.fake().calls(FakeDevice::Call::malloc) == mallocs);
  write_on(pool.fake(), s, b);
  REQUIRE(pool.fake().hazards().empty());
  b.reset();
  pool.fake().complete_all();
}
