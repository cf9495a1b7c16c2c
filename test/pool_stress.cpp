// Stress: several threads, each on streams of its own, on its per-thread default stream and on
// one stream they all share, allocate random sizes (small and large), keep or drop them at
// random, use some on a second stream, complete work, release streams and replace streams at
// random. Each buffer is written by pending work over its whole range, so the fake device's race
// detector checks every hand-over the pool makes. At the end: no two live buffers ever
// overlapped, no race was seen, and once everything is dropped and the pool destroyed the device
// holds none of its memory. Meanwhile another thread reads stats() and breakdown() again and
// again: each locks every stream's state in turn, borrowing the locks biased to the workers
// (lib/pool/biased_lock.hpp), and what it reads must stay within what the workers allocated.
#include "live_ranges.hpp"
#include "pool_helpers.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PooledBuffer;
using streampool::StreamChecks;
using Bytes = PooledBuffer<std::byte>;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr int threads = 4;
constexpr int streams_per_thread = 2;
constexpr int steps_per_thread = 8000;

struct Shared {
  Shared(MemoryPool& p, FakeDevice& f) : pool(p), fake(f), common(f.create_stream()) {}

  MemoryPool& pool;
  FakeDevice& fake;
  cudaStream_t common;  // used by every thread
  LiveRanges live;
  std::latch start{threads};  // the threads begin together, so that they do contend
  std::atomic<int> failed_allocations{0};
  std::string first_failure;  // written by the first thread that fails
  std::atomic<std::uint64_t> allocations{0};
  // The bases of the blocks whose stream the test destroyed while they were live (a block may be
  // here more than once: its address comes back). Their drops, on a dead or reused handle, are
  // the misuse's own report (unrecorded_use), and only theirs are excused.
  std::mutex orphans_mutex;
  std::multiset<const void*> orphans;

  void fail(std::string what) {
    if (failed_allocations++ == 0) first_failure = std::move(what);
  }
};

// Orders `waiter` after the work enqueued on `first` so far, as a user would with an event.
void order_after(FakeDevice& fake, cudaStream_t waiter, cudaStream_t first) {
  cudaEvent_t event = nullptr;
  fake.event_create(&event);
  fake.event_record(event, first);
  fake.stream_wait_event(waiter, event);
  fake.event_destroy(event);
}

// One buffer a thread keeps, and the other stream it was used on (or null).
struct Kept {
  Bytes buffer;
  cudaStream_t other = nullptr;
};

void run_thread(Shared& shared, std::vector<cudaStream_t> own, std::uint32_t seed) {
  std::mt19937 random(seed);
  const auto all_streams = [&] {
    std::vector<cudaStream_t> streams = own;
    streams.push_back(cudaStreamPerThread);
    streams.push_back(shared.common);
    return streams;
  };
  std::vector<cudaStream_t> streams = all_streams();
  const auto pick = [&](const std::vector<cudaStream_t>& from) {
    return from[random() % from.size()];
  };
  std::vector<Kept> kept;
  const auto drop = [&](std::size_t index) {
    shared.live.remove(kept[index].buffer.data());  // before the drop: it may go out at once
    kept[index] = std::move(kept.back());
    kept.pop_back();
  };

  shared.start.arrive_and_wait();
  for (int step = 0; step < steps_per_thread; ++step) {
    cudaStream_t s = pick(streams);
    const std::size_t bytes = random() % 16 == 0 ? 1 * MiB + random() % (3 * MiB)
                              : random() % 4 == 0 ? 1 + random() % (1 * MiB)
                                                  : 1 + random() % (16 * KiB);
    std::error_code error;
    Bytes buffer = Bytes::try_alloc_async(shared.pool, bytes, s, error);
    if (error || buffer.is_empty()) {
      shared.fail(fmt::format("{} bytes: {}", bytes,
                              error ? error.message() : "an empty buffer and no error"));
      continue;
    }
    shared.allocations.fetch_add(1, std::memory_order_relaxed);
    shared.live.add(buffer.data(), buffer.byte_size());
    shared.fake.launch(s, {{buffer.data(), buffer.byte_size(), true}});
    cudaStream_t other = nullptr;
    if (random() % 10 == 0 && (other = pick(streams)) != s) {
      // Also read on another stream, ordered after the write, and named with record_stream.
      order_after(shared.fake, other, s);
      shared.fake.launch(other, {{buffer.data(), buffer.byte_size(), false}});
      buffer.record_stream(other);
    }
    kept.push_back({std::move(buffer), other});

    if (kept.size() > 40 || random() % 2 == 0) drop(random() % kept.size());
    if (random() % 8 == 0) shared.fake.complete(pick(streams));
    if (random() % 300 == 0) shared.pool.release_stream(pick(streams));
    if (random() % 400 == 0) {
      // Replace one of the thread's own streams, as a program that creates streams as it goes:
      // released (as StreamChecks::none asks), destroyed with its work pending and some of its
      // buffers alive (dropped later), and a new one created, which may get its handle.
      cudaStream_t& old = own[random() % own.size()];
      {
        std::lock_guard lock(shared.orphans_mutex);
        for (const Kept& k : kept) {
          if (k.buffer.stream() == old) shared.orphans.insert(k.buffer.data());
        }
      }
      shared.pool.release_stream(old);
      shared.fake.destroy_stream(old);
      old = shared.fake.create_stream();
      streams = all_streams();
    }
  }
  while (!kept.empty()) drop(kept.size() - 1);
}

void stress(streampool::PoolOptions options) {
  auto fake = std::make_shared<FakeDevice>();
  auto pool = std::make_unique<MemoryPool>(fake, options);
  Shared shared(*pool, *fake);
  std::vector<std::vector<cudaStream_t>> own(threads);
  for (auto& streams : own) {
    for (int i = 0; i < streams_per_thread; ++i) streams.push_back(fake->create_stream());
  }

  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back(run_thread, std::ref(shared), own[t],
                         static_cast<std::uint32_t>(1000 + t));
  }
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::string impossible;  // the statistician's first impossible reading
  std::thread statistician([&] {
    // The walk reads one stream after another while the workers go on, so a buffer dropped on a
    // stream already read and one allocated on a stream not yet read are both counted: the sum
    // is bounded by what was ever allocated (a worker counts its allocation just after it), not
    // by what is live at one moment.
    while (!done.load()) {
      const streampool::PoolStats st = shared.pool.stats();
      const streampool::PoolBreakdown b = shared.pool.breakdown();
      const auto allocated = static_cast<std::int64_t>(shared.allocations.load()) + threads;
      if (impossible.empty() &&
          (st.live_allocations.current < 0 || st.live_allocations.current > allocated ||
           st.live_allocations.total > allocated ||
           st.requested_bytes.current < 0 || b.small_cached_bytes < 0 || b.shelved_bytes < 0)) {
        impossible = fmt::format("live {}, requested {}, cached {}, shelved {}",
                                 st.live_allocations.current, st.requested_bytes.current,
                                 b.small_cached_bytes, b.shelved_bytes);
      }
      reads.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  for (std::thread& worker : workers) worker.join();
  done.store(true);
  statistician.join();
  INFO(impossible);
  REQUIRE(impossible.empty());
  REQUIRE(reads.load() > 0);

  INFO(shared.first_failure);
  REQUIRE(shared.failed_allocations == 0);
  REQUIRE(shared.allocations == std::uint64_t{threads} * steps_per_thread);
  INFO(shared.live.first_overlap());
  REQUIRE(shared.live.overlaps() == 0);
  REQUIRE(shared.live.size() == 0);

  fake->complete_all();
  auto hazards = fake->hazards();
  // Destroying streams with buffers alive is the misuse this test commits on purpose (the pool
  // must survive it); the fake reports each one, and the later drop of each such buffer unless
  // the host happened to learn that its work was done (a pool's synchronize, or an event it
  // queried). Nothing else may be reported: a block handed over early is a race.
  std::erase_if(hazards, [&](const FakeDevice::Hazard& h) {
    if (h.kind == FakeDevice::Hazard::Kind::destroyed_stream) return true;
    if (h.kind != FakeDevice::Hazard::Kind::unrecorded_use) return false;
    auto orphan = shared.orphans.find(h.block);
    if (orphan == shared.orphans.end()) return false;
    shared.orphans.erase(orphan);
    return true;
  });
  INFO((hazards.empty() ? std::string() : hazards.front().what));
  REQUIRE(hazards.empty());

  const auto stats = pool->stats();
  REQUIRE(stats.live_allocations.current == 0);
  REQUIRE(stats.requested_bytes.current == 0);
  REQUIRE(stats.live_allocations.total == static_cast<std::int64_t>(shared.allocations.load()));
  REQUIRE(stats.reserved_bytes.current == static_cast<std::int64_t>(fake->live_bytes()));

  pool.reset();
  REQUIRE(fake->live_bytes() == 0);
  REQUIRE(fake->live_allocations() == 0);
}

}  // namespace

TEST_CASE("threads on many streams never get overlapping memory, and no hand-over races") {
  auto options = test_options();
  options.segment_bytes = 16 * MiB;  // several segments, so that the arena's lists are exercised

  SECTION("with the default options (StreamChecks::full)") { stress(options); }
  SECTION("with fence_every_free") {
    options.fence_every_free = true;
    stress(options);
  }
  SECTION("with cross_stream_wait") {
    options.cross_stream_wait = true;
    stress(options);
  }
  SECTION("with StreamChecks::identity") {
    options.stream_checks = StreamChecks::identity;
    stress(options);
  }
  SECTION("with StreamChecks::none") {
    options.stream_checks = StreamChecks::none;
    stress(options);
  }
  SECTION("with a stats granule, which changes when the counters are published") {
    options.stats_granule = 64 * KiB;
    stress(options);
  }
}

TEST_CASE("allocations racing for the blocks of fresh slabs each get a block or an error") {
  // One block per slab: every allocation carves a slab, and a thread may find the block it
  // carved already taken by another. It must carve again (or fail with a code), never return an
  // empty buffer with no error. A race: each round gives it a chance to show.
  auto options = test_options();
  options.slab_bytes = 1;
  options.large_rounding = 4096;
  options.stream_checks = StreamChecks::none;
  constexpr int racers = 8;
  constexpr int per_racer = 500;
  for (int round = 0; round < 10; ++round) {
    PoolOnFake pool(options);
    std::vector<cudaStream_t> streams;
    for (int t = 0; t < racers; ++t) streams.push_back(pool.fake().create_stream());
    std::latch start(racers);
    std::atomic<int> empty_without_error{0};
    std::atomic<int> errors{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < racers; ++t) {
      workers.emplace_back([&, s = streams[static_cast<std::size_t>(t)]] {
        std::vector<Bytes> kept;
        kept.reserve(per_racer);
        start.arrive_and_wait();
        for (int i = 0; i < per_racer; ++i) {
          std::error_code error;
          kept.push_back(Bytes::try_alloc_async(*pool, 4096, s, error));
          if (error) ++errors;
          else if (kept.back().is_empty()) ++empty_without_error;
        }
      });
    }
    for (std::thread& worker : workers) worker.join();
    CAPTURE(round);
    REQUIRE(errors == 0);
    REQUIRE(empty_without_error == 0);
    REQUIRE(pool->stats().live_allocations.total == racers * per_racer);
  }
}
