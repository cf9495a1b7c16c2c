// Getting memory back: parked blocks, retired streams, the out-of-memory ladder, the
// device-synchronize reclaim, trim and release_stream.
#include "pool_core.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace streampool::detail {
namespace {

// Stranded memory (waiting for a device synchronize: dropped on streams that are gone, or by uses
// nothing else can fence) is reclaimed by one once it passes half the bytes live allocations hold
// (at least stranded_floor), or once this many streams were lost since the last one (their states
// wait for it to be recycled). A synchronize costs the calling thread the work in flight (15 ms
// with the stress workload's backlog on the H200: bench/results/); other threads go on.
constexpr std::size_t stranded_floor = std::size_t{16} << 20;
constexpr std::size_t lost_streams_limit = 4096;
}  // namespace

void PoolCore::make_clean(const std::vector<Block*>& blocks) noexcept {
  // Sorted out before either tier sees any: once a block is in the depot another thread may
  // take it, or free its whole slab, so it is never read again here.
  std::vector<Block*> small;
  std::vector<Block*> large;
  try {
    for (Block* b : blocks) (b->large ? large : small).push_back(b);
  } catch (const std::bad_alloc&) {
    for (Block* b : blocks) strand(b);  // none is in a tier yet: all back at a synchronize
    return;
  }
  if (!small.empty()) small_.put_clean(small);
  if (!large.empty()) large_.put_clean(large);
}

template <class Asked>
void PoolCore::drain_asking(Asked asked) noexcept {
  // Learn first what the parked blocks `asked` selects wait for (the streams of their uncovered
  // needs, each asked once), with no lock of ours held: then take every parked block known to be
  // covered.
  std::vector<StreamState*> waited;
  bool any = false;
  try {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    for (const Parked& p : parked_) {
      if (!asked(p)) continue;
      any = true;
      for (const Need& need : p.needs) {
        StreamState* s = need.timeline->stream;
        if (s != nullptr && !covered(need) &&
            std::find(waited.begin(), waited.end(), s) == waited.end()) {
          waited.push_back(s);
        }
      }
    }
  } catch (const std::bad_alloc&) {
  }
  if (!any) return;
  for (StreamState* s : waited) {
    s->lock.lock();
    refresh(*s);
    s->lock.unlock();
  }
  std::vector<Block*> clean;
  {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    // In place, keeping the order the blocks parked in (drain_parked_front relies on it).
    std::size_t kept = 0;
    for (std::size_t i = 0; i < parked_.size(); ++i) {
      Parked& p = parked_[i];
      std::erase_if(p.needs, [](const Need& need) { return covered(need); });
      bool taken = false;
      if (p.needs.empty()) {
        try {
          clean.push_back(p.block);
          taken = true;
          if (p.block->large) count_parked_large(-1);
        } catch (const std::bad_alloc&) {
        }
      }
      if (!taken) {
        if (kept != i) parked_[kept] = std::move(p);
        ++kept;
      }
    }
    parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(kept), parked_.end());
  }
  make_clean(clean);
}

void PoolCore::drain_parked() noexcept {
  drain_asking([](const Parked&) { return true; });
}

void PoolCore::drain_parked_of(std::size_t rounded) noexcept {
  // A range a cut left whole (its rest smaller than the rounding) is larger than its request.
  const std::size_t rounding = options_.large_rounding;
  drain_asking([rounded, rounding](const Parked& p) {
    return p.block->large && p.block->size >= rounded && p.block->size - rounded < rounding;
  });
}

void PoolCore::empty_retired(StreamState& s, bool may_fence, std::size_t* unwaited) noexcept {
  std::vector<Need> needs;
  s.lock.lock();
  // The last fence: everything dropped on s so far is covered by it. A stream whose handle went
  // to another stream can be fenced by nothing: a virtual fence that the next device
  // synchronize completes. Nor is one where no event can be had, with no stream synchronize
  // instead: release_stream holds the registry's mutex here, which every thread's lookup of a
  // stream it has not cached needs; it waits for the stream afterwards, holding nothing.
  bool fenced = may_fence && s.addressable() &&
                record_fence(s, /*may_block=*/false) != FenceResult::failed;
  if (!fenced) {
    const std::uint64_t index = s.timeline.recorded.load(std::memory_order_relaxed);
    try {
      s.fences.push_back({index, nullptr, device_timeline_.recorded.load(std::memory_order_acquire)});
      s.timeline.recorded.store(index + 1, std::memory_order_release);
      if (may_fence && unwaited != nullptr) {
        *unwaited = s.unfenced_bytes;  // release_stream waits for the stream, or counts them
      } else {
        note_stranded(s.unfenced_bytes);
        lost_streams_.fetch_add(1, std::memory_order_relaxed);
      }
      fenced = true;
    } catch (const std::bad_alloc&) {
      // No room for the virtual fence: the next device synchronize's own virtual fence (it puts
      // one on every stream) takes this index instead.
    }
  }
  const std::uint64_t recorded = s.timeline.recorded.load(std::memory_order_relaxed);
  s.last_index = fenced ? recorded - 1 : recorded;
  s.attention.fetch_or(retired, std::memory_order_relaxed);
  s.attention.fetch_and(~wants_fence, std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_release);
  s.unfenced_bytes = 0;
  s.unfenced_since_ns = 0;
  publish(s.counters, /*exact=*/true);
  // Off its lists into one of its own: a list needs no host memory, which may have run out.
  BlockList blocks;
  for (std::size_t c = 0; c < classes_.count(); ++c) {
    while (Block* b = s.free[c].pop_front()) blocks.push_back(b);
  }
  s.set_free_blocks(0);
  // Shelved ranges go to the arena with their needs, as if they had been dropped there: owned by
  // s's timeline until covered, as the ranges s dropped into the arena are.
  BlockList shelved;
  take_shelf(s, shelved);
  const std::uint32_t generation = s.generation.load(std::memory_order_relaxed);
  s.lock.unlock();
  while (Block* range = shelved.pop_front()) to_arena(s, generation, range);
  std::vector<Block*> clean;
  while (Block* b = blocks.pop_front()) {
    if (covered(b->need)) {
      try {
        clean.push_back(b);
        continue;
      } catch (const std::bad_alloc&) {
      }
    }
    try {
      park(b, {b->need});  // until covered (covered already: clean at the next drain)
    } catch (const std::bad_alloc&) {
      strand(b);
    }
  }
  make_clean(clean);
}

bool PoolCore::synchronize_and_reclaim(Failure* failed, bool only_if_due) noexcept {
  if (!calls_allowed(Restricted::device_sync)) return false;
  std::lock_guard<std::mutex> reclaimer(reclaim_mutex_);
  // Asked again: the gate may have changed while this thread waited for the mutex, and another
  // thread's synchronize (or failure, which puts off the next try) may have made this one due no
  // longer: threads that found it due together would each sweep and synchronize in turn.
  CallPermit permit(Restricted::device_sync);  // through the synchronize below, no further
  if (!permit || (only_if_due && !reclaim_due())) return false;
  // A virtual fence on every stream, then the synchronize completes them all: blocks dropped
  // before the fence are covered; blocks other threads drop meanwhile get later needs, which
  // the synchronize does not cover.
  // What was stranded before the fences is what the synchronize gets back: counted off once it
  // succeeded (a failed one leaves it for the next slow path); what other threads strand meanwhile
  // stays counted.
  std::size_t stranded = 0;
  const std::size_t lost = lost_streams_.load(std::memory_order_relaxed);
  BlockList strays;  // stranded blocks (strand): the synchronize covers every need they had
  {
    // With the list: strand counts and lists a block under this mutex.
    std::lock_guard<std::mutex> lock(parked_mutex_);
    stranded = stranded_bytes_.load(std::memory_order_relaxed);
    strays = std::exchange(stranded_blocks_, BlockList{});
  }
  const std::uint64_t sync = device_timeline_.recorded.load(std::memory_order_relaxed);
  device_timeline_.recorded.store(sync + 1, std::memory_order_release);
  {
    BiasedLock::Sweep sweep;
    registry_.mark_every(sweep);
    for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
      sweep.lock(s->lock);
      const std::uint64_t index = s->timeline.recorded.load(std::memory_order_relaxed);
      try {
        s->fences.push_back({index, nullptr, sync});
        s->timeline.recorded.store(index + 1, std::memory_order_release);
        s->unfenced_bytes = 0;
        s->unfenced_since_ns = 0;
      } catch (const std::bad_alloc&) {
        // this stream's blocks wait for a later synchronize
      }
      s->lock.unlock();
    }
  }
  const cudaError_t status = device_->device_synchronize();
  permit.release();
  if (status != cudaSuccess) {
    if (failed != nullptr) *failed = Failure::of(status, "cudaDeviceSynchronize");
    // Its virtual fences hold every stream's later ones back: a later slow path tries again.
    const std::uint32_t failures = failed_syncs_.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::int64_t wait =
        failures < 2 ? 0 : std::min(std::int64_t{1'000'000} << std::min(failures - 2, 30u),
                                    max_retry_wait_ns);
    retry_at_ns_.store(now_ns() + wait, std::memory_order_relaxed);
    synchronize_failed_.store(true, std::memory_order_release);  // after retry_at_ns_
    {
      std::lock_guard<std::mutex> lock(parked_mutex_);
      while (Block* b = strays.pop_front()) stranded_blocks_.push_back(b);
    }
    return false;
  }
  failed_syncs_.store(0, std::memory_order_relaxed);
  synchronize_failed_.store(false, std::memory_order_relaxed);
  stranded_bytes_.fetch_sub(stranded, std::memory_order_relaxed);
  lost_streams_.fetch_sub(lost, std::memory_order_relaxed);
  std::uint64_t done = device_timeline_.completed.load(std::memory_order_relaxed);
  while (done < sync + 1 &&
         !device_timeline_.completed.compare_exchange_weak(done, sync + 1,
                                                            std::memory_order_acq_rel)) {
  }

  // Everything covered now leaves the streams' lists for the depot, and their shelves for the
  // arena, where every stream (and the slab and segment returns below and in trim) sees it.
  unshelve_all();
  std::vector<Block*> clean;
  while (Block* b = strays.pop_front()) {
    try {
      clean.push_back(b);
    } catch (const std::bad_alloc&) {
      strand(b);  // for the next synchronize
    }
  }
  {
    BiasedLock::Sweep sweep;
    registry_.mark_every(sweep);
    for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
      sweep.lock(s->lock);
      refresh(*s);
      std::size_t moved = 0;
      try {
        for (std::size_t c = 0; c < classes_.count(); ++c) {
          BlockList& list = s->free[c];
          for (Block* b = list.head; b != nullptr;) {
            Block* next = b->next;
            if (covered(b->need)) {
              clean.push_back(b);
              list.remove(b);
              ++moved;
            }
            b = next;
          }
        }
      } catch (const std::bad_alloc&) {
      }
      s->set_free_blocks(s->free_blocks.load(std::memory_order_relaxed) - moved);
      s->lock.unlock();
    }
  }
  make_clean(clean);
  drain_parked();
  small_.return_free_slabs();
  large_.coalesce_covered();
  STREAMPOOL_EXPENSIVE_ASSERT(consistent());
  return true;
}

void PoolCore::reclaim_if_stranded() noexcept {
  // Streams gone idle (PoolOptions::idle_ms): a slow path looks once a period (each thread reads
  // the clock for it every 16 of its slow paths, not at each; while a synchronize has failed,
  // reclaim_due() reads it at each).
  thread_local unsigned clock_countdown = 0;
  if (const std::int64_t period = std::int64_t{options_.idle_ms} * 1'000'000;
      period > 0 && clock_countdown-- == 0) {
    clock_countdown = 15;
    const std::int64_t now = now_ns();
    std::int64_t due = next_idle_check_ns_.load(std::memory_order_relaxed);
    if (now >= due && next_idle_check_ns_.compare_exchange_strong(due, now + period)) {
      registry_.retire_idle();
    }
  }
  if (reclaim_due()) synchronize_and_reclaim(nullptr, /*only_if_due=*/true);
}

bool PoolCore::reclaim_due() const noexcept {
  const std::size_t limit = std::max(
      stranded_floor,
      static_cast<std::size_t>(std::max<std::int64_t>(requested_published_.load(), 0)) / 2);
  const bool failed = synchronize_failed_.load(std::memory_order_acquire);
  if (stranded_bytes_.load(std::memory_order_relaxed) < limit &&
      lost_streams_.load(std::memory_order_relaxed) < lost_streams_limit && !failed) {
    return false;
  }
  return !failed || now_ns() >= retry_at_ns_.load(std::memory_order_relaxed);
}

bool PoolCore::reclaim(int step, Failure& failed) noexcept {
  switch (step) {
    case 0:
      unshelve_all();
      drain_parked();
      return true;
    case 1:
      return large_.release_free_segments(0) != 0;
    case 3:
      // The last try is made whatever this pool gave back: memory another pool or thread gave
      // back since the last attempt is there to take.
      large_.release_free_segments(0);
      return true;
    case 2:
      return synchronize_and_reclaim(&failed);
  }
  return false;
}

void PoolCore::release_stream(cudaStream_t stream) {
  refuse_if_left(stream, "release_stream");
  refuse_if_gated(*device_, stream, "release_stream");  // before asking the id (gate.hpp)
  StreamId id = 0;
  throw_on_cuda_error(device_->stream_id(stream, &id), "release_stream: cudaStreamGetId");
  constexpr std::size_t none = SIZE_MAX;
  std::size_t unwaited = none;  // the bytes a virtual last fence covers, if it is one
  StreamState* s = registry_.release(stream, id, &unwaited);
  if (s == nullptr) return;  // never seen, or already released
  // Its last fence covers everything dropped on it: where it is pending, wait for the stream
  // where that is allowed now, and its blocks are clean at once; otherwise they come back when
  // the fence completes. The last fence may be a virtual one, which only a device synchronize
  // would complete: no event could be had, and empty_retired did not wait, holding the
  // registry's mutex. Not on the fence's event: once the lock is let go, another thread may
  // learn that the fence completed and give its event to a fence of another stream. (The state
  // is recycled only once that fence completed, so one that names another stream by now has
  // nothing pending of this one; an unchanged generation says that it is still this stream's.)
  s->lock.lock();
  const std::uint32_t generation = s->generation.load(std::memory_order_relaxed);
  const std::uint64_t last = s->last_index;
  const bool pending = s->id == id &&
                       last < s->timeline.recorded.load(std::memory_order_relaxed) &&
                       s->timeline.completed.load(std::memory_order_relaxed) <= last;
  const bool instead_of_fence = pending && fence_at(*s, last) == nullptr;  // a virtual one
  s->lock.unlock();
  bool waited = false;
  if (pending) {
    const SyncPermit permit(stream);
    waited = permit && device_->stream_synchronize(stream) == cudaSuccess;
  }
  if (waited) {
    s->lock.lock();
    if (s->generation.load(std::memory_order_relaxed) == generation) {
      complete_through(*s, last);
      if (instead_of_fence) ++s->counters.blocking;  // as record_fence counts its own
    }
    s->lock.unlock();
  }
  if (unwaited != none && pending && !waited) {
    // Not waited for after all (calls_allowed forbade it, or the device refused): stranded until a
    // device synchronize, as a stream nothing can fence.
    note_stranded(unwaited);
    lost_streams_.fetch_add(1, std::memory_order_relaxed);
  }
  drain_parked();
}

void PoolCore::trim(std::size_t bytes_to_keep) {
  Gate* gate = gate_.load(std::memory_order_acquire);
  if (gate != nullptr) gate->safe_point();
  synchronize_and_reclaim();
  // The synchronize may have completed the last replays of graphs, whose releases come back now.
  if (gate != nullptr) {
    gate->safe_point();
    synchronize_and_reclaim();
  }
  large_.release_free_segments(bytes_to_keep);
}

Block* PoolCore::take_range(std::size_t bytes, Failure& error) noexcept {
  const std::size_t rounded = large_.round(bytes, error);
  if (rounded == 0) return nullptr;
  const auto attempt = [&]() -> Block* {
    if (Block* range = large_.find(nullptr, rounded, nullptr)) return range;
    unshelve_all();
    drain_parked();
    large_.coalesce_covered();
    if (Block* range = large_.find(nullptr, rounded, nullptr)) return range;
    return large_.grow(nullptr, rounded, nullptr, nullptr, error);
  };
  Block* range = with_reclaim(attempt, error);
  if (range != nullptr) {
    count_range(*range, true);
    announce_held(range);
  }
  return range;
}

void PoolCore::return_range(Block* range, std::vector<Need> needs) noexcept {
  announce_dropped(range, nullptr);
  count_range(*range, false);
  settle(range, needs);
}

void PoolCore::strand_range(Block* range) noexcept {
  announce_dropped(range, nullptr);
  count_range(*range, false);
  strand(range);
}

bool PoolCore::past_reserved_limit(std::size_t bytes) const noexcept {
  const std::size_t limit = options_.max_reserved_bytes;
  const auto reserved = static_cast<std::size_t>(std::max<std::int64_t>(0, stats_reserved()));
  return limit != 0 && (reserved >= limit || bytes > limit - reserved);
}

std::string PoolCore::out_of_memory_message(std::size_t bytes, cudaStream_t stream) {
  std::size_t device_free = 0;
  std::size_t device_total = 0;
  bool known = false;
  if (const CallPermit permit(Restricted::free); permit) {
    known = device_->mem_get_info(&device_free, &device_total) == cudaSuccess;
  }
  const PoolStats now = stats();
  const std::int64_t cached = now.reserved_bytes.current - now.requested_bytes.current;
  return fmt::format(
      "out of memory allocating {} bytes on stream {}: the pool reserves {} bytes ({} requested "
      "by live allocations, {} cached or rounding{}), the device has {}",
      bytes, static_cast<const void*>(stream), now.reserved_bytes.current,
      now.requested_bytes.current, cached,
      options_.max_reserved_bytes != 0
          ? fmt::format(", limit {}", options_.max_reserved_bytes)
          : std::string(),
      known ? fmt::format("{} bytes free of {}", device_free, device_total)
            : std::string("an unknown number of bytes free"));
}

}  // namespace streampool::detail
