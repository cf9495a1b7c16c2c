// A test-and-test-and-set lock: uncontended, lock + unlock is one atomic exchange and one store.
// The stream state's lock (BiasedLock, biased_lock.hpp) wraps one, which its bias owner skips;
// the raw API's pointer shards use it as it is.
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STREAMPOOL_CPU_RELAX() _mm_pause()
#else
#define STREAMPOOL_CPU_RELAX() ((void)0)
#endif

namespace streampool::detail {

// One step of waiting for another thread: a pause for the first 64 steps, then a yield (the
// thread waited for may be inside a fence record, ~0.4 us, or descheduled).
inline void back_off(unsigned& spins) noexcept {
  if (spins++ < 64) {
    STREAMPOOL_CPU_RELAX();
  } else {
    std::this_thread::yield();
  }
}

class SpinLock {
 public:
  void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    lock_contended();
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept {
    for (unsigned spins = 0;; ++spins) {
      while (locked_.load(std::memory_order_relaxed)) back_off(spins);
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  std::atomic<bool> locked_{false};
};

}  // namespace streampool::detail
