#include "capture_guard.hpp"

#include "../pool/gate.hpp"
#include "../pool/never_destroyed.hpp"
#include "../pool/stream_state.hpp"  // this_thread_token

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <optional>
#include <pthread.h>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace streampool::detail {

std::atomic<int> gate_engagements{0};

namespace {

std::atomic<int> global_captures{0};
std::atomic<int> thread_local_captures{0};

// Thread-local-mode captures per thread that began them. Kept here rather than in thread_local
// storage because the capture may be ended (or abandoned) from another thread.
struct PerThread {
  std::mutex mutex;
  std::unordered_map<std::thread::id, int> count;
};
// Made at the first call, which may come from a function that may not throw (allowed_now,
// settle_left_captures): never_destroyed.hpp.
PerThread& per_thread() noexcept { return never_destroyed<PerThread>(); }

// Captures left under way (capture_guard.hpp), and the threads that began captures and have not
// exited (by this_thread_token(), which no later thread gets).
struct Left {
  CaptureMode mode;
  std::thread::id thread;
  std::uint64_t token;
  std::shared_ptr<Device> device;  // asked for the capture status of its stream
  cudaStream_t stream;             // cudaStreamPerThread: the thread's (`token`) own
  CaptureId id;                    // of an explicit stream's capture (0: any)
  // Which entry this is: two may otherwise agree in everything (found in review, 2026-12-07: a
  // settle that found one ended took out a later one of the same stream, still capturing).
  std::uint64_t serial;
  // Only the thread itself can ask about its per-thread stream; any thread about an explicit one
  // (which the caller does not destroy before it is seen over: capture_pool.hpp).
  bool askable_here(std::uint64_t here) const noexcept {
    return stream != cudaStreamPerThread || token == here;
  }
};
struct LeftCaptures {
  std::mutex mutex;
  // Each entry is a capture noted begun and not yet noted ended, so left.size() <= begun; and
  // left.capacity() >= begun, room taken as each begins (note_capture_begin, which may throw):
  // a note (note_capture_left, which may not) never needs host memory. Found 2026-12-07: a note
  // that found none counted its capture over while CUDA still captured it.
  std::vector<Left> left;
  std::size_t begun = 0;
  // Captures of cudaStreamPerThread noted begun and held (not yet noted ended or left), by note
  // serial: their thread's exit counts them over and takes them out (CUDA ends them with the
  // thread), so that the holder's later note only forgets it. Room taken as each begins, as for
  // `left`.
  struct Held {
    std::uint64_t note;
    std::uint64_t token;
    CaptureMode mode;
    std::thread::id thread;
  };
  std::vector<Held> held;
  std::uint64_t notes = 0;  // the last Held::note given
  std::unordered_set<std::uint64_t> watched;
  std::atomic<int> count{0};  // left.size(), read without the mutex
  std::uint64_t serials = 0;  // the last Left::serial given
  // Held shared by each settle while it asks CUDA about a note's stream, taken before the mutex
  // above goes (so while the note is still listed): settled_here waits for it exclusively, so
  // that no thread is still about to ask about a stream the caller may destroy next (found in
  // review, 2026-12-07).
  std::shared_mutex asking;
};
LeftCaptures& left_captures() noexcept { return never_destroyed<LeftCaptures>(); }

// Takes out the left captures `mine` selects for which `over` holds; their notes end after.
// One at a time, in the order of their serials, each copied out of the list (no host memory:
// a thread's exit may find none, and its per-thread captures stayed counted for the life of the
// process, found 2026-12-07); `over` is asked with no mutex held, `asking` held shared.
template <class Mine, class Over>
void settle(Mine&& is_mine, Over&& over) noexcept {
  LeftCaptures& l = left_captures();
  std::uint64_t after = 0;  // the serial last looked at
  for (;;) {
    std::optional<Left> next;
    std::shared_lock<std::shared_mutex> asking;
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      // In the order of their serials (appended so, erased in place): past the last looked at.
      const auto from = std::partition_point(l.left.begin(), l.left.end(),
                                             [&](const Left& x) { return x.serial <= after; });
      const auto it = std::find_if(from, l.left.end(), is_mine);
      if (it != l.left.end()) {
        next = *it;
        asking = std::shared_lock<std::shared_mutex>(l.asking);
      }
    }
    if (!next) return;
    after = next->serial;
    const bool is_over = over(*next);
    asking.unlock();
    if (!is_over) continue;
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      // Another call may have settled it meanwhile (the thread itself or its exit, or for an
      // explicit stream any thread).
      const auto it = std::find_if(l.left.begin(), l.left.end(),
                                   [&](const Left& x) { return x.serial == next->serial; });
      if (it != l.left.end()) {
        l.left.erase(it);
        l.count.fetch_sub(1, std::memory_order_relaxed);
        found = true;
      }
    }
    if (found) note_capture_end(next->mode, next->thread);
  }
}

void uncount(CaptureMode mode, std::thread::id thread) noexcept;

// At the exit of a thread that began a capture of its per-thread stream: CUDA ends the stream's
// captures with the thread, and what was left to it can no longer be ended by it. Not in a C++
// thread_local destructor: CUDA's own cleanup of the thread may come after those (in glibc a
// thread's C++ thread_local destructors run before its thread-specific data's destructors; the
// H100 still captured in them, and the fake, as it, ends the capture in the first round), and
// a capture counted over before it ended still refused another thread's call in between (found
// in review, 2026-12-07). So a thread-specific value's destructor, put off once to the second
// round of those destructors, after every other key's first (probes.cpp asks CUDA when).
char armed = 0;  // the key's value once set
// Put off already in this thread's exit: a capture begun by another key's destructor after this
// one ran sets the key again, and a second putting-off could run past the last round.
constinit thread_local bool exit_put_off = false;
void on_thread_exit(void* value) noexcept;
struct ExitKey {
  pthread_key_t key{};
  bool made = false;
  ExitKey() noexcept { made = pthread_key_create(&key, on_thread_exit) == 0; }
};
ExitKey& exit_key() noexcept { return never_destroyed<ExitKey>(); }

void on_thread_exit(void*) noexcept {
  if (!exit_put_off && pthread_setspecific(exit_key().key, &armed) == 0) {
    exit_put_off = true;  // to the next round
    return;
  }
  const std::uint64_t token = this_thread_token();
  LeftCaptures& l = left_captures();
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    l.watched.erase(token);
  }
  // Held ones: counted over here, one at a time (no host memory); the holder's later note only
  // forgets them.
  for (;;) {
    std::optional<LeftCaptures::Held> mine;
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      const auto it = std::find_if(l.held.begin(), l.held.end(),
                                   [&](const LeftCaptures::Held& h) { return h.token == token; });
      if (it == l.held.end()) break;
      mine = *it;
      l.held.erase(it);
    }
    uncount(mine->mode, mine->thread);
  }
  // Left ones: its per-thread stream's captures are over. An explicit stream's capture goes on
  // without it.
  settle(
      [token](const Left& left) {
        return left.stream == cudaStreamPerThread && left.token == token;
      },
      [](const Left&) { return true; });
}

// The permits held (gate.hpp, CallPermit), counted in slots of their threads (by token, so that
// threads rarely share a line): a begin waits for each slot to be empty at some moment after it
// counted itself. A permit taken after that sees the count (both sides sequentially consistent:
// a permit's increment then its reading of the counts, a begin's counting then its reading of
// the slots), and is refused at once unless its call is one the capture allows. Two counts a
// slot: the calls every capture refuses (a free, a device synchronize, the legacy stream's
// calls), for which every begin waits, and the rest, which only a global capture refuses on
// other threads (Restricted), for which only a global begin waits: a relaxed begin waiting for
// another thread's cudaMalloc, which it allows, would only be delayed, and a thread-local
// capture refuses them on its own thread alone, whose calls end before it begins (found in
// review, 2026-12-08: a thread-local one noted for another thread waited for every thread's,
// and threads that kept making them could hold it off without end).
struct alignas(64) PermitSlot {
  std::atomic<int> strict{0};
  std::atomic<int> moded{0};
};
constexpr std::size_t permit_slots = 64;
PermitSlot permits[permit_slots];
// A call every capture refuses (each begin waits for it).
bool strict(Restricted call) noexcept {
  return call == Restricted::free || call == Restricted::device_sync ||
         call == Restricted::legacy_stream;
}
std::atomic<int>& permit_slot(Restricted call) noexcept {
  PermitSlot& slot = permits[this_thread_token() % permit_slots];
  return strict(call) ? slot.strict : slot.moded;
}
// Permits held by this thread: a begin on a thread that holds one would wait for itself.
thread_local int permits_here = 0;

// A permit is held for one call (or a few, in a loop): the wait yields at first, then sleeps,
// longer each time up to a millisecond, rather than keep a core that a holder the scheduler took
// off its own may need. (Waits of hundreds of milliseconds in the stress test of
// capture_calls.cpp came from a permit held across a loop, since fixed, not from this wait.)
void wait_for_permits(bool moded_too) noexcept {
  STREAMPOOL_ASSERT(permits_here == 0);
  for (PermitSlot& slot : permits) {
    int yields = 0;
    auto nap = std::chrono::microseconds(10);
    while (slot.strict.load(std::memory_order_seq_cst) != 0 ||
           (moded_too && slot.moded.load(std::memory_order_seq_cst) != 0)) {
      if (yields < 64) {
        ++yields;
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
    }
  }
}

}  // namespace

namespace {
// The counts of a capture noted begun (note_capture_begin's), taken back.
void uncount(CaptureMode mode, std::thread::id thread) noexcept {
  gate_engagements.fetch_sub(1, std::memory_order_acq_rel);
  if (mode == CaptureMode::global) {
    global_captures.fetch_sub(1);
  } else if (mode == CaptureMode::thread_local_) {
    std::lock_guard<std::mutex> lock(per_thread().mutex);
    auto found = per_thread().count.find(thread);
    if (found != per_thread().count.end() && --found->second == 0) per_thread().count.erase(found);
    thread_local_captures.fetch_sub(1);
  }
}

// Takes a held note out [l.mutex]; false where its thread's exit took it (and counted it over).
bool take_held(LeftCaptures& l, std::uint64_t note) noexcept {
  if (note == 0) return true;  // not held: not of a per-thread stream
  const auto it = std::find_if(l.held.begin(), l.held.end(),
                               [&](const LeftCaptures::Held& h) { return h.note == note; });
  if (it == l.held.end()) return false;
  l.held.erase(it);
  return true;
}
}  // namespace

std::uint64_t note_capture_begin(CaptureMode mode, std::thread::id thread,
                                 std::uint64_t per_thread_token) {
  // A begin on a thread that holds a permit (from a Device's method: device.hpp forbids it) would
  // wait for itself without end.
  if (permits_here != 0) {
    throw Error(Errc::capture_forbids_call,
                "a capture cannot begin inside a device call of the pool's (a Device method): it "
                "would wait for that call");
  }
  LeftCaptures& l = left_captures();
  std::uint64_t note = 0;
  {
    // The room of its note, should it be left under way (LeftCaptures::left), or held.
    std::lock_guard<std::mutex> lock(l.mutex);
    l.left.reserve(l.begun + 1);
    l.held.reserve(l.begun + 1);
    ++l.begun;
    if (per_thread_token != 0) {
      note = ++l.notes;
      l.held.push_back({note, per_thread_token, mode, thread});
    }
  }
  if (mode == CaptureMode::thread_local_) {
    try {
      std::lock_guard<std::mutex> lock(per_thread().mutex);
      ++per_thread().count[thread];
      thread_local_captures.fetch_add(1);
    } catch (...) {
      std::lock_guard<std::mutex> lock(l.mutex);
      --l.begun;
      take_held(l, note);
      throw;
    }
  } else if (mode == CaptureMode::global) {
    global_captures.fetch_add(1);
  }
  gate_engagements.fetch_add(1, std::memory_order_seq_cst);
  // Counted: every later check sees it. Calls already past their checks complete first (CUDA
  // has not begun the capture yet: the caller begins it after this).
  wait_for_permits(mode == CaptureMode::global);
  return note;
}

void note_capture_end(CaptureMode mode, std::thread::id thread, std::uint64_t note) noexcept {
  bool counted = true;
  {
    LeftCaptures& l = left_captures();
    std::lock_guard<std::mutex> lock(l.mutex);
    STREAMPOOL_ASSERT(l.begun > l.left.size());  // this capture's is not among the notes
    --l.begun;
    counted = take_held(l, note);
  }
  if (counted) uncount(mode, thread);
}

void watch_capturing_thread() {
  ExitKey& exit = exit_key();
  // The system's keys or host memory ran out: as out of host memory (capture_guard.hpp).
  if (!exit.made) throw std::bad_alloc();
  if (pthread_getspecific(exit.key) != nullptr) return;
  LeftCaptures& l = left_captures();
  std::lock_guard<std::mutex> lock(l.mutex);
  const std::uint64_t token = this_thread_token();
  l.watched.insert(token);
  if (pthread_setspecific(exit.key, &armed) != 0) {
    l.watched.erase(token);
    throw std::bad_alloc();
  }
}

void note_capture_left(CaptureMode mode, std::thread::id thread, std::uint64_t token,
                       std::shared_ptr<Device> device, cudaStream_t stream, CaptureId id,
                       std::uint64_t note) noexcept {
  {
    LeftCaptures& l = left_captures();
    std::lock_guard<std::mutex> lock(l.mutex);
    if (!take_held(l, note)) {
      // Its thread has exited, and counted it over then: only its note goes.
      STREAMPOOL_ASSERT(l.begun > l.left.size());
      --l.begun;
      return;
    }
    if (stream != cudaStreamPerThread || l.watched.count(token) != 0) {
      // Its room was taken as it began: no host memory is needed.
      STREAMPOOL_ASSERT(l.left.size() < l.begun && l.begun <= l.left.capacity());
      l.left.push_back({mode, thread, token, std::move(device), stream, id, ++l.serials});
      l.count.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  note_capture_end(mode, thread);  // its thread has exited: nothing can end it now
}

GateStatus capture_now(Device& device, cudaStream_t stream) noexcept {
  GateStatus now;
  now.error = device.capture_info(stream, &now.status, &now.id);
  if (now.error == cudaErrorStreamCaptureImplicit) {
    // The legacy stream, asked while a blocking stream captures: it never captures itself (CUDA
    // refuses to begin a capture there). Read as a failure, a capture prepared on it and given
    // up then stayed counted for as long as the other capture lasted (found in review,
    // 2026-12-07).
    now.error = cudaSuccess;
    now.status = CaptureStatus::none;
  }
  if (now.error != cudaSuccess || now.status != CaptureStatus::active) now.id = 0;
  return now;
}

void settle_left_captures() noexcept {
  if (left_captures().count.load(std::memory_order_relaxed) == 0) return;
  const std::uint64_t here = this_thread_token();
  settle([here](const Left& left) { return left.askable_here(here); },
         [](const Left& left) {
           const GateStatus now = capture_now(*left.device, left.stream);
           // This thread's per-thread stream: over only when CUDA says nothing captures there.
           if (left.stream == cudaStreamPerThread) return now.ordinary();
           // An explicit stream's: over where no capture of the stream may be it and still
           // refuse calls (none, or another active one), or the context is gone. An invalidated
           // capture not yet ended still refuses (seen on an H100, 2026-12-07), and where CUDA
           // cannot tell, it stays counted: taken as ended, the capture of a ~CapturePool whose
           // every end and status query failed was counted over at the next settle (found
           // 2026-12-07), and another thread's trim synchronized the device.
           return now.error == cudaErrorContextIsDestroyed || !now.restricting(left.id);
         });
}

bool settled_here(cudaStream_t stream) noexcept {
  settle_left_captures();
  // A per-thread or the legacy stream is never destroyed (and names another stream on each
  // device): nothing to wait for, nor to refuse (review, 2026-12-07).
  if (stream == cudaStreamPerThread || is_legacy_stream(stream)) return true;
  LeftCaptures& l = left_captures();
  { const std::unique_lock<std::shared_mutex> wait(l.asking); }  // no settle still asking
  std::lock_guard<std::mutex> lock(l.mutex);
  return std::none_of(l.left.begin(), l.left.end(),
                      [&](const Left& left) { return left.stream == stream; });
}

namespace {
// Sequentially consistent readings: a permit's (take_permit) against a begin's (above).
bool allowed_now(Restricted call) noexcept {
  if (strict(call)) {
    return gate_engagements.load(std::memory_order_seq_cst) == 0;
  }
  if (global_captures.load(std::memory_order_seq_cst) != 0) return false;
  if (thread_local_captures.load(std::memory_order_seq_cst) == 0) return true;
  std::lock_guard<std::mutex> lock(per_thread().mutex);
  return per_thread().count.find(std::this_thread::get_id()) == per_thread().count.end();
}
}  // namespace

bool calls_allowed(Restricted call) noexcept {
  if (call == Restricted::vm_map) return true;  // in every mode (gate.hpp)
  if (allowed_now(call)) return true;
  // A capture left to this thread that it has ended since: seen here, at its first refused call,
  // rather than only at its next safe point (until then, in global mode, no thread's cudaMalloc).
  if (left_captures().count.load(std::memory_order_relaxed) == 0) return false;
  settle_left_captures();
  return allowed_now(call);
}

std::atomic<int>* take_permit(Restricted call) noexcept {
  std::atomic<int>& slot = permit_slot(call);
  // Taken before the reading (see PermitSlot), and given back where refused; the settle (which
  // asks CUDA about streams) is made without this one (a permit this thread took before may be
  // held: no settle waits for a permit). Refused at once, slot untouched, where a capture is
  // counted already: threads that keep asking during a capture would each keep their slots
  // busy a moment, and a begin that waits for one of them preempted in that moment waited for
  // the scheduler (seen in the stress test of capture_calls.cpp, begins of up to 100 ms).
  for (bool settled = false;; settled = true) {
    if (call != Restricted::vm_map && !allowed_now(call)) {
      if (settled || left_captures().count.load(std::memory_order_relaxed) == 0) return nullptr;
      settle_left_captures();
      settled = true;
      if (!allowed_now(call)) return nullptr;
    }
    slot.fetch_add(1, std::memory_order_seq_cst);
    if (call == Restricted::vm_map || allowed_now(call)) {
      ++permits_here;
      return &slot;
    }
    slot.fetch_sub(1, std::memory_order_seq_cst);
    if (settled || left_captures().count.load(std::memory_order_relaxed) == 0) return nullptr;
    settle_left_captures();
  }
}

void return_permit(std::atomic<int>* slot) noexcept {
  --permits_here;
  slot->fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace streampool::detail
