// StreamRegistry: which StreamState a stream handle names, for one pool.
//
// Streams are told apart by id (cudaStreamGetId): CUDA hands a destroyed stream's handle to the
// next stream it creates, and cudaStreamPerThread is one handle naming a different stream in each
// thread. How much to ask CUDA is StreamChecks' choice, made once at construction (one strategy
// function, not a branch per lookup):
//   none      a thread's cache keyed by handle; the id is asked only on a miss;
//   identity  the id on every lookup, the cache keyed by id;
//   full      the gate's status (gate.hpp), then the id.
// Whatever the strategy, while the gate is engaged anywhere the gate's status is asked before the
// id, which CUDA refuses for a stream behind the gate (gate.hpp says why).
//
// Each thread caches its last few streams per pool, valid while the state's generation is
// unchanged; states live as long as the pool, so a stale entry is always safe to check.
#pragma once

#include "gate.hpp"
#include "stream_state.hpp"

#include <streampool/pool_options.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace streampool::detail {

class PoolCore;

// A thread's last few streams, per pool. An entry is valid while its state's generation is
// unchanged: retiring or recycling a state bumps it, and states live as long as their pool, so a
// stale entry of a live pool is always safe to check. Entries of dead pools never match again
// (uids are never reused).
struct CachedStream {
  std::uint64_t pool = 0;
  std::uint64_t key = 0;
  StreamState* state = nullptr;
  std::uint32_t generation = 0;
};
constexpr unsigned cache_ways = 8;
extern constinit thread_local CachedStream stream_cache[cache_ways];

class StreamRegistry {
 public:
  // What a lookup found: a state and the generation it was seen at, or (state null, no error) a
  // stream that is capturing, whose status find() wrote to its `gate`. Sixteen bytes: returned in
  // registers, as the fast path needs.
  struct Found {
    StreamState* state = nullptr;
    std::uint32_t generation = 0;
  };

  StreamRegistry(PoolCore& pool, StreamChecks checks, std::size_t classes);
  ~StreamRegistry();
  StreamRegistry(const StreamRegistry&) = delete;
  StreamRegistry& operator=(const StreamRegistry&) = delete;

  // The state of `stream`, registering it when new. Never asks a capturing stream's id.
  Found find(cudaStream_t stream, GateStatus& gate, Failure& error) noexcept {
    return (this->*strategy_)(stream, gate, error);
  }
  // find() as the strategy `checks` does it, inline: for the allocation fast path, which picks
  // its instance once (PoolCore::allocate_as). The pool's checks_ must be `checks`.
  template <StreamChecks checks>
  Found find_as(cudaStream_t stream, GateStatus& gate, Failure& error) noexcept;
  // This thread's cached state for `key` (a handle under StreamChecks::none, an id otherwise),
  // with no call at all; {} on a miss.
  Found cached(std::uint64_t key) const noexcept {
    for (const CachedStream& entry : stream_cache) {
      if (entry.pool == uid_ && entry.key == key &&
          entry.state->generation.load(std::memory_order_acquire) == entry.generation) {
        return {entry.state, entry.generation};
      }
    }
    return {};
  }
  // The state of the stream whose id CUDA gave (not capturing: the caller asked as ask_id
  // does), registering it when new; {} only on host out of memory (`error`). For identity and
  // full.
  Found find_by_id(cudaStream_t stream, StreamId id, Failure& error) noexcept {
    if (const Found found = cached(id); found.state != nullptr) return found;
    return lookup(stream, id, id, error);
  }
  // ask_id's two verdicts, for a caller that asks as it does: may the id be asked, given the
  // stream's gate status (false, `error` set, where the status could not be asked; false, no
  // error, where the gate's work holds the stream)? Did CUDA give the id (false, `error` set)?
  static bool id_allowed(const GateStatus& gate, Failure& error) noexcept;
  static bool id_answered(cudaError_t status, Failure& error) noexcept;
  // find_as<none> where it needs no call: {} when it would need one (the gate engaged, a miss).
  Found cached_handle(cudaStream_t stream) const noexcept {
    if (gate_engaged()) return {};
    return cached(reinterpret_cast<std::uintptr_t>(stream));
  }
  // For an explicit stream whose id cannot be asked now (one the gate's work holds: gate.hpp):
  // the state registered for its handle, or where there is none (never seen, released, or
  // retired as idle) a new one registered by the handle alone, under an id no stream has. The
  // stream's first lookup by id afterwards registers it afresh and retires this one (a known
  // handle with a new id, register_stream). Null for a stream that is not explicit (error left
  // clear), and on host out of memory (out_of_memory).
  StreamState* handle_state(cudaStream_t stream, Failure& error) noexcept;

  // release_stream: the state registered for `id`, unregistered and retired; null if none.
  // `unwaited` as PoolCore::empty_retired's (set only where the last fence is virtual).
  StreamState* release(cudaStream_t stream, StreamId id, std::size_t* unwaited) noexcept;

  // Every state ever made, newest first, without a lock: states are never freed while the pool
  // lives, and `next_state` links are written before a state is published.
  StreamState* first() const noexcept { return first_.load(std::memory_order_acquire); }

  // Before a walk that locks every state in turn (through sweep.lock()), with no state's lock
  // held: marks every lock biased to another thread and runs one barrier for them all, so that
  // the walk borrows each from its owner instead of revoking it (biased_lock.hpp,
  // BiasedLock::Sweep).
  void mark_every(BiasedLock::Sweep& sweep) const noexcept {
    for (StreamState* s = first(); s != nullptr; s = s->next_state) sweep.mark(s->lock);
    sweep.cover();
  }

  // The pool has seen more than one stream, or a stream retire.
  bool several_streams() const noexcept { return several_.load(std::memory_order_relaxed); }

  // Retires the registered streams that neither allocated nor dropped anything since the last
  // call, hold no live buffer and are not gated: such a stream may have been destroyed without
  // its handle ever going to another stream (CUDA hands it out again only once the destroyed
  // stream's work is done), and its state would otherwise hold its cache, its unfenced blocks and
  // its stats slack forever. A live stream retired this way is registered afresh when used again.
  void retire_idle() noexcept;

  // Retired states not yet recycled.
  std::size_t retired_waiting() const noexcept { return waiting_.load(std::memory_order_relaxed); }

  // The gate's busy spells (PoolCore::gate_busy_begins) begin (+1) or end (-1): while any is
  // under way every state, those made or recycled meanwhile too, has the `joinable` bit.
  void gate_busy(int delta) noexcept;

 private:
  using Strategy = Found (StreamRegistry::*)(cudaStream_t, GateStatus&, Failure&) noexcept;
  static Strategy strategy_of(StreamChecks checks) noexcept;
  // The gate's status of `stream`: false when it is capturing (`gate` says so) or on error.
  bool ask_gate(cudaStream_t stream, GateStatus& gate, Failure& error) noexcept;
  // The id of a stream not capturing; `gate` says when it is.
  bool ask_id(cudaStream_t stream, GateStatus& gate, StreamId& id, Failure& error) noexcept;
  Found lookup(cudaStream_t stream, std::uint64_t key, StreamId id, Failure& error) noexcept;
  StreamState* register_stream(cudaStream_t stream, StreamId id);  // [mutex_]
  StreamState* fresh_state();                                      // [mutex_]
  void retire(StreamState& s) noexcept;                            // [mutex_]
  void note_several() noexcept;                                    // [mutex_]
  void wait_for_recycling(StreamState& s) noexcept;                // [mutex_]

  PoolCore& pool_;
  const StreamChecks checks_;
  const Strategy strategy_;
  const std::uint64_t uid_;  // unique over the program's life: keys the threads' caches
  const std::size_t classes_;
  std::atomic<StreamState*> first_{nullptr};
  std::atomic<bool> several_{false};

  std::mutex mutex_;  // lock order: before any stream's lock
  std::unordered_map<StreamId, StreamState*> by_id_;
  std::unordered_map<cudaStream_t, StreamState*> by_handle_;  // explicit streams only
  std::deque<StreamState*> retired_;                          // oldest first
  std::atomic<std::size_t> waiting_{0};                       // retired_.size()
  std::size_t registered_ = 0;
  int gate_busy_ = 0;  // spells under way: states get `joinable` while it is not 0
  std::uint64_t created_ = 0;  // stream states made: the last one's Timeline::order
  // handle_state's ids: above every id CUDA gives (a counter from 1), so none is a stream's.
  static constexpr StreamId handle_only_ids = StreamId{1} << 63;
  StreamId handle_only_ = handle_only_ids;
};

template <StreamChecks checks>
inline StreamRegistry::Found StreamRegistry::find_as(cudaStream_t stream, GateStatus& gate,
                                                     Failure& error) noexcept {
  STREAMPOOL_ASSERT(checks == checks_);
  std::uint64_t key = 0;
  StreamId id = 0;
  if constexpr (checks == StreamChecks::none) {
    key = reinterpret_cast<std::uintptr_t>(stream);
    // A stream the gate's layer joined to itself has a cached state with no gated bit: while the
    // gate is engaged anywhere, ask the status first, as the other strategies do.
    if (gate_engaged() && !ask_gate(stream, gate, error)) return {};
  } else {
    if (!ask_id(stream, gate, id, error)) return {};
    return find_by_id(stream, id, error);
  }
  if (const Found found = cached(key); found.state != nullptr) return found;
  if (!ask_id(stream, gate, id, error)) return {};
  return lookup(stream, key, id, error);
}

}  // namespace streampool::detail
