#include "stream_registry.hpp"

#include "pool_core.hpp"

namespace streampool::detail {
namespace {

std::atomic<std::uint64_t> next_uid{1};

thread_local unsigned stream_cache_victim = 0;

bool explicit_stream(cudaStream_t stream) {
  return !is_legacy_stream(stream) && stream != cudaStreamPerThread;
}

std::atomic<std::uint64_t> next_thread_token{1};

}  // namespace

constinit thread_local std::uint64_t thread_token = 0;
constinit thread_local CachedStream stream_cache[cache_ways]{};

std::uint64_t assign_thread_token() noexcept {
  thread_token = next_thread_token.fetch_add(1, std::memory_order_relaxed);
  return thread_token;
}

bool StreamRegistry::ask_gate(cudaStream_t stream, GateStatus& gate, Failure& error) noexcept {
  gate = gate_status(pool_.device(), stream);
  if (gate.error != cudaSuccess) {
    error = gate_status_failure(gate);
    return false;
  }
  return !gate.capturing();
}

bool StreamRegistry::ask_id(cudaStream_t stream, GateStatus& gate, StreamId& id,
                            Failure& error) noexcept {
  Device& device = pool_.device();
  if (checks_ == StreamChecks::full || gate_engaged()) {
    gate = gate_status(device, stream);
    if (!id_allowed(gate, error)) return false;
  }
  return id_answered(device.stream_id(stream, &id), error);
}

bool StreamRegistry::id_allowed(const GateStatus& gate, Failure& error) noexcept {
  if (gate.error != cudaSuccess) {
    error = gate_status_failure(gate);
    return false;
  }
  return !gate.capturing();
}

bool StreamRegistry::id_answered(cudaError_t status, Failure& error) noexcept {
  if (status == cudaSuccess) return true;
  error = Failure::of(status, "cudaStreamGetId");
  return false;
}

StreamRegistry::Strategy StreamRegistry::strategy_of(StreamChecks checks) noexcept {
  switch (checks) {
    case StreamChecks::none: return &StreamRegistry::find_as<StreamChecks::none>;
    case StreamChecks::identity: return &StreamRegistry::find_as<StreamChecks::identity>;
    case StreamChecks::full: break;
  }
  return &StreamRegistry::find_as<StreamChecks::full>;
}

StreamRegistry::StreamRegistry(PoolCore& pool, StreamChecks checks, std::size_t classes)
    : pool_(pool),
      checks_(checks),
      strategy_(strategy_of(checks)),
      uid_(next_uid.fetch_add(1)),
      classes_(classes) {}

StreamRegistry::~StreamRegistry() {
  for (StreamState* s = first(); s != nullptr;) {
    StreamState* next = s->next_state;
    delete s;
    s = next;
  }
}

StreamRegistry::Found StreamRegistry::lookup(cudaStream_t stream, std::uint64_t key, StreamId id,
                                             Failure& error) noexcept {
  Found found;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = by_id_.find(id);
    found.state = it != by_id_.end() ? it->second : register_stream(stream, id);
    found.generation = found.state->generation.load(std::memory_order_relaxed);
  } catch (const std::bad_alloc&) {
    error = Errc::out_of_memory;
    return {};
  }
  CachedStream& entry = stream_cache[stream_cache_victim++ % cache_ways];
  entry = {uid_, key, found.state, found.generation};
  return found;
}

StreamState* StreamRegistry::handle_state(cudaStream_t stream, Failure& error) noexcept {
  if (!explicit_stream(stream)) return nullptr;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = by_handle_.find(stream); it != by_handle_.end()) return it->second;
    return register_stream(stream, ++handle_only_);
  } catch (const std::bad_alloc&) {
    error = Errc::out_of_memory;
    return nullptr;
  }
}

StreamState* StreamRegistry::fresh_state() {
  // A retired state whose last fence completed, with no buffer or allocation in flight left,
  // may serve the new stream. Look at a few of the oldest.
  for (int looked = 0; looked < 4 && !retired_.empty(); ++looked) {
    StreamState* s = retired_.front();
    retired_.pop_front();
    waiting_.store(retired_.size(), std::memory_order_relaxed);
    s->lock.lock();
    pool_.refresh(*s);
    const bool done = s->timeline.completed.load(std::memory_order_relaxed) > s->last_index &&
                      s->counters.live == 0 && s->pins == 0 && s->recorded_by == 0;
    if (done) {
      STREAMPOOL_ASSERT(s->free_blocks.load(std::memory_order_relaxed) == 0);
      const std::uint32_t busy = gate_busy_ != 0 ? std::uint32_t{joinable} : 0u;
      s->attention.store(busy, std::memory_order_relaxed);
      s->generation.fetch_add(1, std::memory_order_release);
      s->unfenced_bytes = 0;
      s->unfenced_since_ns = 0;
      s->drops = 0;
      s->seen_activity = -1;
      s->lock.unlock();
      return s;
    }
    s->lock.unlock();
    wait_for_recycling(*s);  // not yet: to the back of the queue
  }
  auto state = std::make_unique<StreamState>();
  state->free = make_free_lists(classes_);
  state->timeline.stream = state.get();
  state->timeline.order = ++created_;
  state->core = &pool_;
  if (gate_busy_ != 0) state->attention.store(joinable, std::memory_order_relaxed);
  state->next_state = first_.load(std::memory_order_relaxed);
  StreamState* s = state.release();
  first_.store(s, std::memory_order_release);
  return s;
}

StreamState* StreamRegistry::register_stream(cudaStream_t stream, StreamId id) {
  by_id_.reserve(by_id_.size() + 1);
  if (explicit_stream(stream)) by_handle_.reserve(by_handle_.size() + 1);
  StreamState* s = fresh_state();
  s->lock.lock();
  s->id = id;
  s->handle = stream;
  s->owner = stream == cudaStreamPerThread ? this_thread_token() : 0;
  s->unfenced_limit = pool_.policy().limit(several_streams());
  s->lock.unlock();
  by_id_[id] = s;
  ++registered_;
  if (explicit_stream(stream)) {
    // CUDA gives a destroyed stream's handle to the next stream it creates: a known handle with
    // a new id means the old stream is gone. No fence can be recorded on it any more.
    StreamState*& previous = by_handle_[stream];
    if (previous != nullptr && previous != s) {
      by_id_.erase(previous->id);
      retire(*previous);
    }
    previous = s;
  }
  if (registered_ > 1) note_several();
  return s;
}

void StreamRegistry::retire(StreamState& s) noexcept {
  --registered_;
  note_several();
  pool_.empty_retired(s, /*may_fence=*/false);  // gone: nothing can fence it
  wait_for_recycling(s);
}

void StreamRegistry::wait_for_recycling(StreamState& s) noexcept {
  try {
    retired_.push_back(&s);
  } catch (const std::bad_alloc&) {
    // never recycled: the state stays, retired, for the pool's life
  }
  waiting_.store(retired_.size(), std::memory_order_relaxed);
}

void StreamRegistry::note_several() noexcept {
  if (several_.exchange(true, std::memory_order_relaxed)) return;
  // The unfenced bound starts to apply to every stream.
  const std::size_t limit = pool_.policy().limit(true);
  BiasedLock::Sweep sweep;
  mark_every(sweep);
  for (StreamState* s = first(); s != nullptr; s = s->next_state) {
    sweep.lock(s->lock);
    s->unfenced_limit = limit;
    s->lock.unlock();
  }
  // And every stream's falls are published from now on, before the new stream's first rise.
  pool_.publish_falls();
}

void StreamRegistry::gate_busy(int delta) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool was = gate_busy_ != 0;
  gate_busy_ += delta;
  STREAMPOOL_ASSERT(gate_busy_ >= 0);
  if ((gate_busy_ != 0) == was) return;
  for (StreamState* s = first(); s != nullptr; s = s->next_state) {
    if (was) {
      s->attention.fetch_and(~joinable, std::memory_order_relaxed);
    } else {
      s->attention.fetch_or(joinable, std::memory_order_relaxed);
    }
  }
}

void StreamRegistry::retire_idle() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  BiasedLock::Sweep sweep;
  for (const auto& [id, s] : by_id_) sweep.mark(s->lock);
  sweep.cover();
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    StreamState& s = *it->second;
    sweep.lock(s.lock);
    const std::int64_t activity = s.counters.activity();
    const bool idle = activity == s.seen_activity && s.counters.live == 0 && s.pins == 0 &&
                      s.recorded_by == 0 &&
                      (s.attention.load(std::memory_order_relaxed) & gated) == 0;
    s.seen_activity = activity;
    s.lock.unlock();
    if (!idle) {
      ++it;
      continue;
    }
    it = by_id_.erase(it);
    if (const auto handle = by_handle_.find(s.handle); handle != by_handle_.end() &&
                                                        handle->second == &s) {
      by_handle_.erase(handle);
    }
    retire(s);
  }
}

StreamState* StreamRegistry::release(cudaStream_t stream, StreamId id,
                                     std::size_t* unwaited) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;  // never seen, or already released
  StreamState* s = it->second;
  by_id_.erase(it);
  const auto handle = by_handle_.find(stream);
  if (handle != by_handle_.end() && handle->second == s) by_handle_.erase(handle);
  --registered_;
  note_several();
  pool_.empty_retired(*s, /*may_fence=*/true, unwaited);
  wait_for_recycling(*s);
  return s;
}

}  // namespace streampool::detail
