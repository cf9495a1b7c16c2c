// Allocation: the fast path and the slow path.
//
// The fast path is what the data model is for: the stream's lookup (a thread-local cache, plus
// what StreamChecks asks CUDA), one uncontended lock (for the thread the lock is biased to, a
// store and two loads: biased_lock.hpp), a list pop and the counters. No other lock, no device
// call beyond the lookup's, no write to memory another thread writes on its own fast path; a
// large request the stream's shelf (shelf.cpp) fits is served the same way. It calls nothing it
// returns from but the lookup's questions to the device: everything else (a lock not biased to
// this thread, an empty list or shelf, a stream that needs attention, counters to publish) jumps
// to a function that does the whole of it (allocate_looking, allocate_locking, allocate_slow,
// allocated_rare).
#include "pool_core.hpp"

namespace streampool::detail {

inline StreamRegistry::Found PoolCore::found_by_id(cudaStream_t stream, Failure& error) noexcept {
  StreamId id = 0;
  if (!StreamRegistry::id_answered(device_->stream_id(stream, &id), error)) return {};
  return registry_.find_by_id(stream, id, error);
}

template <bool biased>
[[gnu::always_inline]] inline Block* PoolCore::allocated_here(StreamState& s, Block* b,
                                                               std::size_t bytes,
                                                               cudaStream_t stream) noexcept {
  reused_here(s, b->need, b->size);
  ++s.counters.hits;
  const bool publish_due = count_live(s, b, bytes);
  if (publish_due || notify_) [[unlikely]] return allocated_rare(s, b, stream, publish_due);
  s.lock.leave<biased>();
  return b;
}

template <bool biased>
[[gnu::always_inline]] inline Block* PoolCore::served_here(StreamState& s,
                                                           std::uint32_t generation, bool large,
                                                           std::size_t bytes, cudaStream_t stream,
                                                           Failure& error) noexcept {
  if (s.attention.load(std::memory_order_relaxed) == 0 &&
      s.generation.load(std::memory_order_relaxed) == generation) [[likely]] {
    if (!large) [[likely]] {
      if (Block* b = s.free[classes_.class_of(bytes)].pop_front()) [[likely]] {
        s.set_free_blocks(s.free_blocks.load(std::memory_order_relaxed) - 1);
        return allocated_here<biased>(s, b, bytes, stream);
      }
    } else if (Block* b = take_shelved(s, bytes)) {
      return allocated_here<biased>(s, b, bytes, stream);
    }
  }
  s.lock.leave<biased>();
  return allocate_slow(s, generation, bytes, stream, error);
}

template <StreamChecks checks>
Block* PoolCore::allocate_as(PoolCore& pool, std::size_t bytes, cudaStream_t stream,
                             Failure& error) noexcept {
  StreamRegistry::Found found;
  if constexpr (checks == StreamChecks::none) {
    // The lookup without a call: any other case is allocate_looking's, whole.
    found = pool.registry_.cached_handle(stream);
    if (found.state == nullptr || bytes == 0) [[unlikely]] {
      return allocate_looking<checks>(pool, bytes, stream, error);
    }
  } else {
    // These strategies ask CUDA on every lookup: the questions find_as asks (ask_id's), asked
    // here, with nothing around the two calls to the device but their verdicts (through
    // find_as, a pair ran about 50 instructions more). An answer is never asked again: a
    // failure is CUDA's to report, as it gave it.
    if (bytes == 0) [[unlikely]] return allocate_looking<checks>(pool, bytes, stream, error);
    Device& device = *pool.device_;
    if constexpr (checks == StreamChecks::full) {
      const GateStatus gate = gate_status_first(device, stream);
      if (!gate.ordinary()) [[unlikely]] return pool.allocate_unordinary(bytes, stream, gate, error);
    } else if (gate_engaged()) [[unlikely]] {
      return allocate_looking<checks>(pool, bytes, stream, error);  // the status first
    }
    found = pool.found_by_id(stream, error);
    if (found.state == nullptr) [[unlikely]] return pool.unfound(bytes, stream, {}, error);
  }
  StreamState& s = *found.state;
  const bool large = pool.classes_.is_large(bytes);
  if ((large && s.shelved.load(std::memory_order_relaxed) == 0) || !s.lock.try_enter_biased())
      [[unlikely]] {
    return pool.allocate_locking(s, found.generation, bytes, stream, error);
  }
  return pool.served_here<true>(s, found.generation, large, bytes, stream, error);
}

template <StreamChecks checks>
Block* PoolCore::allocate_looking(PoolCore& pool, std::size_t bytes, cudaStream_t stream,
                                  Failure& error) noexcept {
  if (bytes == 0) {
    error = Errc::invalid_value;
    return nullptr;
  }
  GateStatus gate;
  const StreamRegistry::Found found = pool.registry_.find_as<checks>(stream, gate, error);
  if (found.state == nullptr) return pool.unfound(bytes, stream, gate, error);
  return pool.allocate_locking(*found.state, found.generation, bytes, stream, error);
}

Block* PoolCore::allocate_unordinary(std::size_t bytes, cudaStream_t stream, GateStatus first,
                                     Failure& error) noexcept {
  const GateStatus gate = gate_status_after(*device_, stream, first);
  if (!StreamRegistry::id_allowed(gate, error)) return unfound(bytes, stream, gate, error);
  // The second answer is ordinary (the gate's work ended between the two questions): it
  // stands, as in ask_id.
  const StreamRegistry::Found found = found_by_id(stream, error);
  if (found.state == nullptr) return unfound(bytes, stream, {}, error);
  return allocate_locking(*found.state, found.generation, bytes, stream, error);
}

Block* PoolCore::unfound(std::size_t bytes, cudaStream_t stream, const GateStatus& gate,
                         Failure& error) noexcept {
  if (!error) return allocate_gated(bytes, stream, gate, error);
  // CUDA refused the id: the stream is behind no gate (gate.hpp, ungated()). What CUDA said
  // stays in the failure.
  if (error == gate_invalidated()) error.code = ungated();
  return nullptr;
}

Block* PoolCore::allocate_locking(StreamState& s, std::uint32_t generation, std::size_t bytes,
                                  cudaStream_t stream, Failure& error) noexcept {
  const bool large = classes_.is_large(bytes);
  if (!large || s.shelved.load(std::memory_order_relaxed) != 0) {
    s.lock.lock();
    return served_here<false>(s, generation, large, bytes, stream, error);
  }
  return allocate_slow(s, generation, bytes, stream, error);
}

Block* PoolCore::allocated_rare(StreamState& s, Block* b, cudaStream_t stream,
                                bool publish_due) noexcept {
  if (publish_due) publish(s.counters);
  s.lock.unlock();
  announce_live(b, stream);
  return b;
}

PoolCore::AllocateFn PoolCore::allocate_of(StreamChecks checks) noexcept {
  switch (checks) {
    case StreamChecks::none: return &allocate_as<StreamChecks::none>;
    case StreamChecks::identity: return &allocate_as<StreamChecks::identity>;
    case StreamChecks::full: break;
  }
  return &allocate_as<StreamChecks::full>;
}

void PoolCore::count_allocation(StreamState& s, Block* b, std::size_t bytes) noexcept {
  if (count_live(s, b, bytes)) publish(s.counters);
}

Block* PoolCore::allocate_found_again(std::size_t bytes, cudaStream_t stream,
                                      Failure& error) noexcept {
  GateStatus gate;
  const StreamRegistry::Found again = registry_.find(stream, gate, error);
  if (again.state == nullptr) return error ? nullptr : allocate_gated(bytes, stream, gate, error);
  return allocate_slow(*again.state, again.generation, bytes, stream, error);
}

Block* PoolCore::allocate_slow(StreamState& s, std::uint32_t generation, std::size_t bytes,
                               cudaStream_t stream, Failure& error) noexcept {
  s.lock.lock();
  if (!s.current(generation)) {
    // Retired since the lookup (release_stream, or its handle seen with a new id).
    s.lock.unlock();
    return allocate_found_again(bytes, stream, error);
  }
  if ((s.attention.load(std::memory_order_relaxed) & gated) != 0) {
    s.lock.unlock();
    const GateStatus status = gate_status(*device_, stream);
    if (status.error != cudaSuccess) {
      error = gate_status_failure(status);
      return nullptr;
    }
    if (status.capturing()) return allocate_gated(bytes, stream, status, error);
    s.lock.lock();  // gated, but no longer: an ordinary allocation
    if (!s.current(generation)) {
      // Retired (and perhaps recycled for another stream) while it was unlocked.
      s.lock.unlock();
      return allocate_found_again(bytes, stream, error);
    }
  }
  // Pinned: the state is not recycled before this allocation counts itself on it.
  ++s.pins;
  fence_if_asked(s);
  if (s.unfenced_since_ns != 0 && policy_.unfenced_ns > 0 && s.addressable() &&
      now_ns() - s.unfenced_since_ns > policy_.unfenced_ns) {
    record_fence(s);  // the time bound, on a slow path of the stream
  }
  s.lock.unlock();

  reclaim_if_stranded();
  Block* b = nullptr;
  if (classes_.is_large(bytes)) {
    b = allocate_large(s, bytes, error);
  } else {
    b = small_.take(s, classes_.class_of(bytes), error);
  }
  s.lock.lock();
  --s.pins;
  if (b != nullptr) count_allocation(s, b, bytes);
  s.lock.unlock();
  if (b != nullptr) announce_live(b, stream);
  return b;
}

Block* PoolCore::allocate_large(StreamState& s, std::size_t bytes, Failure& error) noexcept {
  const std::size_t rounded = large_.round(bytes, error);
  if (rounded == 0) return nullptr;
  bool grew = false;
  Need was;  // the need the range had: s's own unfenced range is no longer unfenced
  // The request missed s's shelf: its ranges go back, so that the arena's choice (the best fit, a
  // cut of one, s's own range extended) sees them as if there were no shelf.
  unshelve(s);
  const auto attempt = [&]() -> Block* {
    // A parked range may be clean by now, where it was: a stream that dropped a range another
    // stream used (record_stream), and asks for its size again, gets it back there rather than
    // a cut of other memory that splits the ranges it will ask for next (the two-stream trace:
    // 1.774 -> 1.031 reserved per requested byte on the fake device). Only the fences that
    // parked ranges of the request's size wait for are asked: asked of every parked block at
    // every large request, they were most of the stress bench's allocation time (docs/design.md,
    // "The tiers").
    if (parked_large_.load(std::memory_order_relaxed) != 0) drain_parked_of(rounded);
    // So may another stream's own range, freed there (the raw API's cross-stream free: the
    // two-stream trace replayed through it, 1.608 -> 1.031 on the fake device).
    if (Block* range = large_.find_tight(s, rounded, &was)) return range;
    // Before growing: the shelves go back (s's own ranges too: one may be cut to fit), parked
    // blocks may be clean by now, and other streams' ranges may be covered by fences that
    // completed, or could be by a fence they are asked for now.
    if (unshelve_all(&s)) {
      if (Block* range = large_.find(&s, rounded, &was)) return range;
    }
    drain_parked();  // all of it (the fences asked above, if any, are asked again: once each)
    large_.ask_owners(s);
    if (Block* range = large_.find(&s, rounded, &was)) return range;
    // Neighbours that were kept apart (owned by different streams) may all be covered now; so
    // may s's own ranges, by its fences that completed (a growth may then unmap their memory).
    s.lock.lock();
    refresh(s);
    s.lock.unlock();
    large_.coalesce_covered();
    if (Block* range = large_.find(&s, rounded, &was)) return range;
    return large_.grow(&s, rounded, &was, &grew, error);
  };
  Block* range = with_reclaim(attempt, error);
  if (range == nullptr) return nullptr;
  s.lock.lock();
  if (grew) ++s.counters.misses;
  else ++s.counters.hits;
  reused_here(s, was, rounded);
  s.lock.unlock();
  return range;
}

Block* PoolCore::allocate_gated(std::size_t bytes, cudaStream_t stream, const GateStatus& status,
                                Failure& error) noexcept {
  if (status.invalidated()) {
    error = gate_invalidated();
    return nullptr;
  }
  Gate* gate = gate_.load(std::memory_order_acquire);
  if (gate == nullptr) {
    // Any block handed out would be baked into a graph the pool knows nothing of, and a device
    // allocation could invalidate it. Refuse, touching nothing.
    error = ungated();
    return nullptr;
  }
  return gate->allocate(bytes, stream, status, error);
}

}  // namespace streampool::detail
