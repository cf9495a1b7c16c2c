// The stream lifecycle, at random on several threads: streams destroyed and replaced by new ones
// that CUDA gives the old handles (release_stream first where StreamChecks::none asks for it),
// per-thread default streams whose buffers outlive their threads, record_stream, the raw API's
// free on another stream, release_stream, and streams retired for being idle (idle_ms of 1 ms),
// under each StreamChecks. The fake device reports any block a stream got before its earlier
// users' work was ordered before it; at the end nothing may be live, reserved or left.
#include "pool_helpers.hpp"

#include <streampool/pooled_buffer.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PooledBuffer;
using streampool::PoolStats;
using streampool::StreamChecks;
using Bytes = PooledBuffer<std::byte>;

namespace {
constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
}  // namespace

namespace {

// One worker thread of the randomized lifecycle test: streams of its own that it destroys and
// replaces (release_stream first under StreamChecks::none, as the contract asks), its per-thread
// default stream, buffers recorded on its other streams, raw allocations freed on another of its
// streams, sleeps past idle_ms, and buffers handed to the next wave of threads.
struct Shared {
  MemoryPool* pool = nullptr;
  FakeDevice* fake = nullptr;
  StreamChecks checks = StreamChecks::full;
  std::mutex mutex;                 // guards handed
  std::vector<Bytes> handed;        // buffers on an exited thread's per-thread stream
  std::atomic<std::int64_t> failures{0};
};

void worker(Shared& shared, std::uint32_t seed, int steps) {
  std::mt19937 random(seed);
  MemoryPool& pool = *shared.pool;
  FakeDevice& fake = *shared.fake;
  constexpr int own = 3;
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < own; ++i) streams.push_back(fake.create_stream());
  struct Live {
    Bytes buffer;
    int stream;                 // index in streams, or -1: the per-thread default stream
    std::vector<int> recorded;  // streams record_stream named
  };
  std::vector<Live> live;
  struct Raw {
    void* ptr;
    std::size_t bytes;
    int stream;
  };
  std::vector<Raw> raw;
  const auto handle = [&](int i) { return i < 0 ? cudaStreamPerThread : streams[i]; };
  const auto pick_size = [&]() -> std::size_t {
    switch (random() % 4) {
      case 0: return 256 + random() % 2048;
      case 1: return 8 * KiB + random() % (64 * KiB);
      case 2: return 300 * KiB + random() % (2 * MiB);
      default: return 512;
    }
  };
  for (int step = 0; step < steps; ++step) {
    const auto op = random() % 100;
    if (op < 40) {
      const int s = static_cast<int>(random() % (own + 1)) - 1;
      Live l{Bytes::alloc_async(pool, pick_size(), handle(s)), s, {}};
      fake.launch(handle(s), {{l.buffer.data(), l.buffer.byte_size(), true}});
      if (random() % 4 == 0) {
        const int r = static_cast<int>(random() % own);
        if (r != s) {
          l.buffer.record_stream(streams[r]);
          l.recorded.push_back(r);
          cudaEvent_t event = nullptr;  // the other stream reads after the write
          if (fake.event_create(&event) != cudaSuccess) ++shared.failures;
          if (fake.event_record(event, handle(s)) != cudaSuccess) ++shared.failures;
          if (fake.stream_wait_event(streams[r], event) != cudaSuccess) ++shared.failures;
          if (fake.event_destroy(event) != cudaSuccess) ++shared.failures;
          fake.launch(streams[r], {{l.buffer.data(), l.buffer.byte_size(), false}});
        }
      }
      live.push_back(std::move(l));
    } else if (op < 70) {
      if (!live.empty()) {
        const std::size_t i = random() % live.size();
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    } else if (op < 78) {
      const int s = static_cast<int>(random() % own);
      const std::size_t bytes = pick_size();
      void* p = pool.allocate(bytes, streams[s]);
      fake.launch(streams[s], {{p, bytes, true}});
      raw.push_back({p, bytes, s});
    } else if (op < 86) {
      if (!raw.empty()) {
        const std::size_t i = random() % raw.size();
        // Freed on another of its streams, ordered after the writer by an event.
        const int to = static_cast<int>(random() % own);
        cudaEvent_t event = nullptr;
        if (fake.event_create(&event) != cudaSuccess) ++shared.failures;
        if (fake.event_record(event, streams[raw[i].stream]) != cudaSuccess) ++shared.failures;
        if (fake.stream_wait_event(streams[to], event) != cudaSuccess) ++shared.failures;
        if (fake.event_destroy(event) != cudaSuccess) ++shared.failures;
        pool.deallocate(raw[i].ptr, raw[i].bytes, streams[to]);
        raw.erase(raw.begin() + static_cast<std::ptrdiff_t>(i));
      }
    } else if (op < 91) {
      // Replace one of its streams: every buffer used on it dropped first (the contract).
      const int s = static_cast<int>(random() % own);
      std::erase_if(live, [&](const Live& l) {
        return l.stream == s || std::find(l.recorded.begin(), l.recorded.end(), s) != l.recorded.end();
      });
      for (auto it = raw.begin(); it != raw.end();) {
        if (it->stream == s) {
          pool.deallocate(it->ptr, it->bytes, streams[s]);
          it = raw.erase(it);
        } else {
          ++it;
        }
      }
      if (shared.checks == StreamChecks::none) pool.release_stream(streams[s]);
      fake.destroy_stream(streams[s]);
      streams[s] = fake.create_stream();
    } else if (op < 94) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past idle_ms
    } else if (op < 97) {
      fake.complete_all();
    } else if (op < 98) {
      pool.release_stream(streams[random() % own]);
    } else {
      (void)pool.stats();
    }
  }
  // Buffers of the per-thread default stream outlive the thread: the next wave drops them.
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    for (Live& l : live) {
      if (l.stream < 0 && l.recorded.empty()) shared.handed.push_back(std::move(l.buffer));
    }
  }
  live.clear();
  for (const Raw& r : raw) pool.deallocate(r.ptr, r.bytes, streams[r.stream]);
  if (shared.checks == StreamChecks::none) {
    for (cudaStream_t s : streams) pool.release_stream(s);
  }
  for (cudaStream_t s : streams) fake.destroy_stream(s);
}

void run_lifecycle(StreamChecks checks, std::uint32_t seed, bool cross_stream_wait = false,
                   bool expandable = false) {
  auto options = test_options();
  options.cross_stream_wait = cross_stream_wait;
  options.expandable_segments = expandable;
  options.stream_checks = checks;
  options.idle_ms = 1;
  options.unfenced_bytes = 64 * KiB;
  options.slab_bytes = 64 * KiB;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  Shared shared;
  shared.pool = pool.pool.get();
  shared.fake = &fake;
  shared.checks = checks;
  for (int wave = 0; wave < 4; ++wave) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back(worker, std::ref(shared), seed * 100 + wave * 10 + t, 600);
    }
    {
      // This wave drops what the last left on exited threads' per-thread streams.
      std::vector<Bytes> old;
      {
        std::lock_guard<std::mutex> lock(shared.mutex);
        old.swap(shared.handed);
      }
    }
    for (auto& t : threads) t.join();
  }
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    shared.handed.clear();
  }
  CHECK(shared.failures == 0);
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
  PoolStats stats = pool->stats();
  CHECK(stats.live_allocations.current == 0);
  CHECK(stats.requested_bytes.current == 0);
  pool->trim();
  stats = pool->stats();
  INFO(streampool::to_string(pool->breakdown()));
  CHECK(stats.reserved_bytes.current == 0);
  pool.pool.reset();
  CHECK(fake.live_allocations() == 0);
  CHECK(fake.live_events() == 0);
}

}  // namespace

TEST_CASE("threads that replace their streams, use per-thread streams and idle past idle_ms: no "
          "race, nothing left") {
  const auto checks = GENERATE(StreamChecks::none, StreamChecks::identity, StreamChecks::full);
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(static_cast<int>(checks), seed);
  run_lifecycle(checks, seed);
}

TEST_CASE("the same with cross_stream_wait, with and without expandable segments") {
  const auto checks = GENERATE(StreamChecks::none, StreamChecks::identity);
  const bool expandable = GENERATE(false, true);
  const std::uint32_t seed = GENERATE(4u, 5u);
  CAPTURE(static_cast<int>(checks), expandable, seed);
  run_lifecycle(checks, seed, true, expandable);
}

// Idle retirement of a stream whose dropped blocks are still used by pending work: another
// stream that retires it (its slow path) must not get those blocks before the work is done.
TEST_CASE("a stream retired for being idle keeps its pending blocks from other streams") {
  auto options = one_block_slabs();
  options.idle_ms = 1;
  const auto checks = GENERATE(StreamChecks::none, StreamChecks::identity, StreamChecks::full);
  options.stream_checks = checks;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream("a");
  cudaStream_t b = fake.create_stream("b");
  std::vector<void*> mine;
  {
    std::vector<Bytes> on_a;
    for (int i = 0; i < 8; ++i) {
      on_a.push_back(Bytes::alloc_async(*pool, 2048, a));
      write_on(fake, a, on_a.back());
    }
  }  // dropped on a, its writes pending
  // b's slow paths look at idle streams once a period: twice, more than a period apart.
  std::vector<Bytes> on_b;
  for (int round = 0; round < 4; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    for (int i = 0; i < 20; ++i) {
      on_b.push_back(Bytes::alloc_async(*pool, 2048, b));
      write_on(fake, b, on_b.back());
    }
  }
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  on_b.clear();
  fake.complete_all();
  pool->trim();
  CHECK(pool->stats().reserved_bytes.current == 0);
}
