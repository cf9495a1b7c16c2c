// release_stream with buffers of the stream still alive: what is dropped on a released stream
// after its last fence is not covered by that fence, and must not reach another stream until its
// own work is done, whatever the pool does with the released stream's state meanwhile.
#include "pool_helpers.hpp"

#include <optional>

using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

}  // namespace

TEST_CASE("a block dropped on a stream while release_stream waits for it is not handed over "
          "before its own work") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, a));
  void* const dropped = x->data();
  // The body runs while release_stream waits for A's fence: it stands for another thread that,
  // meanwhile, enqueues more work on A using x, then drops x (as it may: x is still alive).
  fake.launch(a, {}, [&] {
    fake.launch(a, {{dropped, 4096, true}});
    x.reset();
  });
  pool->release_stream(a);
  REQUIRE_FALSE(x.has_value());
  REQUIRE(fake.pending_work() == 1);  // the work enqueued after the fence

  auto y = Bytes::alloc_async(*pool, 4096, b);
  write_on(fake, b, y);
  CAPTURE(static_cast<void*>(y.data()) == dropped);
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}

TEST_CASE("a large block dropped on a released stream is not handed at once to the stream that "
          "next gets the released stream's place") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 8 * MiB, a);
    pool->release_stream(a);  // x is still alive: allowed
    write_on(fake, a, x);     // pending when x is dropped
  }
  // Other streams come and go: the pool may reuse what it kept for the streams it forgot.
  for (int i = 0; i < 3; ++i) {
    cudaStream_t passing = fake.create_stream();
    Bytes::alloc_async(*pool, 100, passing).reset();
    pool->release_stream(passing);
  }
  for (int i = 0; i < 3; ++i) {
    cudaStream_t fresh = fake.create_stream();
    auto y = Bytes::alloc_async(*pool, 8 * MiB, fresh);
    write_on(fake, fresh, y);
  }
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}
