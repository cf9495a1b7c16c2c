// The large tier's arena: which free range a request gets, and when it grows instead.
#include "pool_helpers.hpp"

#include <cstdint>
#include <vector>

using streampool::FakeDevice;
using Bytes = streampool::PooledBuffer<std::byte>;

namespace {
constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Options for the arena alone: a dropped range goes to the arena, not to its stream's shelf
// (pool_large_shelf.cpp).
streampool::PoolOptions arena_options() {
  auto options = test_options();
  options.large_shelf = 0;
  return options;
}
}  // namespace

TEST_CASE("a clean range is found however many other streams' pending ranges are as large") {
  // Seventy streams each drop a range of 384 KiB while their work is pending: free, but theirs
  // until their fences complete. The rest of the second segment is clean. A new stream asking
  // for 384 KiB must get the clean rest, not a new segment, though seventy ranges of the same
  // size (and so, in size order, before the clean one) are not usable by it.
  auto options = arena_options();
  options.segment_bytes = 20 * MiB;
  options.large_rounding = 128 * KiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  std::vector<cudaStream_t> others;
  for (int i = 0; i < 70; ++i) {
    cudaStream_t s = fake.create_stream();
    others.push_back(s);
    auto buffer = Bytes::alloc_async(*pool, 384 * KiB, s);
    write_on(fake, s, buffer);
  }
  REQUIRE(pool->stats().device_allocations == 2);
  const auto parts = pool->breakdown();
  // (the first segment's last 128 KiB went into the range beside it: no larger than it)
  REQUIRE(parts.free_owned_bytes == static_cast<std::int64_t>(70 * 384 * KiB + 128 * KiB));
  REQUIRE(parts.free_clean_bytes >= static_cast<std::int64_t>(13 * MiB));

  cudaStream_t mine = fake.create_stream();
  auto buffer = Bytes::alloc_async(*pool, 384 * KiB, mine);
  CHECK(pool->stats().device_allocations == 2);
  write_on(fake, mine, buffer);
  fake.complete_all();
  REQUIRE(fake.hazards().empty());
}

TEST_CASE("a clean range larger than a range dropped beside it stays usable by every stream") {
  // One segment of 9 MiB: stream a's 1 MiB buffer, dropped while its work is pending (a's own),
  // and the clean 8 MiB after it. Taken into a's range, the 8 MiB would wait for a's fence; apart,
  // stream b gets it without the arena growing.
  auto options = arena_options();
  options.segment_bytes = 9 * MiB;
  options.large_rounding = 128 * KiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  auto small = Bytes::alloc_async(*pool, 1 * MiB, a);
  std::byte* const base = small.data();
  write_on(fake, a, small);
  small.reset();
  auto parts = pool->breakdown();
  REQUIRE(parts.free_ranges == 2);
  REQUIRE(parts.free_owned_bytes == static_cast<std::int64_t>(1 * MiB));
  REQUIRE(parts.free_clean_bytes == static_cast<std::int64_t>(8 * MiB));

  auto big = Bytes::alloc_async(*pool, 8 * MiB, b);
  CHECK(big.data() == base + 1 * MiB);
  CHECK(pool->stats().device_allocations == 1);
  write_on(fake, b, big);
  fake.complete_all();
  REQUIRE(fake.hazards().empty());
}

TEST_CASE("a stream's own range and the clean ranges after it serve a request neither holds") {
  // a's pending 1 MiB and the clean 8 MiB after it, in one 9 MiB segment: a 9 MiB request on a
  // uses both (its own at once, the clean one anywhere) instead of a new segment.
  auto options = arena_options();
  options.segment_bytes = 9 * MiB;
  options.large_rounding = 128 * KiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  auto small = Bytes::alloc_async(*pool, 1 * MiB, a);
  std::byte* const base = small.data();
  write_on(fake, a, small);
  small.reset();
  REQUIRE(pool->breakdown().free_ranges == 2);

  auto whole = Bytes::alloc_async(*pool, 9 * MiB, a);
  CHECK(whole.data() == base);
  CHECK(pool->stats().device_allocations == 1);
  write_on(fake, a, whole);
  fake.complete_all();
  REQUIRE(fake.hazards().empty());
}

TEST_CASE("what is left of a clean range taken with a stream's own stays clean for every stream") {
  // One 9 MiB segment: a's pending 1 MiB, then 4 MiB that b dropped with no work pending (its
  // fence completes at once), then b's live 4 MiB. A request of 4.5 MiB on a fits in neither free
  // range alone; it takes a's and the first 3.5 MiB of b's, and the last 512 KiB stay clean.
  auto options = arena_options();
  options.segment_bytes = 9 * MiB;
  options.large_rounding = 128 * KiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  auto mine = Bytes::alloc_async(*pool, 1 * MiB, a);
  auto gap = Bytes::alloc_async(*pool, 4 * MiB, b);
  auto kept = Bytes::alloc_async(*pool, 4 * MiB, b);
  std::byte* const base = mine.data();
  write_on(fake, a, mine);
  mine.reset();
  gap.reset();

  auto request = Bytes::alloc_async(*pool, 4 * MiB + 512 * KiB, a);
  CHECK(request.data() == base);
  CHECK(pool->stats().device_allocations == 1);
  const auto parts = pool->breakdown();
  CHECK(parts.free_owned_bytes == 0);
  CHECK(parts.free_clean_bytes == static_cast<std::int64_t>(512 * KiB));
  write_on(fake, a, request);
  fake.complete_all();
  REQUIRE(fake.hazards().empty());
}

TEST_CASE("a stream gets back the range of a block another stream used once that use is done") {
  // One 48 MiB segment: s's 8 MiB input, which c uses, then s's live 1 MiB, then s's 32 MiB
  // dropped with its work pending (s's own), then the clean 7 MiB rest. The input goes back in
  // one of the two ways a block used on another stream can: dropped after record_stream(c) (it
  // parks until c's fence), or freed on c through the raw API (as cudaFreeAsync allows: it is
  // then c's own range, waiting for c's fence). Either way it is the tightest fit for s's next
  // 8 MiB.
  auto options = arena_options();
  options.segment_bytes = 48 * MiB;
  options.large_rounding = 128 * KiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t c = fake.create_stream();
  const bool raw = GENERATE(false, true);
  CAPTURE(raw);
  Bytes input;
  void* place = nullptr;
  if (raw) place = pool->allocate(8 * MiB, s);
  else input = Bytes::alloc_async(*pool, 8 * MiB, s);
  auto between = Bytes::alloc_async(*pool, 1 * MiB, s);
  auto work = Bytes::alloc_async(*pool, 32 * MiB, s);
  if (raw) {
    fake.launch(c, {{place, 8 * MiB, true}});
    pool->deallocate(place, 8 * MiB, c);
  } else {
    place = input.data();
    input.record_stream(c);
    write_on(fake, c, input);
    input.reset();
    REQUIRE(pool->breakdown().parked_blocks == 1);
  }

  SECTION("once c's work is done") {
    // Nothing but learning that keeps the input waiting: s gets it back where it was (it fits
    // exactly), not a cut of its own 32 MiB, which would split a range it may ask for next while
    // the input's place stays idle.
    fake.complete_all();
    write_on(fake, s, work);
    work.reset();
    auto next = Bytes::alloc_async(*pool, 8 * MiB, s);
    CHECK(next.data() == place);
    CHECK(pool->stats().device_allocations == 1);
    CHECK(pool->breakdown().parked_blocks == 0);
    write_on(fake, s, next);
  }
  SECTION("while c's write is still running") {
    // s must get other memory (the fake device reports a race if it got the input's).
    write_on(fake, s, work);
    work.reset();
    auto next = Bytes::alloc_async(*pool, 8 * MiB, s);
    CHECK(next.data() != place);
    write_on(fake, s, next);
  }
  fake.complete_all();
  INFO(first_hazard(fake));
  REQUIRE(fake.hazards().empty());
}

TEST_CASE("a large request asks the fences of parked ranges only when one has its size") {
  // Learning which parked ranges are clean is an event query for each stream they wait for; it
  // is what a request needs to get back a parked range of its size where it was (above). On the
  // H200 under the stress bench, asking it at every large request cost about 12 queries a buffer
  // and most of an allocation's time, for requests of sizes no parked range had.
  auto fake = std::make_shared<FakeDevice>();
  auto options = arena_options();
  options.segment_bytes = 48 * MiB;
  options.large_rounding = 128 * KiB;
  streampool::MemoryPool pool(fake, options);
  cudaStream_t s = fake->create_stream();
  cudaStream_t c = fake->create_stream();
  auto input = Bytes::alloc_async(pool, 8 * MiB, s);
  auto work = Bytes::alloc_async(pool, 16 * MiB, s);
  void* const place = input.data();
  input.record_stream(c);
  write_on(*fake, c, input);
  input.reset();  // parked: c's write is still running
  write_on(*fake, s, work);
  work.reset();  // s's own range, usable on s at once
  REQUIRE(pool.breakdown().parked_blocks == 1);
  // The event queries from here on: each asks whether a fence completed.
  const std::uint64_t queried_before = fake->calls(FakeDevice::Call::event_query);
  const auto queries = [&] { return fake->calls(FakeDevice::Call::event_query) - queried_before; };

  SECTION("a size no parked range has") {
    auto other = Bytes::alloc_async(pool, 4 * MiB, s);
    CHECK(queries() == 0);
    CHECK(pool.breakdown().parked_blocks == 1);
    CHECK(pool.stats().device_allocations == 1);
    write_on(*fake, s, other);
  }
  SECTION("the parked range's size, while c's write runs") {
    auto same = Bytes::alloc_async(pool, 8 * MiB, s);
    CHECK(queries() > 0);  // c's fence asked, and not completed
    CHECK(same.data() != place);
    write_on(*fake, s, same);
  }
  SECTION("only the fences the ranges of its size wait for") {
    // A range of another size parked for d, whose work is done: asking for the input's size
    // asks c's fence (and s's), not d's, so that range is not learned clean yet.
    cudaStream_t d = fake->create_stream();
    auto side = Bytes::alloc_async(pool, 2 * MiB, s);  // a cut of s's own range: s's write
    REQUIRE(fake->stream_synchronize(s) == cudaSuccess);  // orders d's write after s's
    side.record_stream(d);
    write_on(*fake, d, side);
    side.reset();
    REQUIRE(pool.breakdown().parked_blocks == 2);
    fake->complete(d);
    auto same = Bytes::alloc_async(pool, 8 * MiB, s);
    CHECK(same.data() != place);  // c's write still runs
    CHECK(pool.breakdown().parked_blocks == 2);
    write_on(*fake, s, same);
  }
  SECTION("the parked range's size, once c's write is done") {
    fake->complete_all();
    auto same = Bytes::alloc_async(pool, 8 * MiB, s);
    CHECK(queries() > 0);
    CHECK(same.data() == place);
    CHECK(pool.breakdown().parked_blocks == 0);
    write_on(*fake, s, same);
  }
  fake->complete_all();
  INFO(first_hazard(*fake));
  REQUIRE(fake->hazards().empty());
}
