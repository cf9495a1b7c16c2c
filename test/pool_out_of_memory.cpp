// Out of memory: when the device refuses, or max_reserved_bytes would be passed, the pool
// reclaims step by step and retries after each: fenced blocks whose fences completed, wholly free
// segments returned to the device, then a device synchronize after which every cached block is
// reusable. Only then does it fail, with a message naming the request, the reserved, cached and
// device-free bytes. Nothing leaks on any failure path.
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

using streampool::Errc;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

streampool::PoolOptions exact_segments() {
  auto options = test_options();
  options.segment_bytes = MiB;  // segments as large as each request, no more
  return options;
}
}  // namespace

TEST_CASE("an allocation the device cannot satisfy fails with a message naming the figures") {
  FakeDevice::Options device;
  device.capacity = 64 * MiB;
  PoolOnFake pool(exact_segments(), device);
  cudaStream_t s = pool.fake().create_stream();
  auto kept = Bytes::alloc_async(*pool, 40 * MiB, s);
  try {
    Bytes::alloc_async(*pool, 40 * MiB, s);
    FAIL("allocated past the device's capacity");
  } catch (const streampool::Error& e) {
    REQUIRE(e.errc() == Errc::out_of_memory);
    const std::string what = e.what();
    CAPTURE(what);
    REQUIRE_THAT(what, Catch::Contains(std::to_string(40 * MiB) + " bytes"));   // the request
    REQUIRE_THAT(what, Catch::Contains("reserves " + std::to_string(40 * MiB)));  // reserved
    REQUIRE_THAT(what, Catch::Contains("cached"));
    REQUIRE_THAT(what, Catch::Contains(std::to_string(24 * MiB) + " bytes free"));  // device
  }
  REQUIRE(pool->stats().oom_retries == 1);
  REQUIRE(pool.fake().calls(FakeDevice::Call::device_synchronize) == 1);  // every step was tried

  std::error_code error;
  auto none = Bytes::try_alloc_async(*pool, 40 * MiB, s, error);
  REQUIRE(none.is_empty());
  REQUIRE(error == Errc::out_of_memory);
}

TEST_CASE("max_reserved_bytes is a limit the pool never passes") {
  auto options = exact_segments();
  options.max_reserved_bytes = 16 * MiB;
  PoolOnFake pool(options);
  cudaStream_t s = pool.fake().create_stream();
  std::vector<Bytes> kept;
  std::error_code error;
  for (int i = 0; i < 100 && !error; ++i) {
    kept.push_back(Bytes::try_alloc_async(*pool, 3 * MiB, s, error));
  }
  REQUIRE(error == Errc::out_of_memory);
  REQUIRE(pool->stats().reserved_bytes.peak <= static_cast<std::int64_t>(16 * MiB));
  REQUIRE(pool.fake().live_bytes() <= 16 * MiB);
  REQUIRE_THROWS_WITH(Bytes::alloc_async(*pool, 3 * MiB, s), Catch::Contains("limit"));
}

TEST_CASE("step one: blocks whose fences completed are reused before anything else") {
  // The pool learns which fences completed before the arena grows at all, so this needs no
  // out-of-memory retry; the ladder's step one does the same for an allocation already failing.
  auto options = exact_segments();
  options.fence_every_free = true;
  FakeDevice::Options device;
  device.capacity = 48 * MiB;
  PoolOnFake pool(options, device);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  void* dropped = nullptr;
  {
    auto x = Bytes::alloc_async(*pool, 40 * MiB, a);
    write_on(fake, a, x);
    dropped = x.data();
  }
  fake.complete(a);  // its fence completes; nobody has asked yet
  auto y = Bytes::alloc_async(*pool, 40 * MiB, b);
  REQUIRE(static_cast<void*>(y.data()) == dropped);
  REQUIRE(pool->stats().oom_retries == 0);
  REQUIRE(fake.calls(FakeDevice::Call::device_synchronize) == 0);
  REQUIRE(fake.calls(FakeDevice::Call::free) == 0);
  write_on(fake, b, y);
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}

TEST_CASE("step two: wholly free segments go back to the device to make room") {
  FakeDevice::Options device;
  device.capacity = 48 * MiB;
  PoolOnFake pool(exact_segments(), device);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  Bytes::alloc_async(*pool, 30 * MiB, a).reset();  // cached, no pending work
  pool->release_stream(a);                          // clean now
  auto big = Bytes::alloc_async(*pool, 40 * MiB, a);  // needs the 30 MiB back
  REQUIRE(fake.calls(FakeDevice::Call::free) == 1);
  REQUIRE(fake.calls(FakeDevice::Call::device_synchronize) == 0);
  REQUIRE(pool->stats().device_frees == 1);
  REQUIRE(pool->stats().reserved_bytes.current == static_cast<std::int64_t>(40 * MiB));
}

TEST_CASE("step three: after a device synchronize every cached block is reusable") {
  FakeDevice::Options device;
  device.capacity = 48 * MiB;
  PoolOnFake pool(exact_segments(), device);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  void* dropped = nullptr;
  {
    auto x = Bytes::alloc_async(*pool, 40 * MiB, a);
    write_on(fake, a, x);  // pending, and no fence: only a synchronize frees it
    dropped = x.data();
  }
  auto y = Bytes::alloc_async(*pool, 40 * MiB, b);
  REQUIRE(static_cast<void*>(y.data()) == dropped);
  REQUIRE(fake.calls(FakeDevice::Call::device_synchronize) == 1);
  write_on(fake, b, y);
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}

// Found in review (2026-12-05): the ladder's last step tried again only where this pool gave
// memory back itself. Memory another pool (or thread) gave back meanwhile went unused, and the
// allocation failed as out of memory with the room on the device.
TEST_CASE("the ladder's last step tries again: memory given back meanwhile by another pool is "
          "used") {
  FakeDevice::Options options;
  options.capacity = 64 * MiB;
  auto fake = std::make_shared<FakeDevice>(options);
  auto hooked = std::make_shared<HookedDevice>(fake);
  streampool::MemoryPool a(hooked, exact_segments());
  streampool::MemoryPool b(fake, exact_segments());
  cudaStream_t s = fake->create_stream();
  { auto cached = Bytes::alloc_async(b, 40 * MiB, s); }  // b keeps the free segment
  // a's request fails at first, after the ladder's first step and after its device synchronize;
  // right after that last refusal, b gives its memory back (another thread would, at any time).
  hooked->after_next(FakeDevice::Call::malloc, [] {});
  hooked->after_next(FakeDevice::Call::malloc, [] {});
  hooked->after_next(FakeDevice::Call::malloc, [&] { b.trim(); });
  std::error_code error;
  auto x = Bytes::try_alloc_async(a, 40 * MiB, s, error);
  CHECK(!error);
  CHECK(!x.is_empty());
  CHECK(a.stats().oom_retries == 1);
}

TEST_CASE("small blocks cached on a stream are reclaimed for a large request") {
  FakeDevice::Options device;
  device.capacity = 8 * MiB;
  auto options = exact_segments();
  PoolOnFake pool(options, device);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  {
    std::vector<Bytes> small;
    std::error_code error;
    while (!error) {
      small.push_back(Bytes::try_alloc_async(*pool, 64 << 10, a, error));
      if (!error) write_on(fake, a, small.back());
    }
  }
  // Every byte sits in slabs of 64 KiB blocks on A, with A's work pending.
  auto big = Bytes::alloc_async(*pool, 6 * MiB, a);
  REQUIRE(big.byte_size() == 6 * MiB);
  write_on(fake, a, big);
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}

TEST_CASE("nothing leaks on any failure path") {
  FakeDevice::Options device;
  device.capacity = 32 * MiB;
  auto fake = std::make_shared<FakeDevice>(device);
  {
    streampool::MemoryPool pool(fake, exact_segments());
    cudaStream_t s = fake->create_stream();
    std::vector<Bytes> kept;
    std::error_code error;
    for (int i = 0; i < 20; ++i) {
      kept.push_back(Bytes::try_alloc_async(pool, (i % 5 + 1) * MiB, s, error));
      fake->fail_next(FakeDevice::Call::malloc);
      Bytes::try_alloc_async(pool, 3 * MiB, s, error);  // refused by the injected fault
    }
    REQUIRE(error);
    REQUIRE_FALSE(kept.empty());
  }
  REQUIRE(fake->live_bytes() == 0);
  REQUIRE(fake->live_allocations() == 0);
}
