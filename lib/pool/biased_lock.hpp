// BiasedLock: the lock of a stream's state, biased towards the one thread that uses the stream.
//
// An uncontended SpinLock costs one atomic exchange to take: about 6-8 ns on the machines
// measured, a third or more of a same-stream allocate + drop pair under StreamChecks::none
// (docs/design.md, "The stream lock, biased"). Most streams are used by one thread at a time, so
// the lock lets that thread in with plain stores:
//
//   - once one thread has taken the lock `threshold` times in a row through its inner SpinLock
//     (no other thread in between), the lock is biased to that thread (its Owner record);
//   - the owner enters by writing `this` to its record's `inside` and then reading `revoking_`
//     and the bias again: a store and two loads, ordered against another thread only by the
//     compiler;
//   - any other thread takes the inner SpinLock, sets `revoking_`, and runs an asymmetric barrier
//     (membarrier(2), MEMBARRIER_CMD_PRIVATE_EXPEDITED), which orders the owner's store and load
//     as a full fence on the owner's CPU would; it then waits for the owner's `inside` to leave
//     this lock and takes the lock from it. Either the owner's store was seen (it waits for the
//     owner to leave) or the owner's load sees `revoking_` (the owner backs out to the inner
//     lock). The lock stays unbiased and the threshold doubles, so that a stream shared by
//     threads pays the barrier (a system call, microseconds) rarely.
//
// A sweep (stats(), the reclaim's walks: one thread locking every stream in turn) would revoke
// every lock biased to another thread, a barrier each, and leave each owner to earn its bias again
// over a doubled run. A Sweep instead marks the locks first (`revoking_` set, the sweep's ticket
// in `marked_`), runs one barrier for all of them, and its thread's next lock() of a marked lock
// borrows it: it waits for the owner to leave, as a revoker does, but keeps the bias, which its
// unlock() gives back by clearing `revoking_`. While a lock is marked its owner enters through
// the inner lock; the marks a sweep leaves unused are undone when it goes; any other thread
// revokes as usual.
//
// Invariants (checked in debug builds where they can be):
//   - at most one thread is inside: the bias owner through `inside`, or the holder of `inner_`;
//   - `bias_` changes only under `inner_`, with no owner inside this lock;
//   - `revoking_` is false only while `bias_` names an owner whose entry is allowed;
//   - `marked_` is not zero only while `bias_` is set and `revoking_` is true; it is the ticket
//     of the sweep that marked the lock last, and only the thread whose barrier ran after that
//     mark (its `covered` ticket is that one) may borrow the lock;
//   - `held_` is written only by the thread inside.
//
// Where membarrier is not available (not Linux, or refused), no lock is ever biased: it is the
// SpinLock it wraps.
#pragma once

#include "checks.hpp"
#include "spin_lock.hpp"

#include <atomic>
#include <cstdint>
#include <vector>

namespace streampool::detail {

class BiasedLock;

namespace biased_lock {
struct alignas(64) Owner {
  // The biased lock this thread is inside through its bias, or null: written by the thread
  // alone, read by a revoker.
  std::atomic<const BiasedLock*> inside{nullptr};
  Owner* next_free = nullptr;
};
// This thread's record, null until its first slow path of a BiasedLock takes one.
extern constinit thread_local Owner* this_thread;
}  // namespace biased_lock

class BiasedLock {
 public:
  // A thread's record. One per thread, reused by a later thread once the thread exits (a lock
  // still biased to the record is then biased to the new thread, which is as good).
  using Owner = biased_lock::Owner;

  void lock() noexcept {
    if (Owner* const bias = bias_.load(std::memory_order_relaxed); bias != nullptr) {
      Owner* const me = biased_lock::this_thread;
      if (bias == me && me->inside.load(std::memory_order_relaxed) == nullptr) {
        // Release: a revoker of the lock this thread left last that reads this store instead of
        // that exit's is still ordered after the exit.
        me->inside.store(this, std::memory_order_release);
        // Ordered against the revoker's store to revoking_ by its asymmetric barrier.
        std::atomic_signal_fence(std::memory_order_seq_cst);
        if (!revoking_.load(std::memory_order_acquire) &&
            bias_.load(std::memory_order_relaxed) == me) {
          held_ = Held::through_bias;
          return;
        }
        me->inside.store(nullptr, std::memory_order_release);
      }
    }
    lock_slow();
  }

  void unlock() noexcept {
    if (held_ == Held::through_bias) {
      held_ = Held::inner;
      Owner* const owner = bias_.load(std::memory_order_relaxed);
      STREAMPOOL_ASSERT(owner == biased_lock::this_thread && owner->inside.load() == this);
      owner->inside.store(nullptr, std::memory_order_release);
      return;
    }
    if (held_ == Held::lent) give_back();
    inner_.unlock();
  }

  // Marks locks that one thread is about to take in turn, then covers them all with one barrier
  // (see above); the marks it leaves unused are undone when it goes. Marking and undoing take each
  // lock's inner lock for a moment: this thread may hold none of the locks then.
  class Sweep {
   public:
    Sweep() noexcept;
    ~Sweep();
    Sweep(const Sweep&) = delete;
    Sweep& operator=(const Sweep&) = delete;
    // A lock biased to another thread is marked; any other is left as it is (and so is one
    // that finds no room in the list: taking it revokes).
    void mark(BiasedLock& lock) noexcept;
    // One barrier, when a lock was marked: from here on this thread borrows the marked locks.
    void cover() noexcept;

   private:
    std::uint64_t ticket_;
    std::vector<BiasedLock*> marked_;
  };

  // For tests: the first threshold of every lock (as constructed), and whether locks can be
  // biased in this process at all.
  static constexpr std::uint32_t first_threshold = 64;
  static bool biasing_available() noexcept;
  // For tests: whether the lock is biased now (a hint: it can change at any moment).
  bool biased() const noexcept { return bias_.load(std::memory_order_relaxed) != nullptr; }
  // For tests, by the thread inside: whether it entered through the bias.
  bool held_through_bias() const noexcept { return held_ == Held::through_bias; }
  // For tests: how many barriers (membarrier calls) the process has run to take locks from their
  // owners.
  static std::uint64_t barriers() noexcept;

 private:
  enum class Held : std::uint8_t { inner, through_bias, lent };

  static Owner* this_thread_owner() noexcept;
  void lock_slow() noexcept;
  void give_back() noexcept;  // the end of a borrow: the bias is the owner's again

  std::atomic<Owner*> bias_{nullptr};
  std::atomic<bool> revoking_{true};
  Held held_ = Held::inner;  // [inside]
  SpinLock inner_;
  std::uint64_t marked_ = 0;  // the ticket of the sweep that marked the lock, or 0 [inner_]
  // The thread that last took inner_, how many times in a row, and after how many the lock is
  // biased to it. [inner_]
  const Owner* last_ = nullptr;
  std::uint32_t streak_ = 0;
  std::uint32_t threshold_ = first_threshold;
};

}  // namespace streampool::detail
