// Fallbacks: when a fence cannot be created or recorded, the drop waits for the stream on the
// CPU instead and recycles the block directly: correct, only slower, and counted.
#include "pool_helpers.hpp"

using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {
streampool::PoolOptions fenced_one_block_slabs() {
  auto options = one_block_slabs();
  options.fence_every_free = true;
  return options;
}
}  // namespace

TEST_CASE("a fence that cannot be made falls back to a stream synchronize") {
  for (FakeDevice::Call failing : {FakeDevice::Call::event_create, FakeDevice::Call::event_record}) {
    CAPTURE(FakeDevice::call_name(failing));
    PoolOnFake pool(fenced_one_block_slabs());
    FakeDevice& fake = pool.fake();
    cudaStream_t a = fake.create_stream();
    cudaStream_t b = fake.create_stream();

    fake.fail_next(failing);
    void* dropped = nullptr;
    {
      auto x = Bytes::alloc_async(*pool, 4096, a);
      write_on(fake, a, x);
      dropped = x.data();
    }
    REQUIRE(fake.calls(FakeDevice::Call::stream_synchronize) == 1);
    REQUIRE(fake.pending_work() == 0);
    REQUIRE(pool->stats().blocking_fallbacks == 1);
    REQUIRE(pool->stats().fences_recorded == 0);

    // The block is clean: another stream may have it at once.
    auto y = Bytes::alloc_async(*pool, 4096, b);
    REQUIRE(static_cast<void*>(y.data()) == dropped);
    write_on(fake, b, y);
    REQUIRE(fake.hazards().empty());
    fake.complete_all();
  }
}

TEST_CASE("a fence asked for by another stream falls back the same way") {
  auto options = fenced_one_block_slabs();
  options.fence_every_free = false;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 4096, a);
    write_on(fake, a, x);
  }
  Bytes::alloc_async(*pool, 4096, b).reset();  // asks A for a fence
  fake.fail_next(FakeDevice::Call::event_record);
  Bytes::alloc_async(*pool, 100000, a).reset();  // A's next call: the record fails, A syncs
  REQUIRE(pool->stats().blocking_fallbacks == 1);
  REQUIRE(fake.calls(FakeDevice::Call::stream_synchronize) == 1);
  fake.complete_all();
}

TEST_CASE("when neither a fence nor a synchronize works, the block waits for a device "
          "synchronize and never reaches another stream early") {
  PoolOnFake pool(fenced_one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  fake.fail_next(FakeDevice::Call::event_record);
  fake.fail_next(FakeDevice::Call::stream_synchronize);
  void* dropped = nullptr;
  {
    auto x = Bytes::alloc_async(*pool, 4096, a);
    write_on(fake, a, x);
    dropped = x.data();
  }
  REQUIRE(fake.pending_work() == 1);
  auto y = Bytes::alloc_async(*pool, 4096, b);
  REQUIRE(static_cast<void*>(y.data()) != dropped);
  write_on(fake, b, y);

  pool->trim(std::size_t{1} << 40);  // a device synchronize: now it is clean
  auto z = Bytes::alloc_async(*pool, 4096, b);
  REQUIRE(static_cast<void*>(z.data()) == dropped);
  write_on(fake, b, z);
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}
