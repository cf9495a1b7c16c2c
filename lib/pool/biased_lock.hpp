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
// over a doubled run. A Sweep instead marks the locks first (under each inner lock: one more
// pending mark, `revoking_` set by the first), runs one barrier for all of them (none when a
// barrier that began after its last mark has already completed, another sweep's), and then
// takes each marked lock through Sweep::lock(), which borrows it: it waits for the owner to
// leave, as a revoker does, but keeps the bias; its unlock() takes the mark back, and the last
// pending mark to go clears `revoking_`, which gives the lock back whole. While a lock is marked
// its owner enters through the inner lock; the marks a sweep leaves unused are taken back when it
// goes; a plain lock() by any other thread revokes as before, and voids the pending marks (the
// bias is cleared, and the next one has another generation).
//
// Invariants (checked in debug builds where they can be):
//   - at most one thread is inside: the bias owner through `inside`, or the holder of `inner_`;
//   - `bias_` changes only under `inner_`, with no owner inside this lock;
//   - `revoking_` is false only while `bias_` names an owner whose entry is allowed;
//   - `marks_` is not zero only while `bias_` is set, and then `revoking_` has been true since the
//     mark that made it one, whose place in the barriers' sequence is `marked_at_`: a barrier
//     that began later and has completed lets a sweep that holds a mark of this generation borrow;
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

  // The fast paths' entry (allocate_as, drop): the bias owner's entry above and nothing else,
  // with no call, so that a path which takes the lock this way and leaves by leave_biased() calls
  // nothing it returns from (the callers' rare cases jump to a function that takes the lock
  // again). False where that entry is not open now: the caller takes lock() instead.
  bool try_enter_biased() noexcept {
    Owner* const me = biased_lock::this_thread;
    if (me == nullptr || bias_.load(std::memory_order_relaxed) != me ||
        me->inside.load(std::memory_order_relaxed) != nullptr) {
      return false;
    }
    me->inside.store(this, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // as in lock()
    if (!revoking_.load(std::memory_order_acquire) &&
        bias_.load(std::memory_order_relaxed) == me) {
      held_ = Held::through_bias;
      return true;
    }
    me->inside.store(nullptr, std::memory_order_release);
    return false;
  }
  // unlock() for a thread that entered through its bias (the caller knows it did).
  void leave_biased() noexcept {
    STREAMPOOL_ASSERT(held_ == Held::through_bias);
    held_ = Held::inner;
    Owner* const me = biased_lock::this_thread;
    STREAMPOOL_ASSERT(bias_.load(std::memory_order_relaxed) == me && me->inside.load() == this);
    me->inside.store(nullptr, std::memory_order_release);
  }
  // leave_biased() where the caller entered through the bias, else unlock(): for the paths that
  // serve both entries (a template on how the lock was taken).
  template <bool biased>
  [[gnu::always_inline]] void leave() noexcept {
    if constexpr (biased) {
      leave_biased();
    } else {
      unlock();
    }
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

  // Marks locks that one thread is about to take in turn, covers them all with one barrier, and
  // takes each (see above); the marks it leaves unused are taken back when it goes. Marking and
  // taking back take each lock's inner lock for a moment: this thread may hold none of the locks
  // then.
  class Sweep {
   public:
    Sweep() noexcept = default;
    ~Sweep();
    Sweep(const Sweep&) = delete;
    Sweep& operator=(const Sweep&) = delete;
    // A lock biased to another thread gets a pending mark; any other is noted as it is, and so
    // is one marked after cover() (taking it revokes, as any other thread's lock() does).
    void mark(BiasedLock& lock) noexcept;
    // One barrier, unless none is needed.
    void cover() noexcept;
    // Takes `lock`, borrowing it when this sweep's mark on it still holds; released by its
    // unlock(). Locks are best taken in the order they were marked (each is found from where
    // the last one was).
    void lock(BiasedLock& lock) noexcept;

   private:
    struct Entry {
      BiasedLock* lock;
      std::uint32_t generation;  // of the bias marked, when `marked`
      bool marked;
    };
    std::vector<Entry> entries_;
    std::size_t next_ = 0;        // where lock() looks first
    std::uint64_t last_mark_ = 0;  // the latest marked_at_ of a lock this sweep marked
    bool any_marked_ = false;
    bool covered_ = false;
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
  // owners, and how many locks sweeps have borrowed.
  static std::uint64_t barriers() noexcept;
  static std::uint64_t borrows() noexcept;

 private:
  enum class Held : std::uint8_t { inner, through_bias, lent };

  static Owner* this_thread_owner() noexcept;
  void lock_slow() noexcept;
  void give_back() noexcept;  // the end of a borrow: the mark taken back
  void take_back_mark() noexcept;  // [inner_]

  std::atomic<Owner*> bias_{nullptr};
  std::atomic<bool> revoking_{true};
  Held held_ = Held::inner;  // [inside]
  SpinLock inner_;
  // Sweeps' pending marks on this bias, where the barriers' sequence stood when the first was
  // made, and the bias's generation (one more at each bias). [inner_]
  std::uint32_t marks_ = 0;
  std::uint32_t generation_ = 0;
  std::uint64_t marked_at_ = 0;
  // The thread that last took inner_, how many times in a row, and after how many the lock is
  // biased to it. [inner_]
  const Owner* last_ = nullptr;
  std::uint32_t streak_ = 0;
  std::uint32_t threshold_ = first_threshold;
};

}  // namespace streampool::detail
