// BiasedLock's slow path, the threads' records and the asymmetric barrier (biased_lock.hpp).
#include "biased_lock.hpp"

#include "checks.hpp"
#include "contention.hpp"
#include "never_destroyed.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace streampool::detail {

namespace biased_lock {
constinit thread_local Owner* this_thread = nullptr;
}  // namespace biased_lock

namespace {

using biased_lock::this_thread;

// Past this many acquisitions in a row, a lock that was revoked is biased again: a stream whose
// threads take turns pays at most one barrier per this many acquisitions.
constexpr std::uint32_t last_threshold = 1u << 20;

// The barriers run, in the order they began (the next one's place), and one past the latest place
// of a barrier that has completed: a barrier whose place is at least a mark's `marked_at_` began
// after the mark's store to revoking_ (both sequentially consistent).
std::atomic<std::uint64_t> barriers_begun{0};
std::atomic<std::uint64_t> barriers_done{0};
std::atomic<std::uint64_t> borrow_count{0};

#if defined(__linux__)

long membarrier(int command) noexcept {
  return syscall(__NR_membarrier, command, 0U, 0);
}

// Registered once per process: the expedited private barrier must be registered before use.
bool register_barrier() noexcept {
  const long commands = membarrier(MEMBARRIER_CMD_QUERY);
  if (commands < 0 || (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

// Records of exited threads, for the next thread (never freed: a lock may still name one).
struct Owners {
  std::mutex mutex;
  BiasedLock::Owner* free = nullptr;
};

// Made at the first lock of the process, where nothing may throw: never_destroyed.hpp.
Owners& owners() noexcept { return never_destroyed<Owners>(); }

// At the thread's exit its record goes to the next new thread. A C++ thread-local's destructor
// rather than a pthread key's: the C++ runtime keeps the library loaded until it has run. A lock
// taken later in the exit (a thread-local destroyed after this one drops a buffer) gets a record
// that is not given back.
struct Reaper {
  ~Reaper();
};
constinit thread_local bool reaped = false;
thread_local Reaper reaper;

Reaper::~Reaper() {
  reaped = true;
  BiasedLock::Owner* const owner = this_thread;
  if (owner == nullptr) return;
  STREAMPOOL_ASSERT(owner->inside.load(std::memory_order_relaxed) == nullptr);
  this_thread = nullptr;
  Owners& o = owners();
  std::lock_guard<std::mutex> guard(o.mutex);
  owner->next_free = o.free;
  o.free = owner;
}

BiasedLock::Owner* new_owner() noexcept {
  Owners& o = owners();
  BiasedLock::Owner* owner = nullptr;
  {
    std::lock_guard<std::mutex> guard(o.mutex);
    if (o.free != nullptr) {
      owner = o.free;
      o.free = owner->next_free;
      owner->next_free = nullptr;
    }
  }
  if (owner == nullptr) {
    owner = new (std::nothrow) BiasedLock::Owner;
    if (owner == nullptr) return nullptr;
  }
  if (!reaped) (void)&reaper;  // constructs it: its destructor gives the record back
  this_thread = owner;
  return owner;
}

// A full barrier on every CPU that runs a thread of this process, as if each had run one where
// it stands: after it, an owner's store before its barrier point is seen here, and its loads
// after that point see what this thread stored before the call.
void heavy_barrier() noexcept {
  const std::uint64_t place = barriers_begun.fetch_add(1, std::memory_order_seq_cst);
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
    // Registered, it cannot fail (membarrier(2)); were it to, an owner could be inside unseen.
    std::abort();
  }
  std::uint64_t done = barriers_done.load(std::memory_order_relaxed);
  while (done < place + 1 &&
         !barriers_done.compare_exchange_weak(done, place + 1, std::memory_order_release,
                                              std::memory_order_relaxed)) {
  }
}

// After a barrier that followed the lock's `revoking_`: the owner, if inside, leaves and does not
// come back until `revoking_` is cleared.
void wait_for(const BiasedLock::Owner& owner, const BiasedLock* lock) noexcept {
  for (unsigned spins = 0; owner.inside.load(std::memory_order_acquire) == lock;) back_off(spins);
}

#endif

}  // namespace

bool BiasedLock::biasing_available() noexcept {
#if defined(__linux__)
  static const bool available = register_barrier();
  return available;
#else
  return false;
#endif
}

std::uint64_t BiasedLock::barriers() noexcept {
  return barriers_begun.load(std::memory_order_relaxed);
}

std::uint64_t BiasedLock::borrows() noexcept {
  return borrow_count.load(std::memory_order_relaxed);
}

BiasedLock::Owner* BiasedLock::this_thread_owner() noexcept {
#if defined(__linux__)
  if (Owner* const owner = this_thread; owner != nullptr) return owner;
  return new_owner();
#else
  return nullptr;
#endif
}

void BiasedLock::lock_slow() noexcept {
  if (!inner_.try_lock()) {
    const std::int64_t since = contention::clock_ns();
    inner_.lock();
    contention::waited(contention::stream, since);
  }
#if defined(__linux__)
  if (!biasing_available()) return;
  Owner* const me = this_thread_owner();
  Owner* const bias = bias_.load(std::memory_order_relaxed);
  if (bias == me && me != nullptr) {
    // The bias names this thread's record: the thread is inside another lock through its bias
    // (it enters one at a time that way), the record has just come to it from an exited thread,
    // or a sweep has marked the lock and not yet given it back (until then each entry of this
    // thread comes here). No thread is inside through the bias; this one holds the lock through
    // the inner lock, which every other thread needs to revoke or borrow.
    return;
  }
  if (bias != nullptr) {
    // Revoke: after the barrier the owner either is seen inside or sees revoking_ and backs out.
    // Sweeps' pending marks go with the bias (each finds it cleared, or biased again with another
    // generation).
    marks_ = 0;
    const std::int64_t since = contention::clock_ns();
    revoking_.store(true, std::memory_order_seq_cst);  // a full fence here, and then
    heavy_barrier();                                   // one on the owner's CPU
    wait_for(*bias, this);
    contention::waited(contention::revocation, since);
    bias_.store(nullptr, std::memory_order_relaxed);
    threshold_ = std::min(threshold_ * 2, last_threshold);
    last_ = me;
    streak_ = 1;
    return;
  }
  if (me == nullptr) return;  // no record (out of memory): never biased to this thread
  if (last_ != me) {
    last_ = me;
    streak_ = 1;
    return;
  }
  if (++streak_ >= threshold_) {
    // Biased from the next acquisition on; this one is released through the inner lock.
    STREAMPOOL_ASSERT(marks_ == 0);
    ++generation_;
    bias_.store(me, std::memory_order_relaxed);
    revoking_.store(false, std::memory_order_release);
  }
#endif
}

void BiasedLock::give_back() noexcept {
  held_ = Held::inner;
  take_back_mark();
}

void BiasedLock::take_back_mark() noexcept {
  STREAMPOOL_ASSERT(bias_.load(std::memory_order_relaxed) != nullptr && marks_ > 0 &&
                    revoking_.load(std::memory_order_relaxed));
  if (--marks_ == 0) {
    // Release: the owner's next entry through the bias (an acquire load of revoking_) comes
    // after everything done inside by the sweeps that borrowed the lock.
    revoking_.store(false, std::memory_order_release);
  }
}

BiasedLock::Sweep::~Sweep() {
  for (const Entry& e : entries_) {
    if (!e.marked) continue;
    BiasedLock& lock = *e.lock;
    lock.inner_.lock();
    if (lock.bias_.load(std::memory_order_relaxed) != nullptr && lock.generation_ == e.generation) {
      lock.take_back_mark();
    }
    lock.inner_.unlock();
  }
}

void BiasedLock::Sweep::mark(BiasedLock& lock) noexcept {
  try {
    entries_.push_back({&lock, 0, false});
  } catch (const std::bad_alloc&) {
    return;  // not noted: taken, it is locked as any other thread locks it
  }
#if defined(__linux__)
  // After the barrier a mark would be borrowed uncovered; on a lock biased later, the lock()
  // revokes.
  if (covered_ || lock.bias_.load(std::memory_order_relaxed) == nullptr) return;
  Entry& e = entries_.back();
  Owner* const me = this_thread_owner();
  lock.inner_.lock();
  if (Owner* const bias = lock.bias_.load(std::memory_order_relaxed);
      bias != nullptr && bias != me) {
    if (lock.marks_++ == 0) {
      lock.revoking_.store(true, std::memory_order_seq_cst);
      lock.marked_at_ = barriers_begun.load(std::memory_order_seq_cst);
    }
    e.marked = true;
    e.generation = lock.generation_;
    last_mark_ = std::max(last_mark_, lock.marked_at_);
    any_marked_ = true;
  }
  lock.inner_.unlock();
#endif
}

void BiasedLock::Sweep::cover() noexcept {
  covered_ = true;
#if defined(__linux__)
  // A barrier that began after every mark this sweep relies on and has completed (another
  // sweep's, or a revoker's) serves as well as one of its own.
  if (any_marked_ && barriers_done.load(std::memory_order_acquire) <= last_mark_) heavy_barrier();
#endif
}

void BiasedLock::Sweep::lock(BiasedLock& lock) noexcept {
  Entry* found = nullptr;
  for (std::size_t i = next_; i < entries_.size() && found == nullptr; ++i) {
    if (entries_[i].lock == &lock) {
      found = &entries_[i];
      next_ = i + 1;
    }
  }
  for (std::size_t i = 0; i < next_ && found == nullptr; ++i) {
    if (entries_[i].lock == &lock) found = &entries_[i];
  }
#if defined(__linux__)
  if (found != nullptr && found->marked && covered_) {
    found->marked = false;
    lock.inner_.lock();
    Owner* const bias = lock.bias_.load(std::memory_order_relaxed);
    if (bias != nullptr && lock.generation_ == found->generation) {
      // This sweep's mark holds: revoking_ has been set since a mark that the barrier followed.
      STREAMPOOL_ASSERT(lock.marks_ > 0 && lock.revoking_.load(std::memory_order_relaxed));
      wait_for(*bias, &lock);
      lock.held_ = Held::lent;
      borrow_count.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    lock.inner_.unlock();  // revoked since: the mark went with the bias
  }
#endif
  lock.lock();
}

}  // namespace streampool::detail
