// DevicePools (<streampool/device_pools.hpp>): one pool per device, the current device's pool,
// installed pools, and buffers of two devices used from several threads. Two FakeDevices of
// ordinals 0 and 1 stand in for two GPUs; a thread-local ordinal stands in for cudaSetDevice.
#include "pool_helpers.hpp"

#include <streampool/device_pools.hpp>
#include <streampool/error.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/pooled_buffer.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using streampool::DevicePools;
using streampool::Errc;
using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PooledBuffer;

namespace {

thread_local int current_ordinal = 0;  // "cudaSetDevice" for the fakes

// Two fake GPUs and a registry whose pools are made over them, counting how often it makes one.
struct TwoFakeGpus {
  std::array<std::shared_ptr<FakeDevice>, 2> fakes{
      std::make_shared<FakeDevice>(FakeDevice::Options{0, std::size_t{80} << 30, false, true}),
      std::make_shared<FakeDevice>(FakeDevice::Options{1, std::size_t{80} << 30, false, true})};
  std::atomic<int> made{0};
  DevicePools pools{DevicePools::Hooks{
      [this](int ordinal) -> std::shared_ptr<MemoryPool> {
        ++made;
        if (ordinal > 1) throw streampool::Error(Errc::no_device, "two fake GPUs only");
        return std::make_shared<MemoryPool>(fakes[static_cast<std::size_t>(ordinal)],
                                            test_options());
      },
      [] { return current_ordinal; }}};
};

std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

}  // namespace

TEST_CASE("DevicePools: one pool per device, made once, on its own device") {
  TwoFakeGpus gpus;

  SECTION("a device's pool is made on its first lookup and the same one comes back after") {
    CHECK(gpus.pools.find(0) == nullptr);
    auto zero = gpus.pools.pool(0);
    auto one = gpus.pools.pool(1);
    CHECK(zero != one);
    CHECK(gpus.pools.pool(0) == zero);
    CHECK(gpus.pools.find(1) == one);
    CHECK(gpus.made == 2);
    CHECK(zero->device().ordinal() == 0);
    CHECK(one->device().ordinal() == 1);
  }
  SECTION("the current device's pool is the one of the ordinal the thread has set") {
    current_ordinal = 1;
    auto pool = gpus.pools.current();
    CHECK(pool == gpus.pools.pool(1));
    CHECK(pool->device().ordinal() == 1);
    current_ordinal = 0;
    CHECK(gpus.pools.current() == gpus.pools.pool(0));
    std::shared_ptr<MemoryPool> seen_elsewhere;
    std::thread([&] {
      current_ordinal = 1;  // another thread's current device is its own
      seen_elsewhere = gpus.pools.current();
    }).join();
    CHECK(seen_elsewhere == gpus.pools.pool(1));
    CHECK(gpus.pools.current() == gpus.pools.pool(0));
  }
  SECTION("threads racing for a device's first lookup make one pool and all get it") {
    std::vector<std::shared_ptr<MemoryPool>> seen(8);
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < seen.size(); ++i) {
      threads.emplace_back([&, i] { seen[i] = gpus.pools.pool(1); });
    }
    for (auto& t : threads) t.join();
    CHECK(gpus.made == 1);
    for (const auto& pool : seen) CHECK(pool == seen.front());
  }
  SECTION("ordinals out of range, and a failed making, throw no_device; a later lookup retries") {
    CHECK_THROWS_MATCHES(gpus.pools.pool(-1), streampool::Error,
                         Catch::Matchers::Predicate<streampool::Error>(
                             [](const streampool::Error& e) { return e.errc() == Errc::no_device; },
                             "Errc::no_device"));
    CHECK_THROWS_AS(gpus.pools.pool(DevicePools::max_devices), streampool::Error);
    CHECK_THROWS_AS(gpus.pools.set(DevicePools::max_devices, nullptr), streampool::Error);
    CHECK_THROWS_AS(gpus.pools.pool(2), streampool::Error);
    CHECK(gpus.pools.find(2) == nullptr);
    CHECK_THROWS_AS(gpus.pools.pool(2), streampool::Error);
    CHECK(gpus.made == 2);  // the hook was asked again
  }
}

TEST_CASE("DevicePools: a hook that makes no pool is an error, not a null pool") {
  int asked = 0;
  DevicePools pools{DevicePools::Hooks{[&](int) -> std::shared_ptr<MemoryPool> {
                                         ++asked;
                                         return nullptr;
                                       },
                                       [] { return 0; }}};
  CHECK_THROWS_MATCHES(pools.pool(0), streampool::Error,
                       Catch::Matchers::Predicate<streampool::Error>(
                           [](const streampool::Error& e) {
                             return e.errc() == Errc::no_device &&
                                    std::string(e.what()).find("no pool was made for device 0") !=
                                        std::string::npos;
                           },
                           "Errc::no_device, naming the device"));
  CHECK(pools.find(0) == nullptr);
  CHECK_THROWS_AS(pools.current(), streampool::Error);
  CHECK(asked == 2);  // asked again at each lookup
}

TEST_CASE("DevicePools: a user's pool installed for a device") {
  TwoFakeGpus gpus;
  auto mine = std::make_shared<MemoryPool>(gpus.fakes[1], test_options());

  SECTION("is what lookups return, and no pool is made for that device") {
    CHECK(gpus.pools.set(1, mine) == nullptr);
    current_ordinal = 1;
    CHECK(gpus.pools.current() == mine);
    CHECK(gpus.pools.pool(1) == mine);
    CHECK(gpus.made == 0);
    current_ordinal = 0;
  }
  SECTION("replacing a pool returns the old one, which stays alive for those holding it") {
    auto made = gpus.pools.pool(1);
    auto buffer = PooledBuffer<int>::alloc_async(*made, 1024, cudaStreamPerThread);
    std::weak_ptr<MemoryPool> watch = made;
    CHECK(gpus.pools.set(1, mine) == made);
    CHECK(gpus.pools.pool(1) == mine);
    CHECK(made->stats().live_allocations.current == 1);
    made.reset();
    CHECK(watch.expired());  // the registry held no other reference
    buffer.reset();          // a buffer may outlive its pool
    CHECK(gpus.fakes[1]->live_allocations() == 0);
  }
  SECTION("removing it (null) makes the next lookup make a pool") {
    gpus.pools.set(1, mine);
    CHECK(gpus.pools.set(1, nullptr) == mine);
    CHECK(gpus.pools.find(1) == nullptr);
    auto made = gpus.pools.pool(1);
    CHECK(made != mine);
    CHECK(gpus.made == 1);
  }
}

TEST_CASE("DevicePools: buffers of two devices used and dropped from several threads") {
  TwoFakeGpus gpus;
  constexpr int threads = 6;
  constexpr int rounds = 400;
  // One stream per thread on each device (streams belong to a device, as in CUDA).
  std::array<std::vector<cudaStream_t>, 2> streams;
  for (int d = 0; d < 2; ++d) {
    for (int t = 0; t < threads; ++t) streams[d].push_back(gpus.fakes[d]->create_stream());
  }
  // Buffers handed between threads: dropped by another thread than the one that allocated them.
  std::mutex handoff_mutex;
  std::deque<PooledBuffer<std::uint32_t>> handoff;
  std::atomic<int> wrong_device{0};

  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      for (int r = 0; r < rounds; ++r) {
        const int d = static_cast<int>(random() % 2);
        current_ordinal = d;
        auto pool = gpus.pools.current();
        const cudaStream_t stream = streams[d][t];
        const std::size_t n = 16 + random() % (1 << 16);
        auto buffer = PooledBuffer<std::uint32_t>::alloc_async(*pool, n, stream);
        // A write by work on the buffer's device: an address outside that device's live
        // allocations is a hazard of the fake (its window of addresses is its own).
        gpus.fakes[d]->launch(stream, {{buffer.data(), buffer.byte_size(), true}});
        if (&pool->device() != gpus.fakes[d].get()) ++wrong_device;
        std::lock_guard lock(handoff_mutex);
        handoff.push_back(std::move(buffer));
        if (handoff.size() > 16) handoff.pop_front();  // dropped here, often another's
      }
    });
  }
  for (auto& w : workers) w.join();
  handoff.clear();

  CHECK(wrong_device == 0);
  for (int d = 0; d < 2; ++d) {
    INFO("device " << d);
    auto pool = gpus.pools.pool(d);
    const auto stats = pool->stats();
    CHECK(stats.live_allocations.current == 0);  // every drop went back to its own pool
    CHECK(stats.live_allocations.total > 0);
    // Every segment the pool holds is memory of its own device, and nothing else's.
    CHECK(static_cast<std::int64_t>(gpus.fakes[d]->live_bytes()) == stats.reserved_bytes.current);
    CHECK(stats.device_allocations ==
          gpus.fakes[d]->calls(FakeDevice::Call::malloc));
    INFO(first_hazard(*gpus.fakes[d]));
    CHECK(gpus.fakes[d]->hazards().empty());
    for (cudaStream_t s : streams[d]) pool->release_stream(s);
  }
  current_ordinal = 0;
}

TEST_CASE("FakeDevice: devices of different ordinals give addresses in windows of their own") {
  FakeDevice zero(FakeDevice::Options{0});
  FakeDevice one(FakeDevice::Options{1});
  void* a = nullptr;
  void* b = nullptr;
  REQUIRE(zero.malloc(&a, 1 << 20) == cudaSuccess);
  REQUIRE(one.malloc(&b, 1 << 20) == cudaSuccess);
  CHECK(a != b);
  CHECK(address(b) - address(a) >= (std::uintptr_t{1} << 40));
  // A pointer of device 0 is outside device 1's allocations: work on device 1 touching it is
  // flagged.
  const cudaStream_t stream = one.create_stream();
  one.launch(stream, {{a, 256, true}});
  CHECK(one.hazards().size() == 1);
  one.complete_all();
  CHECK(zero.free(a) == cudaSuccess);
  CHECK(one.free(b) == cudaSuccess);
}

TEST_CASE("the process's registry: install, look up and remove a pool") {
  auto fake = std::make_shared<FakeDevice>(FakeDevice::Options{3});
  auto pool = std::make_shared<MemoryPool>(fake, test_options());
  const auto previous = streampool::set_pool_for_device(3, pool);
  CHECK(previous == nullptr);
  CHECK(streampool::pool_for_device(3) == pool);
  CHECK(&streampool::device_pools() == &streampool::device_pools());
  CHECK(streampool::set_pool_for_device(3, previous) == pool);
  CHECK(streampool::device_pools().find(3) == nullptr);
}
