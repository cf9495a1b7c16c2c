// The stream state's lock, biased to the thread that takes it (lib/pool/biased_lock.hpp): it is
// biased after a run of acquisitions by one thread, another thread takes it from the owner, and
// mutual exclusion holds through every hand-over, nested locks included.
#include "../lib/pool/biased_lock.hpp"
#include "pool_helpers.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

using streampool::detail::BiasedLock;

namespace {

void take(BiasedLock& lock, std::uint32_t times) {
  for (std::uint32_t i = 0; i < times; ++i) {
    lock.lock();
    lock.unlock();
  }
}

// One thread that runs what it is given, in turn, and stays alive between: the owner of the
// locks it biases for as long as the test needs it.
class OwnerThread {
 public:
  OwnerThread() : thread_([this] { serve(); }) {}
  ~OwnerThread() {
    run({});
    thread_.join();
  }
  // Runs `task` on the thread and waits for it; an empty task ends the thread.
  void run(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_ = false;
    task_ = std::move(task);
    has_task_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return done_; });
  }

 private:
  void serve() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return has_task_; });
        has_task_ = false;
        task = std::move(task_);
      }
      if (task) task();
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      changed_.notify_all();
      if (!task) return;
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> task_;
  bool has_task_ = false;
  bool done_ = false;
  std::thread thread_;
};

// A lock and what it guards: a plain counter (ThreadSanitizer sees an entry not ordered after
// the one before) and how many threads are inside.
struct Guarded {
  BiasedLock lock;
  std::int64_t count = 0;
  std::atomic<int> inside{0};
};

// One entry by a thread that holds g.lock, counted; another thread inside at the same time is an
// overlap.
void count_entry(Guarded& g, std::atomic<int>& overlaps) {
  if (g.inside.fetch_add(1, std::memory_order_relaxed) != 0) overlaps.fetch_add(1);
  ++g.count;
  g.inside.fetch_sub(1, std::memory_order_relaxed);
}

// Whether the calling thread enters `lock` through its bias.
bool enters_through_bias(BiasedLock& lock) {
  lock.lock();
  const bool through_bias = lock.held_through_bias();
  lock.unlock();
  return through_bias;
}

}  // namespace

TEST_CASE("a lock that one thread takes again and again is biased to it, and another thread "
          "takes it back") {
  BiasedLock lock;
  if (!BiasedLock::biasing_available()) {
    WARN("membarrier(2) is not available here: locks are never biased");
    take(lock, 10 * BiasedLock::first_threshold);
    CHECK_FALSE(lock.biased());
    return;
  }
  CHECK_FALSE(lock.biased());
  take(lock, BiasedLock::first_threshold - 1);
  CHECK_FALSE(lock.biased());
  take(lock, 1);
  CHECK(lock.biased());
  take(lock, 1000);  // through the bias
  CHECK(lock.biased());

  // Another thread: it revokes the bias, and the lock stays unbiased for twice as long.
  std::thread([&] { take(lock, 1); }).join();
  CHECK_FALSE(lock.biased());
  take(lock, BiasedLock::first_threshold);
  CHECK_FALSE(lock.biased());
  take(lock, BiasedLock::first_threshold);
  CHECK(lock.biased());
}

TEST_CASE("a thread inside one lock through its bias takes a second lock biased to it through "
          "the inner lock, and another thread still gets both") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  BiasedLock a;
  BiasedLock b;
  take(a, BiasedLock::first_threshold);
  take(b, BiasedLock::first_threshold);
  REQUIRE(a.biased());
  REQUIRE(b.biased());
  int in_b = 0;
  std::atomic<bool> holding{false};
  std::atomic<bool> other_done{false};
  a.lock();
  b.lock();  // nested: not through the bias
  std::thread other([&] {
    while (!holding.load()) std::this_thread::yield();
    b.lock();  // waits for the owner's inner hold, then revokes
    ++in_b;
    b.unlock();
    other_done.store(true);
  });
  ++in_b;
  holding.store(true);
  for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  CHECK_FALSE(other_done.load());  // still held here
  b.unlock();
  a.unlock();
  other.join();
  CHECK(in_b == 2);
  CHECK(a.biased());  // untouched by the other thread
  CHECK_FALSE(b.biased());
}

TEST_CASE("threads that take turns in bursts on shared biased locks never overlap inside") {
  // Bursts long enough to bias a lock, then another thread: every lock is biased and revoked
  // again and again (its threshold doubling), while the counters, plain ints, count every
  // entry. ThreadSanitizer sees any entry that is not ordered after the previous one.
  constexpr int threads = 4;
  constexpr int locks = 16;
  constexpr int rounds = 40;
  auto guarded = std::make_unique<Guarded[]>(locks);
  std::atomic<int> overlaps{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int round = 0; round < rounds; ++round) {
        for (int k = 0; k < locks; ++k) {
          Guarded& g = guarded[(k + t * 5 + round) % locks];
          const int burst = 8 + (round * 37 + t * 11 + k * 3) % 200;
          for (int i = 0; i < burst; ++i) {
            g.lock.lock();
            if (g.inside.fetch_add(1, std::memory_order_relaxed) != 0) overlaps.fetch_add(1);
            ++g.count;
            // Sometimes a second lock inside the first, always in address order (the pool
            // never holds two stream locks at once; the lock allows it).
            if ((i & 15) == 3) {
              Guarded& h = guarded[(k + t * 5 + round + 1) % locks];
              if (&h > &g) {
                h.lock.lock();
                count_entry(h, overlaps);
                h.lock.unlock();
              }
            }
            g.inside.fetch_sub(1, std::memory_order_relaxed);
            g.lock.unlock();
          }
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  CHECK(overlaps.load() == 0);
  std::int64_t expected = 0;
  for (int t = 0; t < threads; ++t) {
    for (int round = 0; round < rounds; ++round) {
      for (int k = 0; k < locks; ++k) {
        const int burst = 8 + (round * 37 + t * 11 + k * 3) % 200;
        expected += burst;
        const Guarded* g = &guarded[(k + t * 5 + round) % locks];
        const Guarded* h = &guarded[(k + t * 5 + round + 1) % locks];
        if (h > g) expected += (burst + 12) / 16;  // i & 15 == 3 for i < burst
      }
    }
  }
  std::int64_t counted = 0;
  for (int k = 0; k < locks; ++k) counted += guarded[k].count;
  CHECK(counted == expected);
}

TEST_CASE("an owner entering again and again while another thread revokes its bias never "
          "overlaps the revoker") {
  // A fresh lock each round, so that it is biased after the first run of acquisitions: the owner
  // takes it until it is biased and goes on taking it; another thread takes it once, revoking
  // the bias while the owner is entering. A revoke that does not wait for the owner, an owner
  // that does not see revoking_, or no barrier between them lets the two in at once.
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  int overlaps = 0;
  std::int64_t lost = 0;
  for (int round = 0; round < 1000; ++round) {
    auto g = std::make_unique<Guarded>();
    std::atomic<int> overlapped{0};
    const auto enter = [&] {
      g->lock.lock();
      count_entry(*g, overlapped);
      g->lock.unlock();
    };
    std::atomic<bool> biased{false};
    std::atomic<bool> stop{false};
    std::int64_t owner_entries = 0;
    std::thread owner([&] {
      while (!g->lock.biased()) {
        enter();
        ++owner_entries;
      }
      biased.store(true);
      while (!stop.load(std::memory_order_relaxed)) {
        enter();
        ++owner_entries;
      }
    });
    while (!biased.load()) std::this_thread::yield();
    enter();  // revokes
    stop.store(true);
    owner.join();
    overlaps += overlapped.load();
    lost += owner_entries + 1 - g->count;
  }
  CHECK(overlaps == 0);
  CHECK(lost == 0);
}

TEST_CASE("a thread's record goes to the next thread when it exits, biases and all") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  BiasedLock mine;
  take(mine, 1);  // this thread's record, before the others come and go
  BiasedLock lock;
  std::thread([&] { take(lock, BiasedLock::first_threshold); }).join();
  CHECK(lock.biased());  // to the exited thread's record
  // The next new thread gets that record (the last given back), and enters through the bias.
  int count = 0;
  std::thread([&] {
    lock.lock();
    ++count;
    lock.unlock();
  }).join();
  CHECK(lock.biased());
  // This thread has a record of its own: it revokes.
  lock.lock();
  ++count;
  lock.unlock();
  CHECK(count == 2);
  CHECK_FALSE(lock.biased());
}

TEST_CASE("a sweep takes many locks biased to another thread with one barrier, and leaves them "
          "biased to it") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  BiasedLock mine;
  take(mine, 1);  // this thread's record, before the owner's thread comes
  constexpr int n = 16;
  std::vector<BiasedLock> locks(n);
  std::vector<int> counts(n, 0);
  OwnerThread owner;
  owner.run([&] {
    for (BiasedLock& lock : locks) take(lock, BiasedLock::first_threshold);
  });
  for (const BiasedLock& lock : locks) REQUIRE(lock.biased());

  const std::uint64_t before = BiasedLock::barriers();
  {
    BiasedLock::Sweep sweep;
    for (BiasedLock& lock : locks) sweep.mark(lock);
    sweep.cover();
    for (int i = 0; i < n; ++i) {
      sweep.lock(locks[i]);
      CHECK_FALSE(locks[i].held_through_bias());
      ++counts[i];
      locks[i].unlock();
    }
  }
  CHECK(BiasedLock::barriers() - before == 1);  // revoking each in turn would run 16
  int still_biased = 0;
  for (const BiasedLock& lock : locks) still_biased += lock.biased() ? 1 : 0;
  CHECK(still_biased == n);
  // The owner enters each through its bias again at once.
  int through_bias = 0;
  owner.run([&] {
    for (int i = 0; i < n; ++i) {
      locks[i].lock();
      through_bias += locks[i].held_through_bias() ? 1 : 0;
      ++counts[i];
      locks[i].unlock();
    }
  });
  CHECK(through_bias == n);
  CHECK(BiasedLock::barriers() - before == 1);
  for (int count : counts) CHECK(count == 2);

  // A sweep of locks biased to nobody but this thread runs no barrier.
  take(mine, BiasedLock::first_threshold);
  REQUIRE(mine.biased());
  {
    BiasedLock::Sweep sweep;
    sweep.mark(mine);
    sweep.cover();
    sweep.lock(mine);
    CHECK(mine.held_through_bias());
    mine.unlock();
  }
  CHECK(BiasedLock::barriers() - before == 1);
}

TEST_CASE("while a sweep has marked a lock its owner enters through the inner lock, and a mark "
          "the sweep leaves unused is undone when the sweep goes") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  BiasedLock mine;
  take(mine, 1);
  BiasedLock lock;
  OwnerThread owner;
  owner.run([&] { take(lock, BiasedLock::first_threshold); });
  bool through_bias = false;
  owner.run([&] { through_bias = enters_through_bias(lock); });
  REQUIRE(through_bias);
  {
    BiasedLock::Sweep sweep;
    sweep.mark(lock);
    sweep.cover();
    owner.run([&] { through_bias = enters_through_bias(lock); });
    CHECK_FALSE(through_bias);  // marked
    CHECK(lock.biased());
  }
  owner.run([&] { through_bias = enters_through_bias(lock); });
  CHECK(through_bias);  // the sweep's end gave it back

  // A sweep whose barrier has not run takes a marked lock as any other thread does: it revokes.
  std::uint64_t before = BiasedLock::barriers();
  {
    BiasedLock::Sweep sweep;
    sweep.mark(lock);
    sweep.lock(lock);
    lock.unlock();
  }
  CHECK(BiasedLock::barriers() - before == 1);
  CHECK_FALSE(lock.biased());

  // So does a lock marked after the barrier: no barrier follows its mark.
  BiasedLock other;
  owner.run([&] {
    take(lock, 2 * BiasedLock::first_threshold);
    take(other, BiasedLock::first_threshold);
  });
  REQUIRE(lock.biased());
  REQUIRE(other.biased());
  before = BiasedLock::barriers();
  const std::uint64_t borrowed = BiasedLock::borrows();
  {
    BiasedLock::Sweep sweep;
    sweep.mark(other);
    sweep.cover();
    sweep.mark(lock);
    sweep.lock(other);
    other.unlock();
    sweep.lock(lock);
    lock.unlock();
  }
  CHECK(BiasedLock::borrows() - borrowed == 1);
  CHECK(BiasedLock::barriers() - before == 2);
  CHECK(other.biased());
  CHECK_FALSE(lock.biased());
}

TEST_CASE("sweeps inside a sweep, and sweeps on two threads at once, borrow every lock they mark "
          "and leave each biased to its owner") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  BiasedLock mine;
  take(mine, 1);
  constexpr int n = 8;
  std::vector<BiasedLock> locks(n);
  OwnerThread owner;
  owner.run([&] {
    for (BiasedLock& lock : locks) take(lock, BiasedLock::first_threshold);
  });
  for (const BiasedLock& lock : locks) REQUIRE(lock.biased());
  const auto all_through_bias = [&] {
    int through_bias = 0;
    owner.run([&] {
      for (BiasedLock& lock : locks) through_bias += enters_through_bias(lock) ? 1 : 0;
    });
    return through_bias == n;
  };

  // One thread: an outer sweep marks the first half, an inner one (between the outer's barrier
  // and its locks) the first and the second half.
  std::uint64_t before = BiasedLock::barriers();
  std::uint64_t borrowed = BiasedLock::borrows();
  {
    BiasedLock::Sweep outer;
    for (int i = 0; i < n / 2; ++i) outer.mark(locks[i]);
    outer.cover();
    {
      BiasedLock::Sweep inner;
      for (BiasedLock& lock : locks) inner.mark(lock);
      inner.cover();
      for (BiasedLock& lock : locks) {
        inner.lock(lock);
        lock.unlock();
      }
    }
    for (int i = 0; i < n / 2; ++i) {
      outer.lock(locks[i]);
      CHECK_FALSE(locks[i].held_through_bias());
      locks[i].unlock();
    }
  }
  CHECK(BiasedLock::barriers() - before == 2);
  CHECK(BiasedLock::borrows() - borrowed == n + n / 2);
  CHECK(all_through_bias());

  // Two threads, each sweeping every lock, many times over, at once.
  constexpr int rounds = 50;
  before = BiasedLock::barriers();
  borrowed = BiasedLock::borrows();
  std::vector<std::thread> sweepers;
  for (int t = 0; t < 2; ++t) {
    sweepers.emplace_back([&] {
      for (int round = 0; round < rounds; ++round) {
        BiasedLock::Sweep sweep;
        for (BiasedLock& lock : locks) sweep.mark(lock);
        sweep.cover();
        for (BiasedLock& lock : locks) {
          sweep.lock(lock);
          lock.unlock();
        }
      }
    });
  }
  for (std::thread& t : sweepers) t.join();
  CHECK(BiasedLock::borrows() - borrowed == 2 * rounds * n);
  CHECK(BiasedLock::barriers() - before <= 2 * rounds);  // at most one a sweep
  CHECK(all_through_bias());
}

TEST_CASE("owners entering their biased locks again and again while one thread sweeps them and "
          "another revokes never overlap") {
  // Each owner keeps taking its own lock; a sweeper marks all, covers and takes each, round after
  // round; a third thread now and then takes one lock plainly (a revoke, after which its owner
  // earns the bias again). The counters are plain ints: ThreadSanitizer sees any entry not ordered
  // after the one before.
  constexpr int owners = 3;
  auto guarded = std::make_unique<Guarded[]>(owners);
  std::atomic<int> overlaps{0};
  const auto enter = [&](Guarded& g) {
    g.lock.lock();
    count_entry(g, overlaps);
    g.lock.unlock();
  };
  std::atomic<bool> stop{false};
  std::vector<std::int64_t> entries(owners + 2, 0);
  const std::uint64_t borrowed = BiasedLock::borrows();
  std::vector<std::thread> threads;
  for (int t = 0; t < owners; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load(std::memory_order_relaxed)) {
        enter(guarded[t]);
        ++entries[t];
      }
    });
  }
  threads.emplace_back([&] {  // the sweeper
    for (int round = 0; round < 400; ++round) {
      BiasedLock::Sweep sweep;
      for (int k = 0; k < owners; ++k) sweep.mark(guarded[k].lock);
      sweep.cover();
      for (int k = 0; k < owners; ++k) {
        if ((round + k) % 5 == 4) continue;  // left marked: undone when the sweep goes
        Guarded& g = guarded[k];
        sweep.lock(g.lock);
        count_entry(g, overlaps);
        g.lock.unlock();
        ++entries[owners];
      }
      std::this_thread::yield();
    }
  });
  threads.emplace_back([&] {  // the revoker
    for (int round = 0; round < 100; ++round) {
      enter(guarded[round % owners]);
      ++entries[owners + 1];
      for (int i = 0; i < 20; ++i) std::this_thread::yield();
    }
  });
  threads[owners + 1].join();
  threads[owners].join();
  stop.store(true);
  for (int t = 0; t < owners; ++t) threads[t].join();
  CHECK(overlaps.load() == 0);
  if (BiasedLock::biasing_available()) CHECK(BiasedLock::borrows() > borrowed);
  std::int64_t expected = 0;
  for (std::int64_t e : entries) expected += e;
  std::int64_t counted = 0;
  for (int k = 0; k < owners; ++k) counted += guarded[k].count;
  CHECK(counted == expected);
}

TEST_CASE("stats() on a pool whose streams are each used by a thread of its own runs one barrier, "
          "and leaves each stream's lock to its thread") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  PoolOnFake f;
  BiasedLock mine;
  take(mine, 1);  // this thread's record
  constexpr int n = 4;
  std::vector<std::unique_ptr<OwnerThread>> owners;
  std::vector<cudaStream_t> streams;
  for (int t = 0; t < n; ++t) {
    owners.push_back(std::make_unique<OwnerThread>());
    streams.push_back(f.device->create_stream());
  }
  const auto pairs = [&](int t) {
    owners[t]->run([&] {
      for (int i = 0; i < 300; ++i) {
        auto b = streampool::PooledBuffer<std::byte>::alloc_async(*f.pool, 4096, streams[t]);
      }
    });
  };
  // Twice: in the first round each stream but the first takes blocks from the one before (a
  // revoke); from the second on each has its own, and each lock is biased to its thread.
  for (int t = 0; t < n; ++t) pairs(t);
  for (int t = 0; t < n; ++t) pairs(t);
  for (int round = 0; round < 2; ++round) {
    const std::uint64_t before = BiasedLock::barriers();
    const std::uint64_t borrowed = BiasedLock::borrows();
    const streampool::PoolStats stats = f.pool->stats();
    // Revoked, the locks would cost a barrier each now, and each again after the pairs below
    // (300 pairs bias them once more).
    CHECK(BiasedLock::barriers() - before == 1);
    CHECK(BiasedLock::borrows() - borrowed == n);
    CHECK(stats.live_allocations.total == 300 * n * (round + 2));
    for (int t = 0; t < n; ++t) pairs(t);
  }
}

TEST_CASE("a sweep's mark goes with the bias when another thread revokes it: the sweep then takes "
          "the lock as any other thread does, even once the lock is biased again") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  BiasedLock mine;
  take(mine, 1);
  BiasedLock lock;
  OwnerThread owner;
  owner.run([&] { take(lock, BiasedLock::first_threshold); });
  REQUIRE(lock.biased());
  const std::uint64_t borrowed = BiasedLock::borrows();
  {
    BiasedLock::Sweep sweep;
    sweep.mark(lock);
    sweep.cover();
    std::thread([&] { take(lock, 1); }).join();  // a revoke
    REQUIRE_FALSE(lock.biased());
    owner.run([&] { take(lock, 4 * BiasedLock::first_threshold); });  // biased again
    REQUIRE(lock.biased());
    const std::uint64_t before = BiasedLock::barriers();
    sweep.lock(lock);  // the mark was on the old bias: a revoke, not a borrow
    lock.unlock();
    CHECK(BiasedLock::barriers() - before == 1);
    CHECK_FALSE(lock.biased());
  }
  CHECK(BiasedLock::borrows() == borrowed);
  // Nothing of the old mark is left to take back: the lock is biased and given back as usual
  // (debug builds assert that no mark is pending at each bias).
  owner.run([&] { take(lock, 8 * BiasedLock::first_threshold); });
  REQUIRE(lock.biased());
  bool through_bias = false;
  owner.run([&] { through_bias = enters_through_bias(lock); });
  CHECK(through_bias);
}

TEST_CASE("a sweep whose marks a barrier begun after them has covered runs none of its own") {
  if (!BiasedLock::biasing_available()) return;  // the first test checks that case
  BiasedLock mine;
  take(mine, 1);
  BiasedLock lock;
  BiasedLock unrelated;
  OwnerThread owner;
  owner.run([&] {
    take(lock, BiasedLock::first_threshold);
    take(unrelated, BiasedLock::first_threshold);
  });
  REQUIRE(lock.biased());
  REQUIRE(unrelated.biased());
  const std::uint64_t borrowed = BiasedLock::borrows();
  BiasedLock::Sweep sweep;
  sweep.mark(lock);
  bool through_bias = true;
  owner.run([&] { through_bias = enters_through_bias(lock); });
  CHECK_FALSE(through_bias);  // marked: the owner enters through the inner lock
  std::thread([&] { take(unrelated, 1); }).join();  // another thread's revoke: one barrier
  const std::uint64_t before = BiasedLock::barriers();
  sweep.cover();
  CHECK(BiasedLock::barriers() == before);
  sweep.lock(lock);
  lock.unlock();
  CHECK(BiasedLock::borrows() - borrowed == 1);
  CHECK(lock.biased());
  owner.run([&] { through_bias = enters_through_bias(lock); });
  CHECK(through_bias);
}
