// Streams that join a capture: a stream that waits on an event recorded in a capture under way
// is part of that capture until the stream that began it waits back on it (CUDA's fork and
// join; the device contract's case). Work the joined stream enqueues meanwhile is the graph's,
// so a buffer it drops meanwhile is the graph's to use at every replay, as a drop on the
// capturing stream itself is.
#include "fake_helpers.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

using streampool::CapturedGraph;
using streampool::CaptureMode;
using streampool::CapturePool;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {
constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
}  // namespace

TEST_CASE("a buffer dropped on a stream that joined a capture is kept for the graph's replays") {
  const std::size_t bytes = GENERATE(std::size_t{4 * KiB}, std::size_t{3 * MiB});
  const CaptureMode mode =
      GENERATE(CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed);
  CAPTURE(bytes, static_cast<int>(mode));
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t origin = fake.create_stream("origin");
  cudaStream_t side = fake.create_stream("side");
  cudaStream_t other = fake.create_stream("other");
  auto x = Bytes::alloc_async(*pool, bytes, side);
  write_on(fake, side, x);
  fake.complete_all();
  const void* x_at = x.data();

  auto cp = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(cp, origin, mode);
  cudaEvent_t fork = nullptr;
  cudaEvent_t back = nullptr;
  REQUIRE(fake.event_create(&fork) == cudaSuccess);
  REQUIRE(fake.event_create(&back) == cudaSuccess);
  REQUIRE(fake.event_record(fork, origin) == cudaSuccess);
  REQUIRE(fake.stream_wait_event(side, fork) == cudaSuccess);  // side joins the capture
  fake.launch(side, {{x.data(), bytes, false}}, {}, "graph reads x");  // the graph's work
  x.reset();  // on side, during the capture it joined
  REQUIRE(fake.event_record(back, side) == cudaSuccess);
  REQUIRE(fake.stream_wait_event(origin, back) == cudaSuccess);  // side joined back
  CapturedGraph graph = streampool::end_capture_with_pool(origin, cp);
  REQUIRE(fake.event_destroy(fork) == cudaSuccess);
  REQUIRE(fake.event_destroy(back) == cudaSuccess);

  // Everything enqueued so far is done and the pool is trimmed: whatever the pool thinks free
  // now, it may hand out.
  fake.complete_all();
  pool->trim();
  auto y = Bytes::alloc_async(*pool, bytes, other);
  write_on(fake, other, y);
  graph.launch(origin);  // reads x's memory, which the graph still owns
  fake.complete_all();
  INFO(first_hazard(fake));
  CHECK(static_cast<const void*>(y.data()) != x_at);
  CHECK(fake.hazards().empty());
  y.reset();
  fake.complete_all();
}
