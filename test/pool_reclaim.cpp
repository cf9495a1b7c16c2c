// Reclaiming: trim and the out-of-memory ladder synchronize the device and then treat as clean
// only what that synchronize covers; drops made by other threads meanwhile keep waiting for their
// own work. Several threads may reclaim at once.
#include "fake_helpers.hpp"
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <atomic>
#include <chrono>
#include <latch>
#include <optional>
#include <thread>
#include <vector>

using fake_test::order_after;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// What another thread does with `buffer`, allocated on `a`: A writes it, C reads it after that
// write, and the buffer, named on C with record_stream, is dropped while both are pending. The
// pool parks it until a fence on each stream has completed.
void use_on_two_streams_and_drop(FakeDevice& fake, std::optional<Bytes>& buffer, cudaStream_t a,
                                 cudaStream_t c) {
  write_on(fake, a, *buffer);
  cudaEvent_t written = nullptr;
  fake.event_create(&written);
  fake.event_record(written, a);
  fake.stream_wait_event(c, written);
  fake.event_destroy(written);
  fake.launch(c, {{buffer->data(), buffer->byte_size(), false}});
  buffer->record_stream(c);
  buffer.reset();
}

}  // namespace

// Issue 8, item 4: trim and the out-of-memory ladder synchronize the device, then hand over every
// parked block as clean, including one that a record_stream'd drop on another thread parked just
// after the synchronize, with its work still pending: another stream gets it early.
TEST_CASE("trim and the out-of-memory ladder hand over no block parked after their device "
          "synchronize") {
  SECTION("trim") {
    HookedPool pool(one_block_slabs());
    FakeDevice& fake = pool.fake();
    cudaStream_t a = fake.create_stream();
    cudaStream_t b = fake.create_stream();
    cudaStream_t c = fake.create_stream();
    std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, a));
    std::shared_future<void> dropped;
    pool.device->after_next(Call::device_synchronize, [&] {
      dropped = on_own_thread([&] { use_on_two_streams_and_drop(fake, x, a, c); });
    });
    pool->trim(std::size_t{1} << 40);  // keeps the memory: it only synchronizes and reclaims
    pool.device->run_unfired();
    dropped.wait();
    REQUIRE_FALSE(x.has_value());
    REQUIRE(fake.pending_work() == 2);  // the write on A, the read on C

    auto y = Bytes::alloc_async(*pool, 4096, b);
    write_on(fake, b, y);
    INFO(first_hazard(fake));
    CHECK(fake.hazards().empty());
    fake.complete_all();
  }
  SECTION("the out-of-memory ladder") {
    auto options = test_options();
    options.segment_bytes = MiB;  // segments as large as each request
    HookedPool pool(options, FakeDevice::Options{.capacity = 48 * MiB});
    FakeDevice& fake = pool.fake();
    cudaStream_t a = fake.create_stream();
    cudaStream_t b = fake.create_stream();
    cudaStream_t c = fake.create_stream();
    std::optional<Bytes> x(Bytes::alloc_async(*pool, 40 * MiB, a));
    std::shared_future<void> dropped;
    pool.device->after_next(Call::device_synchronize, [&] {
      dropped = on_own_thread([&] { use_on_two_streams_and_drop(fake, x, a, c); });
    });
    // Does not fit beside x: the ladder climbs to its device synchronize, and retries after it.
    std::error_code error;
    auto y = Bytes::try_alloc_async(*pool, 40 * MiB, b, error);
    pool.device->run_unfired();
    dropped.wait();
    REQUIRE_FALSE(x.has_value());
    if (!y.is_empty()) write_on(fake, b, y);
    INFO(first_hazard(fake));
    CHECK(fake.hazards().empty());
    fake.complete_all();
  }
}

// Issue 8, item 5: make_clean read the blocks it handed to the depot once more after letting go
// of the depot's lock, while another thread's return_free_slabs could already have freed their
// slab: a heap use after free. A race, so a loop of a few seconds; AddressSanitizer and
// ThreadSanitizer builds reported it within seconds.
TEST_CASE("several threads may trim at once while others allocate", "[threads]") {
  PoolOnFake pool(one_block_slabs());  // a block in the depot may complete its slab
  FakeDevice& fake = pool.fake();
  constexpr int threads = 4;
  std::vector<cudaStream_t> streams;
  for (int t = 0; t < threads; ++t) streams.push_back(fake.create_stream());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::latch start(threads);
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, s = streams[static_cast<std::size_t>(t)]] {
      start.arrive_and_wait();
      while (std::chrono::steady_clock::now() < until) {
        {
          std::vector<Bytes> kept;
          for (int i = 0; i < 16; ++i) {
            std::error_code error;
            kept.push_back(Bytes::try_alloc_async(*pool, 4096, s, error));
            if (error) ++failures;
          }
        }
        pool->trim(std::size_t{1} << 40);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  REQUIRE(failures == 0);
  REQUIRE(fake.hazards().empty());
  REQUIRE(pool->stats().live_allocations.current == 0);
}

// Issue 8, "also": a stream state's `recyclable` flag was written without the state's lock when a
// recycled state was registered for a new stream, and under it (only) by the device-synchronize
// reclaim: a data race ThreadSanitizer reported. What the race does when it is lost is checked
// deterministically in pool_release_stream.cpp.
TEST_CASE("streams may be released and new ones seen while another thread trims", "[threads]") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::latch start(2);
  std::atomic<int> failures{0};
  std::thread churner([&] {
    start.arrive_and_wait();
    while (std::chrono::steady_clock::now() < until) {
      cudaStream_t s = fake.create_stream();
      std::error_code error;
      Bytes::try_alloc_async(*pool, 4096, s, error).reset();
      if (error) ++failures;
      pool->release_stream(s);  // its state is recycled for the next stream
      fake.destroy_stream(s);
    }
  });
  std::thread trimmer([&] {
    start.arrive_and_wait();
    while (std::chrono::steady_clock::now() < until) pool->trim(std::size_t{1} << 40);
  });
  churner.join();
  trimmer.join();
  REQUIRE(failures == 0);
  REQUIRE(fake.hazards().empty());
}
