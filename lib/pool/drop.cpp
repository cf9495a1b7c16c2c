// The one drop: every way a block comes back to the pool (docs/design.md, "The one drop").
//
//   1. its uses: the drop's stream and the streams record_stream named, each with the generation
//      it was seen at (a state retired or recycled since is a lost use);
//   2. the gate, for memory a layer above owns or a drop on a stream it has bound;
//   3. placement: one live use -> that stream's list, or the arena owned by it, and the fence
//      policy; otherwise a fence on each live use, a device-timeline need for each lost one, and
//      the block is parked until every need is covered.
//
// The fast path (drop_unannounced) is case 3 for a block dropped on its own stream, a small one
// onto its list or a large range onto the stream's shelf: one lock taken through its bias, a push
// and the counters, no device call, no other lock, and no call it returns from.
#include "pool_core.hpp"

#include <algorithm>

namespace streampool::detail {

// The fast path: a block dropped on its own stream (a small block onto its list, a large range
// onto the stream's shelf), whose lock this thread takes through the bias. It calls nothing it
// returns from; anything else is drop_locking's, whole.
[[gnu::always_inline]] void PoolCore::drop_unannounced(Block* b, cudaStream_t stream) noexcept {
  StreamState& s = *b->home;
  if (b->recorded != nullptr || b->keeper != nullptr ||
      (b->large && options_.large_shelf == 0) || !s.lock.try_enter_biased()) [[unlikely]] {
    return drop_locking(b, stream);
  }
  if (!b->large) [[likely]] {
    if (droppable_here(s, b)) [[likely]] return dropped_on_list<true>(s, b);
  } else if (shelvable_here(s, b)) {
    return dropped_on_shelf<true>(s, b);
  }
  s.lock.leave_biased();
  drop_locking(b, stream);
}

void PoolCore::drop(Block* b, cudaStream_t stream) noexcept {
  // Before the block is on any list, where another thread may take it and announce it live. A
  // gate-owned piece (keeper) was never announced (the layer above announced its range as held).
  // Announced on the block's own stream, as it is placed: this thread may be another than the one
  // whose per-thread stream `stream` named (a release the gate's layer completed at a safe point).
  if (notify_) [[unlikely]] return drop_announcing(b, stream);
  drop_unannounced(b, stream);
}

void PoolCore::drop_announcing(Block* b, cudaStream_t stream) noexcept {
  if (b->keeper == nullptr) announce_dropped_home(b, stream);
  drop_unannounced(b, stream);
}

template <bool biased>
[[gnu::always_inline]] inline void PoolCore::dropped_on_list(StreamState& s, Block* b) noexcept {
  const bool publish_due = uncount(s, b);  // not retired: droppable_here saw no attention bit
  b->free = true;
  b->need = s.need_now();
  s.free[b->size_class].push_front(b);
  s.set_free_blocks(s.free_blocks.load(std::memory_order_relaxed) + 1);
  // dropped_here, where droppable_here holds: below the bound, and no fence asked for.
  s.unfenced_bytes += b->size;
  const bool clock = clock_due(s);
  if (publish_due || clock || s.orphaned) [[unlikely]] return dropped_rare(s, publish_due, clock);
  s.lock.leave<biased>();
}

// A large range used on its own stream alone: onto the stream's shelf (shelf.cpp). The fence
// policy holds as for a range kept in the arena (keep_on): with several streams, a drop past the
// unfenced bound records a fence here.
template <bool biased>
[[gnu::always_inline]] inline void PoolCore::dropped_on_shelf(StreamState& s, Block* b) noexcept {
  const bool publish_due = uncount(s, b);  // not retired: shelvable_here saw no attention bit
  b->need = s.need_now();
  const bool full = shelve(s, b);
  // dropped_here, where shelvable_here holds: no fence asked for.
  s.unfenced_bytes += b->size;
  const bool past_bound = s.unfenced_bytes >= s.unfenced_limit;
  const bool clock = !past_bound && clock_due(s);
  if (publish_due || full || past_bound || clock || s.orphaned) [[unlikely]] {
    return shelved_rare(s, publish_due, past_bound, clock);
  }
  s.lock.leave<biased>();
}

void PoolCore::shelved_rare(StreamState& s, bool publish_due, bool past_bound,
                            bool clock) noexcept {
  if (publish_due) publish(s.counters);
  Block* oldest = shelf_overflow(s);
  if (past_bound || (clock && past_time_bound(s))) fence_or_ask(s);
  const std::uint32_t generation = s.generation.load(std::memory_order_relaxed);
  const bool orphaned = s.orphaned;
  // The core must outlive to_arena: ~MemoryPool, on another thread, may count the live buffers
  // as soon as this lock goes, and the range just dropped is no longer among them.
  if (oldest != nullptr) keep();
  s.lock.unlock();
  if (oldest != nullptr) to_arena(s, generation, oldest);
  if (orphaned) count_down();
  if (oldest != nullptr) let_go();  // last: it may destroy the core
}

void PoolCore::dropped_rare(StreamState& s, bool publish_due, bool clock) noexcept {
  if (publish_due) publish(s.counters);
  if (clock && past_time_bound(s)) fence_or_ask(s);  // the time bound
  const bool orphaned = s.orphaned;
  s.lock.unlock();
  if (orphaned) count_down();
}

void PoolCore::drop_locking(Block* b, cudaStream_t stream) noexcept {
  StreamState& s = *b->home;
  // While the gate is busy (PoolCore::gate_busy_begins), every state has the `joinable` bit and
  // every drop asks the gate (drop_slow): any stream may have joined the gate's work, and only
  // the gate can tell.
  if (!b->large && b->recorded == nullptr && b->keeper == nullptr) {
    s.lock.lock();
    if (droppable_here(s, b)) return dropped_on_list<false>(s, b);
    s.lock.unlock();
  } else if (b->large && b->recorded == nullptr && b->keeper == nullptr &&
             options_.large_shelf != 0) {
    s.lock.lock();
    if (shelvable_here(s, b)) return dropped_on_shelf<false>(s, b);
    s.lock.unlock();
  }

  const Uses uses = uses_of(b);
  drop_slow(b, stream, uses.view());
}

void PoolCore::drop_slow(Block* b, cudaStream_t stream,
                         UseSpan uses) noexcept {
  const bool piece = b->keeper != nullptr;
  const bool busy =
      !piece && (b->home->attention.load(std::memory_order_relaxed) & joinable) != 0;
  if (Gate* gate = gate_.load(std::memory_order_acquire);
      gate != nullptr && (piece || busy || gate_engaged()) && gate->take_drop(b, stream, uses)) {
    // Not a piece: a block the gate's layer adopted, which work it owns may still use.
    if (!piece) announce_held(b);
    return;
  }
  StreamState& s = *b->home;
  // Kept across the placement: once count_release lets the stream's lock go, ~MemoryPool (on
  // another thread) counts no live buffer for this block, and would destroy the core while the
  // block is still being placed (its uses fenced, the block parked or kept).
  keep();
  s.lock.lock();
  const bool orphaned = count_release(s, b);
  s.lock.unlock();
  place(b, uses);
  if (orphaned) count_down();
  let_go();  // last: it may destroy the core
}

Uses PoolCore::uses_of(Block* b) noexcept {
  const RecordedStream home{b->home, b->home_generation};
  if (b->recorded == nullptr) return Uses(home);
  std::unique_ptr<std::vector<RecordedStream>> all(b->recorded);
  b->recorded = nullptr;
  for (const RecordedStream& use : *all) {
    use.state->lock.lock();
    --use.state->recorded_by;
    use.state->lock.unlock();
  }
  try {
    all->insert(all->begin(), home);
  } catch (const std::bad_alloc&) {
    return Uses();  // no room to name them: every use is lost, only a device synchronize covers it
  }
  return Uses(std::move(all));
}

void PoolCore::count_drop(Block* b) noexcept {
  StreamState& s = *b->home;
  s.lock.lock();
  const bool orphaned = count_release(s, b);
  s.lock.unlock();
  if (orphaned) count_down();
}

void PoolCore::place(Block* b, UseSpan uses) noexcept {
  b->home = nullptr;
  if (uses.size() == 1 && uses.front().state != nullptr) {
    StreamState& u = *uses.front().state;
    u.lock.lock();
    if (u.current(uses.front().generation)) {
      keep_on(u, b);  // unlocks
      return;
    }
    u.lock.unlock();
  }
  std::vector<Need> needs;
  if (!fence_uses(uses, needs)) {  // no room to list them: back at a device synchronize
    strand(b);
    return;
  }
  settle(b, needs);
}

void PoolCore::keep_on(StreamState& u, Block* b) noexcept {
  b->need = u.need_now();
  ++u.counters.kept_drops;  // u is in use, if only by frees of other streams' blocks
  const bool large = b->large;  // once u is unlocked, a small block may be another thread's
  if (!large) {
    b->free = true;
    u.free[b->size_class].push_front(b);
    u.set_free_blocks(u.free_blocks.load(std::memory_order_relaxed) + 1);
  }
  if (dropped_here(u, b->size)) fence_or_ask(u);
  const std::uint32_t generation = u.generation.load(std::memory_order_relaxed);
  u.lock.unlock();
  if (large) to_arena(u, generation, b);
}

Need PoolCore::fence_now(StreamState& s, std::uint32_t generation) noexcept {
  s.lock.lock();
  Need need = s.need_now();
  if (!s.current(generation)) {
    need = {&device_timeline_, device_timeline_.recorded.load(std::memory_order_acquire)};
  } else if (s.addressable()) {
    switch (record_fence(s)) {
      case FenceResult::recorded: break;
      case FenceResult::synchronized: need = {}; break;
      case FenceResult::failed: break;  // covered by the stream's next fence, or its retirement
    }
  } else {
    // Another thread's per-thread stream: only that thread may fence it. Ask.
    s.attention.fetch_or(wants_fence, std::memory_order_relaxed);
  }
  s.lock.unlock();
  return need;
}

bool PoolCore::fence_uses(UseSpan uses, std::vector<Need>& needs) noexcept {
  const Need lost{&device_timeline_, device_timeline_.recorded.load(std::memory_order_acquire)};
  try {
    needs.reserve(needs.size() + std::max<std::size_t>(uses.size(), 1));
  } catch (const std::bad_alloc&) {
    return false;
  }
  // Room for every need is reserved: the push_backs below do not allocate.
  if (uses.empty()) needs.push_back(lost);
  for (const RecordedStream& use : uses) {
    // A state retired (or recycled) since the use was recorded no longer names its stream: no
    // fence can be recorded through its handle, and its last fence may precede the use.
    const Need need = use.state != nullptr ? fence_now(*use.state, use.generation) : lost;
    if (need.timeline != nullptr) needs.push_back(need);
  }
  return true;
}

void PoolCore::settle(Block* b, const std::vector<Need>& needs) noexcept {
  std::vector<Need> pending;
  try {
    for (const Need& need : needs) {
      if (!covered(need)) pending.push_back(need);
    }
  } catch (const std::bad_alloc&) {
    strand(b);  // until a device synchronize, rather than risk handing it out early
    return;
  }
  if (pending.empty()) {
    try {
      make_clean({b});
    } catch (const std::bad_alloc&) {
      strand(b);
    }
    return;
  }
  std::size_t lost = 0;
  for (const Need& need : pending) {
    if (need.timeline == &device_timeline_) lost = b->size;  // once, however many lost uses
  }
  // Counted once parked: a block park strands instead is counted by strand.
  if (park(b, std::move(pending))) note_stranded(lost);
  drain_parked_front();
}

void PoolCore::drain_parked_front() noexcept {
  // Blocks park in the order they were dropped, and fences complete in about that order: the
  // oldest are the likeliest to be covered. Take those the fences known to have completed
  // cover (no device call), and send one that is not yet to the back, so that a block waiting
  // on a stream that stopped (and whose fences nobody learns of) does not hold the others up.
  constexpr int at_most = 8;
  Block* clean[at_most];
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    bool rotated = false;
    while (n < at_most && !parked_.empty()) {
      Parked& p = parked_.front();
      std::erase_if(p.needs, [](const Need& need) { return covered(need); });
      if (p.needs.empty()) {
        clean[n++] = p.block;
        if (p.block->large) count_parked_large(-1);
        parked_.pop_front();
        continue;
      }
      if (rotated || parked_.size() == 1) break;
      rotated = true;
      try {
        parked_.push_back(std::move(p));
      } catch (const std::bad_alloc&) {
        break;  // still at the front, its needs intact
      }
      parked_.pop_front();
    }
  }
  if (n == 0) return;
  try {
    make_clean(std::vector<Block*>(clean, clean + n));
  } catch (const std::bad_alloc&) {
    for (int i = 0; i < n; ++i) strand(clean[i]);  // in no tier yet: back at a synchronize
  }
}

bool PoolCore::park(Block* b, std::vector<Need> needs) noexcept {
  // A parked need names a stream's (or the device's) timeline: a clean one names none.
  std::erase_if(needs, [](const Need& need) { return covered(need); });
  if (!b->large) b->free = true;  // a large range is free once the arena has indexed it
  b->need = {};
  try {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    parked_.push_back({b, std::move(needs)});
    if (b->large) count_parked_large(+1);
  } catch (const std::bad_alloc&) {
    strand(b);
    return false;
  }
  return true;
}

void PoolCore::strand(Block* b) noexcept {
  if (!b->large) b->free = true;
  b->need = {};
  std::lock_guard<std::mutex> lock(parked_mutex_);
  note_stranded(b->size);  // with the push: a synchronize takes both or neither
  stranded_blocks_.push_back(b);
}

void PoolCore::record_stream(Block* b, cudaStream_t stream) {
  Failure error;
  GateStatus status;
  StreamRegistry::Found found = registry_.find(stream, status, error);
  if (found.state == nullptr) {
    if (error) throw error_of(error, "record_stream: the stream's identity");
    // Behind the gate: a stream it has bound is known to it, without asking the id.
    Gate* gate = gate_.load(std::memory_order_acquire);
    found.state = gate != nullptr ? gate->bound_state(stream) : nullptr;
    if (found.state == nullptr) {
      throw Error(ungated(), ungated_message("record_stream"));
    }
    found.generation = found.state->generation.load(std::memory_order_acquire);
  }
  announce_recorded(b, stream);
  StreamState& other = *found.state;
  const auto note_use = [&](int named) {
    other.lock.lock();
    ++other.counters.recorded_uses;  // a use of the stream: it is not idle
    other.recorded_by += named;
    other.lock.unlock();
  };
  if (found.state == b->home && found.generation == b->home_generation) {
    note_use(0);
    return;
  }
  if (b->recorded == nullptr) b->recorded = new std::vector<RecordedStream>();
  for (const RecordedStream& known : *b->recorded) {
    if (known.state == found.state && known.generation == found.generation) {
      note_use(0);
      return;
    }
  }
  b->recorded->push_back({found.state, found.generation});
  note_use(1);
}

void PoolCore::forget_recorded(Block* b) noexcept {
  if (b->recorded == nullptr) return;
  for (const RecordedStream& use : *b->recorded) {
    use.state->lock.lock();
    --use.state->recorded_by;
    use.state->lock.unlock();
  }
  delete b->recorded;
  b->recorded = nullptr;
}

}  // namespace streampool::detail
