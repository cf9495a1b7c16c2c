// The shelf (PoolOptions::large_shelf): large ranges a stream dropped, kept on the stream for its
// own requests, and given back to the arena whenever anyone else could need them.
#include "pool_helpers.hpp"

#include <vector>

using streampool::FakeDevice;
using streampool::PoolBreakdown;
using Call = streampool::FakeDevice::Call;
using Bytes = streampool::PooledBuffer<std::byte>;

namespace {
constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

streampool::PoolOptions shelf_options(std::uint32_t shelf = 4) {
  auto options = test_options();
  options.segment_bytes = 20 * MiB;
  options.large_rounding = 128 * KiB;
  options.large_shelf = shelf;
  return options;
}
}  // namespace

TEST_CASE("a large buffer dropped on its stream waits on that stream's shelf for its next request") {
  PoolOnFake pool(shelf_options());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  auto first = Bytes::alloc_async(*pool, 1 * MiB, a);
  std::byte* const at = first.data();
  write_on(fake, a, first);
  first.reset();  // its work still pending: a's, usable on a at once

  PoolBreakdown parts = pool->breakdown();
  CHECK(parts.shelved_ranges == 1);
  CHECK(parts.shelved_bytes == static_cast<std::int64_t>(1 * MiB));
  CHECK(parts.free_owned_bytes == 0);  // not in the arena
  const auto hits = pool->stats().cache_hits;

  SECTION("the same size comes back from the shelf, on the same stream, pending work or not") {
    auto again = Bytes::alloc_async(*pool, 1 * MiB, a);
    CHECK(again.data() == at);
    CHECK(pool->stats().cache_hits == hits + 1);
    CHECK(pool->breakdown().shelved_ranges == 0);
    write_on(fake, a, again);
  }
  SECTION("a request of the range's rounded size takes it; a smaller one does not") {
    auto near = Bytes::alloc_async(*pool, 1 * MiB - 100 * KiB, a);  // rounds up to 1 MiB
    CHECK(near.data() == at);
    near.reset();
    REQUIRE(pool->breakdown().shelved_ranges == 1);
    // 896 KiB: the shelf holds no range of that size; the request goes to the arena, and the
    // shelf with it (its ranges are the arena's to cut from again).
    auto smaller = Bytes::alloc_async(*pool, 1 * MiB - 128 * KiB, a);
    CHECK(pool->breakdown().shelved_ranges == 0);
    write_on(fake, a, smaller);
  }
  SECTION("a larger request does not take it") {
    auto larger = Bytes::alloc_async(*pool, 1 * MiB + 1, a);
    CHECK(larger.data() != at);
    CHECK(pool->breakdown().shelved_ranges == 0);  // back in the arena, a's own
    write_on(fake, a, larger);
  }
  SECTION("another stream does not get it while a's work is pending") {
    cudaStream_t b = fake.create_stream();
    // The arena has 19 MiB clean after the range: b is served there, and the shelf stays.
    auto other = Bytes::alloc_async(*pool, 1 * MiB, b);
    CHECK(other.data() != at);
    write_on(fake, b, other);
  }
  fake.complete_all();
  CHECK(fake.hazards().empty());
}

TEST_CASE("a shelf holds at most large_shelf ranges; the oldest go back to the arena") {
  PoolOnFake pool(shelf_options(2));
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  std::vector<Bytes> buffers;
  for (int i = 0; i < 4; ++i) buffers.push_back(Bytes::alloc_async(*pool, (i + 1) * MiB, a));
  std::byte* const newest = buffers.back().data();
  for (Bytes& buffer : buffers) write_on(fake, a, buffer);
  buffers.clear();  // dropped in order: 1, 2, 3, 4 MiB

  const PoolBreakdown parts = pool->breakdown();
  CHECK(parts.shelved_ranges == 2);
  CHECK(parts.shelved_bytes == static_cast<std::int64_t>((3 + 4) * MiB));
  CHECK(parts.free_owned_bytes == static_cast<std::int64_t>((1 + 2) * MiB));
  auto again = Bytes::alloc_async(*pool, 4 * MiB, a);
  CHECK(again.data() == newest);
  write_on(fake, a, again);
  fake.complete_all();
  CHECK(fake.hazards().empty());
}

TEST_CASE("large_shelf=0: every large drop goes to the arena") {
  PoolOnFake pool(shelf_options(0));
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  auto buffer = Bytes::alloc_async(*pool, 1 * MiB, a);
  write_on(fake, a, buffer);
  buffer.reset();
  const PoolBreakdown parts = pool->breakdown();
  CHECK(parts.shelved_ranges == 0);
  CHECK(parts.free_owned_bytes == static_cast<std::int64_t>(1 * MiB));
  fake.complete_all();
}

TEST_CASE("shelved memory goes to another stream before the arena grows") {
  // One segment, filled by b's first slab and a's two 10 MiB buffers, both dropped onto a's shelf.
  auto options = shelf_options();
  options.slab_bytes = 1 * MiB;
  options.segment_bytes = 21 * MiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  Bytes::alloc_async(*pool, 1 * KiB, b).reset();  // the pool knows two streams: drops are fenced
  {
    auto x = Bytes::alloc_async(*pool, 10 * MiB, a);
    auto y = Bytes::alloc_async(*pool, 10 * MiB, a);
    write_on(fake, a, x);
    write_on(fake, a, y);
  }
  REQUIRE(pool->breakdown().shelved_ranges == 2);
  REQUIRE(pool->stats().device_allocations == 1);

  SECTION("once a's work is done, b's 20 MiB request takes both, merged, without growing") {
    fake.complete(a);
    auto whole = Bytes::alloc_async(*pool, 20 * MiB, b);
    CHECK(pool->stats().device_allocations == 1);
    CHECK(pool->breakdown().shelved_ranges == 0);
    write_on(fake, b, whole);
  }
  SECTION("while a's work is pending, b gets new memory, never a's") {
    auto other = Bytes::alloc_async(*pool, 10 * MiB, b);
    CHECK(pool->stats().device_allocations == 2);
    write_on(fake, b, other);
    // The shelf went back to the arena, still a's: a's next request finds its range there.
    auto mine = Bytes::alloc_async(*pool, 10 * MiB, a);
    CHECK(pool->stats().device_allocations == 2);
    write_on(fake, a, mine);
  }
  fake.complete_all();
  CHECK(fake.hazards().empty());
}

// Found in review (2026-12-06): a growth of the arena for a slab did not send the shelves back
// first, as every other growth does: a shelved range whose fence had completed was left there and
// the device grew instead.
TEST_CASE("a slab's growth sends the shelves back to the arena first") {
  auto options = shelf_options(2);
  options.segment_bytes = 2 * MiB;
  options.fence_every_free = true;  // every drop fenced: a's fences known complete below
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream("a");
  cudaStream_t b = fake.create_stream("b");
  auto on_b = Bytes::alloc_async(*pool, 1 * KiB, b);  // a 256 KiB slab of the first segment
  auto rest = Bytes::alloc_async(*pool, 2 * MiB - 256 * KiB, a);  // the rest of that segment
  REQUIRE(pool->stats().device_allocations == 1);
  write_on(fake, a, rest);
  rest.reset();
  REQUIRE(pool->breakdown().shelved_ranges == 1);
  fake.complete(a);
  for (int i = 0; i < 10; ++i) Bytes::alloc_async(*pool, 1 * KiB, a).reset();  // learns it
  // A slab of another class, for b: the only room is the shelved range.
  auto other_class = Bytes::alloc_async(*pool, 8 * KiB, b);
  CHECK(pool->breakdown().shelved_ranges == 0);
  CHECK(pool->stats().device_allocations == 1);
  write_on(fake, b, other_class);
  fake.complete_all();
  CHECK(fake.hazards().empty());
}

TEST_CASE("the out-of-memory ladder takes shelved memory back") {
  auto options = shelf_options();
  options.max_reserved_bytes = 20 * MiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 20 * MiB, a);
    write_on(fake, a, x);
  }
  REQUIRE(pool->breakdown().shelved_ranges == 1);
  // No room to grow: b's request waits (a device synchronize) for a's work, then takes the range.
  auto y = Bytes::alloc_async(*pool, 20 * MiB, b);
  CHECK(pool->stats().device_allocations == 1);
  CHECK(pool->stats().reserved_bytes.current == static_cast<std::int64_t>(20 * MiB));
  write_on(fake, b, y);
  fake.complete_all();
  CHECK(fake.hazards().empty());
}

TEST_CASE("trim and release_stream empty the shelves") {
  PoolOnFake pool(shelf_options());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 4 * MiB, a);
    write_on(fake, a, x);
  }
  REQUIRE(pool->breakdown().shelved_ranges == 1);
  SECTION("trim(0) gives the whole segment back") {
    pool->trim(0);
    CHECK(pool->breakdown().shelved_ranges == 0);
    CHECK(pool->stats().reserved_bytes.current == 0);
  }
  SECTION("release_stream") {
    pool->release_stream(a);
    CHECK(pool->breakdown().shelved_ranges == 0);
    fake.complete_all();
    pool->trim(0);
    CHECK(pool->stats().reserved_bytes.current == 0);
  }
  CHECK(fake.live_bytes() == static_cast<std::size_t>(pool->stats().reserved_bytes.current));
}

TEST_CASE("large_shelf is a STREAMPOOL_CONF key, at most 64") {
  using streampool::PoolOptions;
  CHECK(PoolOptions{}.large_shelf == 2);
  CHECK(PoolOptions::parse("large_shelf=0").large_shelf == 0);
  CHECK(PoolOptions::parse("large_shelf=64").large_shelf == 64);
  CHECK_THROWS_WITH(PoolOptions::parse("large_shelf=65"), Catch::Contains("large_shelf"));
  PoolOptions o;
  o.large_shelf = 9;
  CHECK(PoolOptions::parse(o.to_conf()) == o);
  o.large_shelf = 1000;
  CHECK_THAT(o.validate(), Catch::Contains("large_shelf"));
}

// Found in review (2026-12-05). The fence policy (docs/design.md, "Fence policy"): a fence is recorded only inside a call that
// names its stream, because a user may destroy a stream as soon as its buffers are dropped. A
// shelved range that another stream's call sends back to the arena (unshelve_all: before a
// growth, the out-of-memory ladder's first step, trim) went through to_arena, whose tainted
// neighbours could push the range's stream past its unfenced bound and make it record a fence on
// that stream: cudaStreamGetCaptureInfo and cudaEventRecord on a stream the call does not name,
// which may be destroyed, or (its handle reused) another stream, whose fence then "covers" the
// first stream's pending work.
// Fix: to_arena records the fence only where the call names the stream; from unshelve_all it
// asks the stream's next call for one (wants_fence), as ask_owners does.
TEST_CASE("a shelved range sent back to the arena by another stream's call records no fence on "
          "its stream") {
  // One 2 MiB segment holds a 1.5 MiB range and a clean 0.5 MiB rest: when the range goes from
  // its stream's shelf back to the arena, the rest merges into it (tainted bytes, counted against
  // its stream's unfenced bound).
  auto options = test_options();
  options.segment_bytes = 2 * MiB;
  options.large_rounding = 128 * KiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream("a");
  void* dropped = nullptr;
  {
    // One stream so far: no unfenced bound, so the drop records no fence; onto a's shelf.
    auto x = Bytes::alloc_async(*pool, 1536 * KiB, a);
    write_on(fake, a, x);
    dropped = x.data();
  }
  REQUIRE(fake.calls(Call::event_record) == 0);

  SECTION("no event is recorded during a call that names only b") {
    cudaStream_t b = fake.create_stream("b");
    const auto records = fake.calls(Call::event_record);
    auto y = Bytes::alloc_async(*pool, 1536 * KiB, b);  // misses, sends a's shelf to the arena
    write_on(fake, b, y);
    CHECK(fake.calls(Call::event_record) == records);
    CHECK(static_cast<void*>(y.data()) != dropped);  // a's write may still run
    CHECK(fake.hazards().empty());
  }

  SECTION("a destroyed stream whose handle went to another: no block reaches b early") {
    // Every buffer of a is dropped: the user may destroy it (identity checks need no
    // release_stream). Its write is still pending; its handle goes to the next stream.
    fake.destroy_stream(a);
    cudaStream_t c = fake.create_stream("c, a's handle");
    REQUIRE(c == a);
    cudaStream_t b = fake.create_stream("b");
    auto y = Bytes::alloc_async(*pool, 1536 * KiB, b);
    write_on(fake, b, y);
    INFO(first_hazard(fake));
    CHECK(static_cast<void*>(y.data()) != dropped);
    CHECK(fake.hazards().empty());
  }
  fake.complete_all();
}
