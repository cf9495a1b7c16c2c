// Waits for the pool's locks, counted process-wide (streampool::lock_contention(), pool_stats.hpp):
// how often a thread found a lock held and how long it waited, for the bench's stress report. Only
// the waits are timed, so an uncontended acquisition costs nothing more: the stream locks count
// in BiasedLock's slow path, the mutexes through CountedMutex, which tries first.
#pragma once

#include <cstdint>
#include <mutex>

namespace streampool::detail {

namespace contention {
enum Kind : int {
  stream,      // a stream state's lock held by another thread (its inner lock)
  revocation,  // a stream lock taken from the thread it was biased to (the barrier and the wait)
  arena,       // the large tier's mutex
  growth,      // the large tier's growth mutex (one device allocation at a time)
  events,      // the idle fence events
  kinds
};
// The steady clock, for timing a wait.
std::int64_t clock_ns() noexcept;
// One wait of `kind` that began at `since` (clock_ns()) and is over now.
void waited(Kind kind, std::int64_t since) noexcept;
}  // namespace contention

// A std::mutex whose waits are counted (contention::waited).
class CountedMutex {
 public:
  explicit CountedMutex(contention::Kind kind) noexcept : kind_(kind) {}
  CountedMutex(const CountedMutex&) = delete;
  CountedMutex& operator=(const CountedMutex&) = delete;

  void lock() {
    if (mutex_.try_lock()) return;
    const std::int64_t since = contention::clock_ns();
    mutex_.lock();
    contention::waited(kind_, since);
  }
  bool try_lock() { return mutex_.try_lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
  const contention::Kind kind_;
};

}  // namespace streampool::detail
