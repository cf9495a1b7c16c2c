// Lifetime: a MemoryPool may be destroyed while buffers are alive (their memory goes back to the
// device when the last is dropped, from any thread); trim returns wholly free memory; nothing the
// pool took from the device outlives it, whatever failed on the way.
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/error.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

using streampool::Errc;
using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Every fence event the pool made was destroyed again.
void require_no_event_left(const FakeDevice& fake) {
  REQUIRE(fake.calls(Call::event_destroy) == fake.calls(Call::event_create));
}

}  // namespace

TEST_CASE("destroying the pool while buffers are alive keeps their memory until the last goes") {
  auto options = test_options();
  options.fence_every_free = true;  // fences (events) to clean up as well
  PoolOnFake pool(options, FakeDevice::Options{.host_backed = true});
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();

  std::vector<PooledBuffer<int>> buffers;
  for (int i = 0; i < 20; ++i) {
    const std::size_t n = i % 4 == 0 ? 1 * MiB : 100 + 1000 * i;  // large and small
    buffers.push_back(PooledBuffer<int>::alloc_async(*pool, n, i % 2 ? a : b));
    std::fill_n(buffers.back().data(), n, i);
  }
  Bytes::alloc_async(*pool, 5000, a).reset();  // cached, not live
  const std::size_t held = fake.live_bytes();

  SECTION("with no pending work") {
    pool.pool.reset();
    REQUIRE(fake.live_bytes() == held);
    for (int i = 0; i < 20; ++i) {  // still the buffers' own memory, as they left it
      const auto& buffer = buffers[i];
      REQUIRE(std::all_of(buffer.data(), buffer.data() + buffer.len(),
                          [&](int v) { return v == i; }));
    }
    buffers.resize(1);
    REQUIRE(fake.live_bytes() == held);
    buffers.clear();
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(fake.live_allocations() == 0);
    require_no_event_left(fake);
  }
  SECTION("with work pending on them, and a buffer used on two streams") {
    for (auto& buffer : buffers) {
      cudaStream_t s = buffer.stream();
      int* const data = buffer.data();
      const std::size_t n = buffer.len();
      fake.launch(s, {{data, buffer.byte_size(), true}}, [data, n] { std::fill_n(data, n, -1); });
    }
    buffers[3].record_stream(a == buffers[3].stream() ? b : a);
    pool.pool.reset();
    buffers.resize(5);
    REQUIRE(fake.live_bytes() == held);
    REQUIRE(fake.pending_work() > 0);
    buffers.clear();
    REQUIRE(fake.pending_work() == 0);  // the pool waited for the work before freeing
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(fake.live_allocations() == 0);
    REQUIRE(fake.hazards().empty());
    require_no_event_left(fake);
  }
}

TEST_CASE("destroying the pool with no buffer alive returns everything at once") {
  auto options = test_options();
  options.fence_every_free = true;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  for (int i = 0; i < 50; ++i) {
    cudaStream_t s = i % 2 ? a : b;
    auto buffer = Bytes::alloc_async(*pool, 1000 + 150000 * static_cast<std::size_t>(i), s);
    write_on(fake, s, buffer);  // pending when the pool goes
  }
  REQUIRE(fake.live_bytes() > 0);
  pool.pool.reset();
  REQUIRE(fake.live_bytes() == 0);
  REQUIRE(fake.live_allocations() == 0);
  REQUIRE(fake.pending_work() == 0);
  REQUIRE(fake.hazards().empty());
  require_no_event_left(fake);
}

TEST_CASE("buffers may be dropped from several threads after the pool object is gone") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  constexpr int threads = 4;
  std::vector<cudaStream_t> streams;
  for (int t = 0; t < threads; ++t) streams.push_back(fake.create_stream());
  std::vector<std::vector<Bytes>> per_thread(threads);
  for (int i = 0; i < 400; ++i) {
    const int t = i % threads;
    // Two threads share each stream, so that drops on one stream race each other too.
    cudaStream_t s = streams[static_cast<std::size_t>(i / threads % 2 == 0 ? t : (t + 1) % threads)];
    per_thread[t].push_back(Bytes::alloc_async(*pool, i % 10 == 0 ? 2 * MiB : 64 + 512 * i, s));
    write_on(fake, s, per_thread[t].back());
  }
  pool.pool.reset();
  REQUIRE(fake.live_bytes() > 0);

  std::vector<std::thread> droppers;
  for (auto& buffers : per_thread) {
    droppers.emplace_back([&buffers] {
      while (!buffers.empty()) buffers.pop_back();
    });
  }
  for (std::thread& t : droppers) t.join();
  REQUIRE(fake.live_bytes() == 0);
  REQUIRE(fake.live_allocations() == 0);
  REQUIRE(fake.hazards().empty());
}

TEST_CASE("trim returns wholly free memory to the device, down to the target") {
  auto options = test_options();
  options.segment_bytes = 4 * MiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  const auto reserved = [&] { return static_cast<std::size_t>(pool->stats().reserved_bytes.current); };

  SECTION("segments go back one by one until at most bytes_to_keep stay reserved") {
    {
      std::vector<Bytes> held;  // alive together: one 4 MiB segment each
      for (int i = 0; i < 4; ++i) {
        held.push_back(Bytes::alloc_async(*pool, 4 * MiB, s));
        write_on(fake, s, held.back());
      }
    }
    REQUIRE(fake.live_bytes() == 16 * MiB);
    pool->trim(10 * MiB);
    REQUIRE(fake.pending_work() == 0);  // it synchronized first
    REQUIRE(fake.live_bytes() == 8 * MiB);
    REQUIRE(reserved() == 8 * MiB);
    REQUIRE(pool->stats().device_frees == 2);
    pool->trim(8 * MiB);
    REQUIRE(fake.live_bytes() == 8 * MiB);
    pool->trim();
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(reserved() == 0);
  }
  SECTION("memory a live buffer uses stays") {
    auto kept = Bytes::alloc_async(*pool, 4 * MiB, s);
    Bytes::alloc_async(*pool, 8 * MiB, s).reset();
    pool->trim();
    REQUIRE(fake.live_bytes() == 4 * MiB);
    write_on(fake, s, kept);  // still inside a live device allocation
    REQUIRE(fake.hazards().empty());
  }
  SECTION("slabs of small blocks go back once all their blocks are free") {
    {
      std::vector<Bytes> small;
      for (std::size_t i = 0; i < 300; ++i) {
        small.push_back(Bytes::alloc_async(*pool, 100 + i * 997, s));
        write_on(fake, s, small.back());
      }
    }
    REQUIRE(fake.live_bytes() > 0);
    pool->trim();
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(reserved() == 0);
  }
  SECTION("a segment a smaller large block was cut from goes back once the block is free") {
    {
      auto buffer = Bytes::alloc_async(*pool, 3 * MiB, s);  // a 4 MiB segment, 1 MiB left over
      write_on(fake, s, buffer);
    }
    REQUIRE(fake.live_bytes() == 4 * MiB);
    pool->trim();
    REQUIRE(fake.live_bytes() == 0);
  }
  SECTION("neighbouring large blocks used on two streams go back whole once both are free") {
    // Each waits, parked, for a fence on both streams; neither may merge with the other before.
    cudaStream_t other = fake.create_stream();
    auto x = Bytes::alloc_async(*pool, 1536 * KiB, s);  // side by side in one 4 MiB segment
    auto y = Bytes::alloc_async(*pool, 1536 * KiB, s);
    REQUIRE(y.data() == x.data() + x.byte_size());
    for (Bytes* buffer : {&x, &y}) {
      write_on(fake, s, *buffer);
      cudaEvent_t written = nullptr;
      REQUIRE(fake.event_create(&written) == cudaSuccess);
      REQUIRE(fake.event_record(written, s) == cudaSuccess);
      REQUIRE(fake.stream_wait_event(other, written) == cudaSuccess);
      fake.launch(other, {{buffer->data(), buffer->byte_size(), false}});
      REQUIRE(fake.event_destroy(written) == cudaSuccess);
      buffer->record_stream(other);
    }
    x.reset();  // the lower one first: when it becomes clean, the upper one is still parked
    y.reset();
    REQUIRE(fake.live_bytes() == 4 * MiB);
    pool->trim();
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(reserved() == 0);
    auto again = Bytes::alloc_async(*pool, 4 * MiB, s);
    write_on(fake, s, again);
    REQUIRE(fake.hazards().empty());
  }
  SECTION("asking to keep more than is reserved returns nothing") {
    Bytes::alloc_async(*pool, 4 * MiB, s).reset();
    pool->trim(100 * MiB);
    REQUIRE(fake.calls(Call::free) == 0);
    REQUIRE(fake.live_bytes() == 4 * MiB);
  }
  SECTION("trimmed memory is allocated again when needed") {
    Bytes::alloc_async(*pool, 4 * MiB, s).reset();
    pool->trim();
    REQUIRE(fake.live_bytes() == 0);
    auto again = Bytes::alloc_async(*pool, 4 * MiB, s);
    write_on(fake, s, again);
    REQUIRE(fake.live_bytes() == 4 * MiB);
    REQUIRE(fake.hazards().empty());
  }
  fake.complete_all();
}

TEST_CASE("nothing the pool took from the device outlives it after a failed allocation") {
  auto fake = std::make_shared<FakeDevice>(FakeDevice::Options{.capacity = 32 * MiB});
  // Memory the device holds for someone else: what must be left when the pool is gone.
  void* others = nullptr;
  REQUIRE(fake->malloc(&others, 3 * MiB) == cudaSuccess);
  const std::size_t before = fake->live_bytes();

  auto options = test_options();
  options.segment_bytes = 2 * MiB;
  options.slab_bytes = 2 * MiB;  // a slab fills a segment: every new slab or range needs a malloc
  std::vector<Bytes> survivors;
  {
    MemoryPool pool(fake, options);
    cudaStream_t s = fake->create_stream();
    survivors.push_back(Bytes::alloc_async(pool, 4 * MiB, s));
    survivors.push_back(Bytes::alloc_async(pool, 1000, s));
    std::error_code error;

    SECTION("the device out of memory") {
      Bytes::try_alloc_async(pool, 40 * MiB, s, error);
      REQUIRE(error == Errc::out_of_memory);
    }
    SECTION("max_reserved_bytes passed, in a second pool that goes first") {
      auto limited = options;
      limited.max_reserved_bytes = 8 * MiB;
      MemoryPool limited_pool(fake, limited);
      survivors.push_back(Bytes::alloc_async(limited_pool, 6 * MiB, s));
      Bytes::try_alloc_async(limited_pool, 6 * MiB, s, error);
      REQUIRE(error == Errc::out_of_memory);
    }
    SECTION("every malloc failing, for small and large requests") {
      fake->fail_next(Call::malloc, 1000);
      for (std::size_t bytes : {1 * MiB, 5 * MiB, 100 * KiB}) {
        Bytes::try_alloc_async(pool, bytes, s, error);
        REQUIRE(error == Errc::out_of_memory);
      }
      fake->fail_next(Call::malloc, 0);
    }
    SECTION("the stream's identity cannot be learned") {
      cudaStream_t fresh = fake->create_stream();
      fake->fail_next(Call::stream_id);
      Bytes::try_alloc_async(pool, 1000, fresh, error);
      REQUIRE(error == Errc::device_error);
    }
    SECTION("a zero size") {
      Bytes::try_alloc_async(pool, 0, s, error);
      REQUIRE(error == Errc::invalid_value);
    }
    REQUIRE(pool.stats().live_allocations.current == 2);
  }
  survivors.clear();
  REQUIRE(fake->live_bytes() == before);
  REQUIRE(fake->live_allocations() == 1);
  REQUIRE(fake->free(others) == cudaSuccess);
}

TEST_CASE("a pool destroyed while the device cannot synchronize unmaps nothing pending work uses") {
  // cudaFree waits for the work that uses the memory; unmapping does not. So a pool whose final
  // synchronize fails keeps its expandable segments mapped until a later safe point synchronizes
  // (here: the next pool's construction), and frees its cudaMalloc segments at once.
  for (bool expandable : {true, false}) {
    CAPTURE(expandable);
    auto options = test_options();
    options.expandable_segments = expandable;
    PoolOnFake pool(options);
    FakeDevice& fake = pool.fake();
    cudaStream_t a = fake.create_stream();
    {
      auto buffer = Bytes::alloc_async(*pool, 3 * MiB, a);
      write_on(fake, a, buffer);  // still pending when the pool goes
    }
    REQUIRE(fake.calls(Call::vm_map) == (expandable ? 1u : 0u));
    fake.fail_next(Call::device_synchronize);
    pool.pool.reset();
    REQUIRE(fake.hazards().empty());
    if (expandable) {
      REQUIRE(fake.live_bytes() > 0);  // waiting for a safe point that synchronizes
      REQUIRE(fake.pending_work() > 0);
      MemoryPool next(pool.device, options);  // a safe point: the dead pool is destroyed here
    }
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(fake.live_allocations() == 0);
    fake.complete_all();
    REQUIRE(fake.hazards().empty());
  }
}

// A drop on the slow path (a record_stream use) gives up its count of the block under its
// stream's lock, then goes on placing the block: fencing its uses, parking or keeping it.
// ~MemoryPool on another thread counts the live buffers stream by stream; once it has passed the
// block's stream it counts nothing for it, and used to destroy the core under the drop (a heap
// use after free: the drop's fence pushed into a freed stream state). The hooks make that
// order: the first fence (on `home`, under its lock) starts the destruction, whose count passes
// `other` and waits for home's lock; the second (on `other`) holds the drop while the count
// finishes.
TEST_CASE("a drop on its slow path finishes before a pool destroyed on another thread goes") {
  auto options = test_options();
  options.idle_ms = 0;
  auto fake = std::make_shared<FakeDevice>();
  auto device = std::make_shared<HookedDevice>(fake);
  auto pool = std::make_unique<MemoryPool>(device, options);
  cudaStream_t home = fake->create_stream("home");
  cudaStream_t other = fake->create_stream("other");

  auto buffer = Bytes::alloc_async(*pool, 4 * KiB, home);
  write_on(*fake, home, buffer);
  buffer.record_stream(other);  // registers `other` (newer than `home`: counted first)
  fake->launch(other, {{buffer.data(), buffer.byte_size(), false}});

  std::shared_future<void> destroyed;
  device->before_next(Call::event_record, [&] {
    destroyed = on_own_thread([&] { pool.reset(); }, std::chrono::milliseconds(200));
  });
  device->before_next(Call::event_record,
                      [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  buffer = Bytes();  // the drop
  destroyed.wait();
  fake->complete_all();
  CHECK(fake->live_events() == 0);  // every fence's event destroyed with the core
  CHECK(fake->live_allocations() == 0);
}
