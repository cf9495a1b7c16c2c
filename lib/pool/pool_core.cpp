// Construction, destruction, stream resolution and the fast paths.
//
// The fast paths are the reason for most of the data model: an allocation that hits its stream's
// cache is a thread-local lookup, one uncontended lock, a list pop and a few counter updates; a
// drop is one lock, a push and the counters. Neither makes a device call (under
// StreamChecks::none) nor touches memory another thread writes on its own fast path.
#include "pool_core.hpp"

#include "capture_guard.hpp"

#include "../capture/capture_binding.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <fmt/format.h>

namespace streampool::detail {
namespace {

std::atomic<std::uint64_t> next_uid{1};

// A thread's last few streams, per pool. Keyed by the stream handle under StreamChecks::none, by
// the stream id otherwise. An entry is valid while its state's generation is unchanged: retiring
// or recycling a state bumps the generation, and states live as long as their pool, so a stale
// entry of a live pool is always safe to check. Entries of dead pools never match again (uids are
// never reused).
struct CachedStream {
  std::uint64_t pool = 0;
  std::uint64_t key = 0;
  StreamState* state = nullptr;
  std::uint32_t generation = 0;
};
constexpr unsigned cache_ways = 8;
thread_local CachedStream stream_cache[cache_ways];
thread_local unsigned stream_cache_victim = 0;

std::error_code device_error(cudaError_t status) {
  return make_error_code(errc_from_cuda(status) == Errc::success ? Errc::device_error
                                                                 : errc_from_cuda(status));
}

bool explicit_stream(cudaStream_t stream) {
  return stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread;
}

}  // namespace

PoolCore::PoolCore(std::shared_ptr<Device> device, const PoolOptions& options)
    : device_(std::move(device)),
      options_(options),
      classes_(options.size_classes),
      uid_(next_uid.fetch_add(1)),
      byte_slack_(2 * static_cast<std::int64_t>(options.stats_granule)),
      // Allocation counts move by one: 64 allocations of slack for every MiB of byte granule.
      count_slack_(options.stats_granule == 0
                       ? 0
                       : 2 * std::max<std::int64_t>(
                                 1, static_cast<std::int64_t>(options.stats_granule >> 14))),
      depot_(classes_.count()),
      raw_(new RawShard[raw_shards]),
      private_state_(std::make_unique<StreamState>()) {
  private_state_->free.resize(classes_.count());
  private_state_->core = this;
}

PoolCore::~PoolCore() {
  // Every buffer is gone. Pending work may still use cached memory: wait for it before freeing.
  // (If the device cannot synchronize, freeing is still right: cudaFree waits for the device.)
  device_->device_synchronize();
  for (const auto& state : states_) {
    for (const Fence& fence : state->fences) device_->event_destroy(fence.event);
  }
  for (cudaEvent_t event : idle_events_) device_->event_destroy(event);
  for (const auto& segment : segments_) {
    if (device_->free(segment->base) == cudaSuccess) count_device_free(segment->size);
  }
  for (Block* b : spare_blocks_) delete b;
  for (const auto& segment : segments_) {
    for (Block* r = segment->first; r != nullptr;) {
      Block* next = r->after;
      delete r;
      r = next;
    }
  }
}

// --- stream resolution ---------------------------------------------------------------------

StreamState* PoolCore::resolve(cudaStream_t stream, std::error_code& error) noexcept {
  std::uint64_t key;
  if (options_.stream_checks == StreamChecks::none) {
    key = reinterpret_cast<std::uintptr_t>(stream);
  } else {
    StreamId id = 0;
    const cudaError_t status = device_->stream_id(stream, &id);
    if (status != cudaSuccess) {
      error = device_error(status);
      return nullptr;
    }
    key = id;
  }
  for (const CachedStream& entry : stream_cache) {
    if (entry.pool == uid_ && entry.key == key &&
        entry.state->generation.load(std::memory_order_acquire) == entry.generation) {
      return entry.state;
    }
  }
  return resolve_slow(stream, key, error);
}

StreamState* PoolCore::resolve_slow(cudaStream_t stream, std::uint64_t key,
                                    std::error_code& error) noexcept {
  StreamId id = key;
  if (options_.stream_checks == StreamChecks::none) {
    const cudaError_t status = device_->stream_id(stream, &id);
    if (status != cudaSuccess) {
      error = device_error(status);
      return nullptr;
    }
  }
  StreamState* state = nullptr;
  std::uint32_t generation = 0;
  try {
    std::lock_guard<std::mutex> registry(registry_mutex_);
    const auto found = by_id_.find(id);
    state = found != by_id_.end() ? found->second : register_stream(stream, id);
    generation = state->generation.load(std::memory_order_relaxed);
  } catch (const std::bad_alloc&) {
    error = make_error_code(Errc::out_of_memory);
    return nullptr;
  }
  CachedStream& entry = stream_cache[stream_cache_victim++ % cache_ways];
  entry = {uid_, key, state, generation};
  return state;
}

StreamState* PoolCore::known_stream(cudaStream_t stream) noexcept {
  if (!explicit_stream(stream)) return nullptr;
  std::lock_guard<std::mutex> registry(registry_mutex_);
  const auto found = by_handle_.find(stream);
  return found != by_handle_.end() ? found->second : nullptr;
}

StreamState* PoolCore::register_stream(cudaStream_t stream, StreamId id) {
  StreamState* s;
  if (!recycled_.empty()) {
    s = recycled_.back();
    recycled_.pop_back();
  } else {
    states_.push_back(std::make_unique<StreamState>());
    s = states_.back().get();
    s->free.resize(classes_.count());
    s->core = this;
  }
  s->id = id;
  s->handle = stream;
  s->owner = stream == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id();
  s->attention.store(0, std::memory_order_relaxed);
  s->recyclable = false;
  s->generation.fetch_add(1, std::memory_order_release);
  by_id_[id] = s;
  if (explicit_stream(stream)) {
    // CUDA gives a destroyed stream's handle to the next stream it creates: a known handle with
    // a new id means the old stream is gone. Its blocks stay where they are until a device
    // synchronize makes them clean (no fence can be recorded on a destroyed stream).
    StreamState*& previous = by_handle_[stream];
    if (previous != nullptr && previous != s) {
      previous->lock.lock();
      previous->attention.fetch_or(retired, std::memory_order_relaxed);
      previous->generation.fetch_add(1, std::memory_order_release);
      previous->lock.unlock();
      by_id_.erase(previous->id);
    }
    previous = s;
  }
  return s;
}

// --- allocation ----------------------------------------------------------------------------

Block* PoolCore::allocate(std::size_t bytes, cudaStream_t stream, std::error_code& error) noexcept {
  if (bytes == 0) {
    error = make_error_code(Errc::invalid_value);
    return nullptr;
  }
  // The capture status first: under full checks always, otherwise while some capture with a pool
  // is under way (CUDA refuses a capturing stream's id, and invalidates the capture).
  if (Block* b = nullptr;
      (options_.stream_checks == StreamChecks::full || pooled_captures_active()) &&
      decided_by_capture(bytes, stream, b, error)) {
    return b;
  }
  StreamState* s = resolve(stream, error);
  if (s == nullptr) {
    // Refused: the stream is being captured without a pool (and CUDA has invalidated it).
    if (error == Errc::capture_invalidated) error = make_error_code(Errc::capture_without_pool);
    return nullptr;
  }

  if (!classes_.is_large(bytes)) {
    const std::uint32_t size_class = classes_.class_of(bytes);
    s->lock.lock();
    if (s->attention.load(std::memory_order_relaxed) == 0) {
      if (Block* b = s->free[size_class].pop_front()) {
        ++s->counters.hits;
        count_allocation(*s, b, bytes);
        s->lock.unlock();
        return b;
      }
    }
    s->lock.unlock();
  }
  return allocate_slow(*s, bytes, stream, error);
}

Block* PoolCore::allocate_slow(StreamState& s, std::size_t bytes, cudaStream_t stream,
                               std::error_code& error) noexcept {
  // Off the fast path, a capture begun without a pool is caught here, before the pool could make
  // a call the capture refuses or hand out memory the graph would keep using.
  if (Block* b = nullptr;
      options_.stream_checks != StreamChecks::full && decided_by_capture(bytes, stream, b, error)) {
    return b;
  }
  complete_graph_releases();  // a safe point: no lock held, no capture restricting this thread

  s.lock.lock();
  const std::uint32_t attention = s.attention.load(std::memory_order_relaxed);
  if ((attention & wants_fence) != 0 && s.addressable()) {
    record_fence(s);
    s.attention.fetch_and(~wants_fence, std::memory_order_relaxed);
  }
  s.lock.unlock();
  if ((attention & retired) != 0) {
    // Retired between the lookup and now (release_stream on another thread): look again.
    StreamState* again = resolve(stream, error);
    if (again == nullptr) return nullptr;
    if (again != &s) return allocate_slow(*again, bytes, stream, error);
  }

  Block* b = nullptr;
  if (classes_.is_large(bytes)) {
    b = allocate_large(s, bytes, error);
  } else {
    const std::uint32_t size_class = classes_.class_of(bytes);
    s.lock.lock();
    b = s.free[size_class].pop_front();
    if (b != nullptr) ++s.counters.hits;
    s.lock.unlock();
    if (b == nullptr) b = allocate_small_slow(s, size_class, error);
  }
  if (b == nullptr) return nullptr;
  s.lock.lock();
  count_allocation(s, b, bytes);
  s.lock.unlock();
  return b;
}

bool PoolCore::decided_by_capture(std::size_t bytes, cudaStream_t stream, Block*& out,
                                  std::error_code& error) noexcept {
  CaptureStatus status = CaptureStatus::none;
  CaptureId capture = 0;
  const cudaError_t result = device_->capture_info(stream, &status, &capture);
  if (result != cudaSuccess) {
    error = device_error(result);
    out = nullptr;
    return true;
  }
  if (status == CaptureStatus::none) return false;
  out = allocate_captured(bytes, stream, status, capture, error);
  return true;
}

Block* PoolCore::allocate_captured(std::size_t bytes, cudaStream_t stream, CaptureStatus status,
                                   CaptureId capture, std::error_code& error) noexcept {
  if (status == CaptureStatus::invalidated) {
    error = make_error_code(Errc::capture_invalidated);
    return nullptr;
  }
  CaptureBinding* binding = nullptr;
  {
    std::lock_guard<std::mutex> lock(capture_mutex_);
    const auto found = captures_.find(capture);
    if (found != captures_.end()) binding = found->second;
  }
  if (binding == nullptr) {
    // Captured without a pool: any block handed out would be baked into a graph the pool knows
    // nothing of, and a device allocation could invalidate the capture. Refuse, touching nothing.
    error = make_error_code(Errc::capture_without_pool);
    return nullptr;
  }
  // The stream's state without asking its id (refused during capture): the capture's own stream,
  // or a stream joined to it that the pool has seen before.
  const CaptureBinding::Capture bound = binding->capture();
  StreamState* s = bound.stream == stream ? bound.origin : known_stream(stream);
  if (s == nullptr) {
    error = make_error_code(Errc::capture_mismatch);
    return nullptr;
  }
  Block* b = binding->allocate(*s, bytes, error);
  if (b == nullptr) return nullptr;
  s->lock.lock();
  count_allocation(*s, b, bytes);
  s->lock.unlock();
  return b;
}

void PoolCore::count_allocation(StreamState& s, Block* b, std::size_t bytes) noexcept {
  b->state = &s;
  if (!b->large) b->free = false;  // a large range's flag is the arena's, under its mutex
  b->requested = bytes;
  StreamCounters& c = s.counters;
  c.requested += static_cast<std::int64_t>(bytes);
  c.requested_total += static_cast<std::int64_t>(bytes);
  ++c.live;
  ++c.live_total;
  if (c.requested > c.requested_published || c.live > c.live_published) publish(c);
}

bool PoolCore::count_release(StreamState& s, Block* b) noexcept {
  StreamCounters& c = s.counters;
  c.requested -= static_cast<std::int64_t>(b->requested);
  --c.live;
  b->requested = 0;
  if (!b->large) b->free = true;  // a large range is free once arena_free has indexed it
  if (c.requested_published - c.requested > byte_slack_ ||
      c.live_published - c.live > count_slack_) {
    publish(c);
  }
  return s.orphaned;
}

// --- drop ----------------------------------------------------------------------------------

void PoolCore::release(Block* b) noexcept {
  StreamState& s = *b->state;
  if (!b->large && b->recorded == nullptr && b->hold == nullptr && !options_.fence_every_free) {
    s.lock.lock();
    if (s.attention.load(std::memory_order_relaxed) == 0) {
      b->tag = s.fence_seq.load(std::memory_order_relaxed);
      s.free[b->size_class].push_front(b);
      const bool orphaned = count_release(s, b);
      s.lock.unlock();
      if (orphaned) orphan_release();
      return;
    }
    s.lock.unlock();
  }
  release_slow(b);
}

void PoolCore::put_back(StreamState& s, Block* b) noexcept {
  b->state = &s;
  b->tag = s.fence_seq.load(std::memory_order_relaxed);
  s.free[b->size_class].push_front(b);
}

void PoolCore::release_slow(Block* b) noexcept {
  StreamState& s = *b->state;
  if (b->hold != nullptr) {
    // Cut from a CapturePool's private memory: back to it.
    s.lock.lock();
    const bool orphaned = count_release(s, b);
    s.lock.unlock();
    b->hold->release(b);
    if (orphaned) orphan_release();
    return;
  }
  if ((s.attention.load(std::memory_order_acquire) & capture_bound) != 0) {
    // Dropped during a capture on its stream: the graph may use it. The CapturePool keeps it
    // (still counted live) until the pool goes, then releases it here again.
    if (CaptureBinding* binding = s.capture.load(std::memory_order_acquire)) {
      binding->adopt(b);
      return;
    }
  }
  if (b->recorded != nullptr) {
    release_recorded(b);
    return;
  }
  if (b->large) {
    release_large(b);
    return;
  }
  s.lock.lock();
  const bool orphaned = count_release(s, b);
  put_back_fenced(s, b);
  s.lock.unlock();
  if (orphaned) orphan_release();
}

void PoolCore::put_back_fenced(StreamState& s, Block* b) noexcept {
  put_back(s, b);
  fence_if_asked(s);
}

void PoolCore::fence_if_asked(StreamState& s) noexcept {
  const std::uint32_t attention = s.attention.load(std::memory_order_relaxed);
  // Never through a retired stream's handle: it may be destroyed and name another stream now.
  if ((attention & retired) != 0) return;
  if ((options_.fence_every_free || (attention & wants_fence) != 0) && s.addressable()) {
    record_fence(s);
    s.attention.fetch_and(~wants_fence, std::memory_order_relaxed);
  }
}

void PoolCore::release_recorded(Block* b) noexcept {
  // The buffer was used on several streams. Record a fence on each (this drop names them all:
  // the buffer's own stream, and those record_stream named) and park the block until every fence
  // has completed; it then becomes clean, usable anywhere. No stream waits for another, and the
  // CPU never blocks here (where a fence cannot be recorded, record_fence synchronizes instead).
  StreamState& home = *b->state;
  Parked parked{b, {}};
  std::vector<StreamState*> streams = std::move(*b->recorded);
  delete b->recorded;
  b->recorded = nullptr;
  streams.insert(streams.begin(), &home);

  home.lock.lock();
  const bool orphaned = count_release(home, b);
  home.lock.unlock();
  b->state = nullptr;

  bool lost = false;  // a stream whose use could be neither fenced nor waited for
  for (StreamState* s : streams) {
    s->lock.lock();
    const std::uint64_t tag = s->fence_seq.load(std::memory_order_relaxed);
    const bool live = (s->attention.load(std::memory_order_relaxed) & retired) == 0;
    if (live && s->addressable() && record_fence(*s) != FenceResult::failed) {
      parked.needs.push_back({s, tag});
    } else {
      lost = true;
    }
    s->lock.unlock();
  }
  if (lost) {
    // Only a device synchronize can tell that the block is free of work now.
    parked.needs.push_back({nullptr, 0});
  }
  try {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    parked_.push_back(std::move(parked));
  } catch (const std::bad_alloc&) {
    // Cannot even remember the block: give it up rather than risk a race.
  }
  if (orphaned) orphan_release();
}

void PoolCore::record_stream(Block* b, cudaStream_t stream) {
  std::error_code error;
  StreamState* other = resolve(stream, error);
  if (other == nullptr) throw Error(static_cast<Errc>(error.value()), "record_stream");
  if (other == b->state) return;
  if (b->recorded == nullptr) b->recorded = new std::vector<StreamState*>();
  for (StreamState* known : *b->recorded) {
    if (known == other) return;
  }
  b->recorded->push_back(other);
}

// --- the raw-pointer API ---------------------------------------------------------------------

void* PoolCore::allocate_raw(std::size_t bytes, cudaStream_t stream,
                             std::error_code& error) noexcept {
  Block* b = allocate(bytes, stream, error);
  if (b == nullptr) return nullptr;
  RawShard& shard = raw_[(reinterpret_cast<std::uintptr_t>(b->ptr) >> 8) % raw_shards];
  try {
    shard.lock.lock();
    shard.blocks.emplace(b->ptr, b);
    shard.lock.unlock();
  } catch (const std::bad_alloc&) {
    shard.lock.unlock();
    release(b);
    error = make_error_code(Errc::out_of_memory);
    return nullptr;
  }
  return b->ptr;
}

void PoolCore::deallocate_raw(void* ptr, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  RawShard& shard = raw_[(reinterpret_cast<std::uintptr_t>(ptr) >> 8) % raw_shards];
  shard.lock.lock();
  const auto found = shard.blocks.find(ptr);
  Block* b = found != shard.blocks.end() ? found->second : nullptr;
  if (b != nullptr) shard.blocks.erase(found);
  shard.lock.unlock();
  if (b == nullptr) return;  // not ours: nothing safe to do
  std::error_code error;
  StreamState* on = resolve(stream, error);
  if (on != nullptr && on != b->state) {
    // Freed on another stream than it was allocated on (as cudaFreeAsync allows): its last use
    // is ordered before the work enqueued on `stream` so far, so it joins that stream's cache.
    StreamState& home = *b->state;
    home.lock.lock();
    const bool orphaned = count_release(home, b);
    home.lock.unlock();
    if (b->large) {
      on->lock.lock();
      const std::uint64_t tag = on->fence_seq.load(std::memory_order_relaxed);
      fence_if_asked(*on);
      on->lock.unlock();
      std::lock_guard<std::mutex> arena(arena_mutex_);
      b->state = on;
      b->tag = tag;
      arena_free(b);
    } else {
      on->lock.lock();
      put_back_fenced(*on, b);
      on->lock.unlock();
    }
    if (orphaned) orphan_release();
    return;
  }
  release(b);
}

// --- lifetime ------------------------------------------------------------------------------

void PoolCore::orphan() noexcept {
  // Count the live buffers under each stream's lock, flagging the stream at the same time: a
  // drop either happened before (not counted, sees no flag) or after (counted, sees the flag and
  // counts down). The bias of one keeps the count from reaching zero before all are counted.
  orphan_remaining_.store(1);
  {
    std::lock_guard<std::mutex> registry(registry_mutex_);
    const auto count = [&](StreamState& state) {
      state.lock.lock();
      state.orphaned = true;
      orphan_remaining_.fetch_add(state.counters.live);
      state.lock.unlock();
    };
    for (const auto& state : states_) count(*state);
    count(*private_state_);
  }
  orphan_release();
}

void PoolCore::orphan_release() noexcept {
  if (orphan_remaining_.fetch_sub(1) == 1) delete this;
}

}  // namespace streampool::detail
