// lock_contention() (pool_stats.hpp): a wait for a stream's lock, a revocation of its bias and a
// wait for a CountedMutex are each counted once, with their time; an acquisition that finds the
// lock free is not counted. The counts are the process's: each check reads the difference.
#include "../lib/pool/biased_lock.hpp"
#include "../lib/pool/contention.hpp"

#include <streampool/pool_stats.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

using streampool::LockContention;
using streampool::lock_contention;
using streampool::detail::BiasedLock;
using streampool::detail::CountedMutex;
namespace contention = streampool::detail::contention;

namespace {

// Holds `lock` on another thread for `ms`, while this thread takes it: one wait of about that long.
// The holder's time starts once this thread is about to take the lock: started when the holder
// took it, the time could pass while this thread was not yet running (a CI run on a loaded
// two-core machine counted 6.6 ms of a 20 ms hold). The checks ask for 10 ms of a 50 ms hold.
template <class Lock>
void wait_behind(Lock& lock, int ms) {
  std::atomic<bool> held{false};
  std::atomic<bool> taking{false};
  std::thread holder([&] {
    lock.lock();
    held = true;
    while (!taking) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    lock.unlock();
  });
  while (!held) std::this_thread::yield();
  taking = true;
  lock.lock();
  lock.unlock();
  holder.join();
}

}  // namespace

TEST_CASE("lock_contention counts the waits for a held lock and their time, and nothing else") {
  SECTION("a CountedMutex") {
    CountedMutex mutex{contention::arena};
    const LockContention before = lock_contention();
    for (int i = 0; i < 100; ++i) {
      mutex.lock();
      mutex.unlock();
    }
    CHECK(lock_contention().arena.waits == before.arena.waits);
    wait_behind(mutex, 50);
    const LockContention after = lock_contention();
    CHECK(after.arena.waits == before.arena.waits + 1);
    CHECK(after.arena.ns - before.arena.ns >= 10'000'000);  // of the 50 ms it held it
    CHECK(after.growth.waits == before.growth.waits);
  }
  SECTION("a stream's lock held by another thread, unbiased") {
    BiasedLock lock;
    const LockContention before = lock_contention();
    lock.lock();  // one acquisition: far from the bias threshold
    lock.unlock();
    CHECK(lock_contention().stream.waits == before.stream.waits);
    wait_behind(lock, 50);
    const LockContention after = lock_contention();
    CHECK(after.stream.waits == before.stream.waits + 1);
    CHECK(after.stream.ns - before.stream.ns >= 10'000'000);
  }
  SECTION("a stream's lock taken from the thread it is biased to") {
    if (!BiasedLock::biasing_available()) {
      WARN("no membarrier here: locks are never biased, so never revoked");
      return;
    }
    BiasedLock lock;
    std::atomic<bool> biased{false};
    std::atomic<bool> done{false};
    // The owner stays alive (an exited thread's record, and its biases, go to the next thread).
    std::thread owner([&] {
      for (std::uint32_t i = 0; i <= BiasedLock::first_threshold; ++i) {
        lock.lock();
        lock.unlock();
      }
      biased = true;
      while (!done) std::this_thread::yield();
    });
    while (!biased) std::this_thread::yield();
    REQUIRE(lock.biased());
    const LockContention before = lock_contention();
    lock.lock();  // revokes the owner's bias: a barrier; the owner is not inside
    lock.unlock();
    const LockContention after = lock_contention();
    done = true;
    owner.join();
    CHECK(after.revocation.waits == before.revocation.waits + 1);
    CHECK(after.stream.waits == before.stream.waits);
  }
}
