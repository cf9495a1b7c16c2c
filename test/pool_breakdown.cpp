// MemoryPool::breakdown(): where the reserved memory is, part by part, in scenarios whose every
// byte is known; and the formatter names every field.
#include "pool_helpers.hpp"

#include <streampool/format.hpp>

#include <fmt/format.h>

#include <atomic>
#include <thread>
#include <vector>

using streampool::FakeDevice;
using streampool::PoolBreakdown;
using Bytes = streampool::PooledBuffer<std::byte>;

namespace {

constexpr std::int64_t KiB = std::int64_t{1} << 10;
constexpr std::int64_t MiB = std::int64_t{1} << 20;

streampool::PoolOptions breakdown_options() {
  auto options = test_options();
  options.segment_bytes = 20 << 20;
  options.slab_bytes = 1 << 20;
  options.large_shelf = 0;  // the arena's parts: a dropped range goes there, not to a shelf
  return options;
}

}  // namespace

TEST_CASE("an empty pool's breakdown is all zeros") {
  PoolOnFake pool(breakdown_options());
  const PoolBreakdown b = pool->breakdown();
  REQUIRE(b.segments == 0);
  REQUIRE(b.segment_bytes == 0);
  REQUIRE(b.free_ranges == 0);
  REQUIRE(b.parked_blocks == 0);
}

TEST_CASE("a large buffer: its segment, the free rest, then a range owned by its stream beside it") {
  PoolOnFake pool(breakdown_options());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  auto buffer = Bytes::alloc_async(*pool, 4 * MiB, a);

  PoolBreakdown b = pool->breakdown();
  REQUIRE(b.segments == 1);
  REQUIRE(b.segment_bytes == 20 * MiB);
  REQUIRE(b.segment_bytes == pool->stats().reserved_bytes.current);
  REQUIRE(b.slab_bytes == 0);
  REQUIRE(b.free_ranges == 1);
  REQUIRE(b.free_clean_bytes == 16 * MiB);
  REQUIRE(b.free_owned_bytes == 0);
  REQUIRE(b.largest_free_range == 16 * MiB);
  REQUIRE(b.parked_blocks == 0);

  // Dropped while its work is pending: a's own, beside the clean rest (which does not wait).
  write_on(fake, a, buffer);
  buffer.reset();
  b = pool->breakdown();
  REQUIRE(b.free_ranges == 2);
  REQUIRE(b.free_clean_bytes == 16 * MiB);
  REQUIRE(b.free_owned_bytes == 4 * MiB);
  REQUIRE(b.largest_free_range == 16 * MiB);

  // Once the device is synchronized (trim), the range is clean and the segment goes back.
  pool->trim();
  b = pool->breakdown();
  REQUIRE(b.segments == 0);
  REQUIRE(b.free_ranges == 0);
}

TEST_CASE("a buffer recorded on a second stream is parked until both streams' fences complete") {
  PoolOnFake pool(breakdown_options());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t other = fake.create_stream();
  auto buffer = Bytes::alloc_async(*pool, 3 * MiB, a);
  write_on(fake, a, buffer);
  buffer.record_stream(other);
  fake.launch(other, {{buffer.data(), buffer.byte_size(), false}});
  buffer.reset();

  PoolBreakdown b = pool->breakdown();
  REQUIRE(b.parked_blocks == 1);
  REQUIRE(b.parked_bytes == 3 * MiB);
  REQUIRE(b.free_clean_bytes == 17 * MiB);
  REQUIRE(b.free_owned_bytes == 0);

  // Both streams' work completes; the next allocation that misses drains the parked block.
  fake.complete(a);
  fake.complete(other);
  auto larger = Bytes::alloc_async(*pool, 18 * MiB, a);
  b = pool->breakdown();
  REQUIRE(b.parked_blocks == 0);
  REQUIRE(b.parked_bytes == 0);
  REQUIRE(b.segments == 1);  // the clean 3 MiB merged back: 18 MiB fit without growing
  REQUIRE(b.free_clean_bytes == 2 * MiB);
}

TEST_CASE("small blocks: the slab, the free blocks on their stream's list and in the depot") {
  PoolOnFake pool(breakdown_options());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  auto one = Bytes::alloc_async(*pool, 1000, a);
  const streampool::SizeClasses classes(pool->options().size_classes);
  const auto block = static_cast<std::int64_t>(classes.block_size(classes.class_of(1000)));

  PoolBreakdown b = pool->breakdown();
  REQUIRE(b.segments == 1);
  REQUIRE(b.slab_bytes == 1 * MiB);
  REQUIRE(b.free_clean_bytes == 19 * MiB);
  const std::int64_t blocks_in_slab = 1 * MiB / block;
  REQUIRE(b.small_cached_bytes + b.small_depot_bytes == (blocks_in_slab - 1) * block);

  one.reset();
  b = pool->breakdown();
  REQUIRE(b.small_cached_bytes + b.small_depot_bytes == blocks_in_slab * block);
  REQUIRE(b.small_cached_bytes >= block);  // the dropped one is on a's list
  REQUIRE(b.parked_blocks == 0);
}

TEST_CASE("the formatted breakdown names every field with its value") {
  PoolBreakdown b;
  b.segments = 1;
  b.segment_bytes = 2;
  b.slab_bytes = 3;
  b.small_cached_bytes = 4;
  b.small_depot_bytes = 5;
  b.free_ranges = 6;
  b.free_clean_bytes = 7;
  b.free_owned_bytes = 8;
  b.largest_free_range = 9;
  b.shelved_ranges = 12;
  b.shelved_bytes = 13;
  b.parked_blocks = 10;
  b.parked_bytes = 11;
  b.stranded_blocks = 14;
  b.stranded_bytes = 15;
  const std::string text = fmt::format("{}", b);
  CAPTURE(text);
  REQUIRE(text ==
          "segments 1 (2 bytes); slabs 3 bytes (free: 4 on streams, 5 in the depot); free ranges 6 "
          "(7 bytes clean, 8 owned, largest 9); shelved 12 (13 bytes); parked 10 (11 bytes); "
          "stranded 14 (15 bytes)");
  REQUIRE(text == streampool::to_string(b));
}

TEST_CASE("blocks parked behind fences that completed go back at the next park, not at a miss") {
  // A copy-stream pattern that the GPU keeps up with: each buffer is written on a, read on o
  // (record_stream) and dropped, and both streams complete before the next. Each drop parks its
  // buffer; the older ones, whose fences are known to have completed, go back as later ones
  // park. Without that they stay parked until an allocation misses: a segment's worth.
  auto options = breakdown_options();
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  cudaEvent_t written = nullptr;
  REQUIRE(fake.event_create(&written) == cudaSuccess);
  std::int64_t most_parked = 0;
  for (int i = 0; i < 200; ++i) {
    auto buffer = Bytes::alloc_async(*pool, 1 * MiB, a);
    write_on(fake, a, buffer);
    REQUIRE(fake.event_record(written, a) == cudaSuccess);
    REQUIRE(fake.stream_wait_event(o, written) == cudaSuccess);
    buffer.record_stream(o);
    fake.launch(o, {{buffer.data(), buffer.byte_size(), false}});
    buffer.reset();
    fake.complete(a);
    fake.complete(o);
    most_parked = std::max(most_parked, pool->breakdown().parked_blocks);
  }
  CAPTURE(most_parked);
  CHECK(most_parked <= 10);
  CHECK(pool->stats().device_allocations == 1);
  REQUIRE(fake.hazards().empty());
  fake.event_destroy(written);
}

TEST_CASE("a breakdown may be taken while other threads allocate, record and drop", "[threads]") {
  // Small and large buffers on three threads' streams, a third recorded on a second stream, the
  // device completing everything at once; the main thread takes breakdowns meanwhile. What each
  // walk sees is consistent, and ThreadSanitizer sees no race between the walks and the threads'
  // drops and slab carving.
  PoolOnFake pool(breakdown_options());
  FakeDevice& fake = pool.fake();
  fake.set_auto_complete(true);
  constexpr int threads = 3;
  std::vector<cudaStream_t> streams;
  for (int t = 0; t < 2 * threads; ++t) streams.push_back(fake.create_stream());
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      cudaStream_t mine = streams[static_cast<std::size_t>(2 * t)];
      cudaStream_t other = streams[static_cast<std::size_t>(2 * t + 1)];
      for (std::size_t i = 0; !stop.load(); ++i) {
        std::error_code error;
        const std::size_t bytes = i % 2 == 0 ? 1000 + 97 * (i % 64) : (i % 7 + 1) * 300 * KiB;
        auto buffer = Bytes::try_alloc_async(*pool, bytes, mine, error);
        if (error) {
          ++failures;
          return;
        }
        if (i % 3 == 0) buffer.record_stream(other);
      }
    });
  }
  for (int i = 0; i < 300; ++i) {
    // The parts are walked one after the other (a free range may become a slab in between), so
    // only what one walk sees is compared with itself: the arena's free ranges lie within its
    // segments, and the slabs within what is reserved by the end of the walk (nothing is freed).
    const PoolBreakdown b = pool->breakdown();
    const std::int64_t reserved = pool->stats().reserved_bytes.current;
    if (b.free_clean_bytes + b.free_owned_bytes > b.segment_bytes) ++failures;
    if (b.largest_free_range > b.free_clean_bytes + b.free_owned_bytes) ++failures;
    if (b.slab_bytes > reserved) ++failures;
  }
  stop = true;
  for (std::thread& worker : workers) worker.join();
  REQUIRE(failures == 0);
  REQUIRE(fake.hazards().empty());
}
