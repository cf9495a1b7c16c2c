// Statistics. Counters of one stream live in its state, under its lock, and are summed when
// stats() is called: no fast-path update touches memory another thread's fast path writes.
//
// Pool-wide peaks need a pool-wide sum, which a shared atomic would give at the price of every
// thread writing one cache line. Instead each stream publishes its contribution: it adds to the
// shared sums only when its own value rises above what it last published, or falls more than two
// granules below it. The published sum is never below the true sum and at most two granules per
// stream that is registered or holds live buffers above it (a retired stream publishes its exact
// values); with a single stream the peak is exact (a rise publishes the exact value), and with
// stats_granule = 0 it is always exact.
//
// A same-stream pair of a buffer larger than two granules would still write the shared sums
// twice (a rise at the allocation, a fall at the drop): two atomic adds on a shared line, most of
// what such a pair cost on the H200 beyond a small one. So while the pool has seen only one stream
// (and no layer above holds a range), drops publish no fall at all: the stream's published values
// stay at its highest, never below the truth, and the peaks are exact still, since only that
// stream's rises above its highest, published exactly, can raise them. The first sign of a second
// contributor (the registry's note of several streams: a second stream registered, or a stream
// retired; a range taken by a layer above) ends this for good, every stream publishing first under
// its lock (publish_falls), before the newcomer's first rise can be counted.
#include "pool_core.hpp"

#include <fmt/format.h>

namespace streampool::detail {
namespace {

void raise_peak(std::atomic<std::int64_t>& peak, std::int64_t value) noexcept {
  std::int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void publish_one(std::int64_t value, std::int64_t& published, std::int64_t slack,
                 std::atomic<std::int64_t>& sum, std::atomic<std::int64_t>& peak) noexcept {
  if (value == published || (value < published && published - value <= slack)) return;
  const std::int64_t delta = value - published;
  published = value;
  const std::int64_t now = sum.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta > 0) raise_peak(peak, now);
}

}  // namespace

void PoolCore::publish(StreamCounters& c, bool exact) noexcept {
  publish_one(c.requested, c.requested_published, exact ? 0 : byte_slack_, requested_published_,
              requested_peak_);
  publish_one(c.live, c.live_published, exact ? 0 : count_slack_, live_published_, live_peak_);
}

void PoolCore::publish_falls() noexcept {
  if (!falls_wait_.exchange(false, std::memory_order_relaxed)) return;
  // A drop that read the flag before this store holds its stream's lock: the walk below takes
  // that lock after it, and publishes what the drop left unpublished.
  BiasedLock::Sweep sweep;
  registry_.mark_every(sweep);
  for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
    sweep.lock(s->lock);
    publish(s->counters);
    s->lock.unlock();
  }
}

void PoolCore::count_range(const Block& range, bool taken) noexcept {
  publish_falls();  // a range's rise may raise a peak: no stream's fall may wait from now on
  std::lock_guard<std::mutex> lock(keepers_mutex_);
  const auto bytes = static_cast<std::int64_t>(range.size);
  StreamCounters& c = ranges_;
  if (taken) {
    c.requested += bytes;
    c.requested_total += bytes;
    ++c.live;
    ++c.live_total;
  } else {
    c.requested -= bytes;
    --c.live;
  }
  publish(c, /*exact=*/true);
}

void PoolCore::count_device_allocation(std::size_t bytes) noexcept {
  const auto n = static_cast<std::int64_t>(bytes);
  device_allocations_.fetch_add(1, std::memory_order_relaxed);
  reserved_total_.fetch_add(n, std::memory_order_relaxed);
  raise_peak(reserved_peak_, reserved_.fetch_add(n) + n);
}

void PoolCore::count_device_free(std::size_t bytes) noexcept {
  device_frees_.fetch_add(1, std::memory_order_relaxed);
  reserved_.fetch_sub(static_cast<std::int64_t>(bytes));
}

PoolStats PoolCore::stats() const {
  PoolStats s;
  {
    BiasedLock::Sweep sweep;
    registry_.mark_every(sweep);
    for (StreamState* state = registry_.first(); state != nullptr; state = state->next_state) {
      sweep.lock(state->lock);
      const StreamCounters& c = state->counters;
      s.requested_bytes.current += c.requested;
      s.requested_bytes.total += c.requested_total;
      s.live_allocations.current += c.live;
      s.live_allocations.total += c.live_total;
      s.cache_hits += c.hits;
      s.cache_misses += c.misses;
      s.fences_recorded += c.fences;
      s.cross_stream_reuses += c.cross_stream;
      s.blocking_fallbacks += c.blocking;
      s.growth_waits += c.growth_waits;
      state->lock.unlock();
    }
  }
  {
    std::lock_guard<std::mutex> lock(keepers_mutex_);
    s.requested_bytes.current += ranges_.requested;
    s.requested_bytes.total += ranges_.requested_total;
    s.live_allocations.current += ranges_.live;
    s.live_allocations.total += ranges_.live_total;
  }
  s.requested_bytes.peak = std::max(requested_peak_.load(), s.requested_bytes.current);
  s.live_allocations.peak = std::max(live_peak_.load(), s.live_allocations.current);
  s.reserved_bytes = {reserved_.load(), reserved_peak_.load(), reserved_total_.load()};
  s.device_allocations = device_allocations_.load();
  s.device_frees = device_frees_.load();
  s.oom_retries = oom_retries_.load();
  return s;
}

PoolBreakdown PoolCore::breakdown() {
  PoolBreakdown b;
  large_.describe(b);
  b.small_depot_bytes = static_cast<std::int64_t>(small_.depot_bytes());
  b.slab_bytes = static_cast<std::int64_t>(small_.slab_bytes());
  {
    BiasedLock::Sweep sweep;
    registry_.mark_every(sweep);  // every one: a state may fill before the walk reaches it
    for (StreamState* state = registry_.first(); state != nullptr; state = state->next_state) {
      if (state->free_blocks.load(std::memory_order_relaxed) == 0 &&
          state->shelved.load(std::memory_order_relaxed) == 0) {
        continue;
      }
      sweep.lock(state->lock);
      for (unsigned c = 0; c < classes_.count(); ++c) {
        const BlockList& list = state->free[c];
        if (!list.empty()) b.small_cached_bytes += static_cast<std::int64_t>(list.count * list.head->size);
      }
      for (const Block* range = state->shelf.head; range != nullptr; range = range->next) {
        ++b.shelved_ranges;
        b.shelved_bytes += static_cast<std::int64_t>(range->size);
      }
      state->lock.unlock();
    }
  }
  std::lock_guard<std::mutex> lock(parked_mutex_);
  for (const Parked& p : parked_) {
    ++b.parked_blocks;
    b.parked_bytes += static_cast<std::int64_t>(p.block->size);
  }
  for (const Block* stray = stranded_blocks_.head; stray != nullptr; stray = stray->next) {
    ++b.stranded_blocks;
    b.stranded_bytes += static_cast<std::int64_t>(stray->size);
  }
  return b;
}

}  // namespace streampool::detail

namespace streampool {

std::string to_string(const PoolStats& s) {
  const auto counter = [](const StatCounter& c) {
    return fmt::format("{} (peak {}, total {})", c.current, c.peak, c.total);
  };
  return fmt::format(
      "requested bytes {}; reserved bytes {}; live allocations {}; cache hits {}, misses {}; "
      "device allocations {}, frees {}; fences {}; cross-stream reuses {}; blocking fallbacks "
      "{}; out-of-memory retries {}; growth waits {}",
      counter(s.requested_bytes), counter(s.reserved_bytes), counter(s.live_allocations),
      s.cache_hits, s.cache_misses, s.device_allocations, s.device_frees, s.fences_recorded,
      s.cross_stream_reuses, s.blocking_fallbacks, s.oom_retries, s.growth_waits);
}

std::string to_string(const PoolBreakdown& b) {
  return fmt::format(
      "segments {} ({} bytes); slabs {} bytes (free: {} on streams, {} in the depot); free ranges "
      "{} ({} bytes clean, {} owned, largest {}); shelved {} ({} bytes); parked {} ({} bytes); "
      "stranded {} ({} bytes)",
      b.segments, b.segment_bytes, b.slab_bytes, b.small_cached_bytes, b.small_depot_bytes,
      b.free_ranges, b.free_clean_bytes, b.free_owned_bytes, b.largest_free_range,
      b.shelved_ranges, b.shelved_bytes, b.parked_blocks, b.parked_bytes, b.stranded_blocks,
      b.stranded_bytes);
}

}  // namespace streampool
