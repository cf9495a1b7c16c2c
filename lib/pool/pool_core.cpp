// Construction, lifetime and destruction of the core.
#include "pool_core.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace streampool::detail {
namespace {

// Cores whose destruction calls_allowed() forbade (it synchronizes the device and frees
// memory), or whose segments (or events) the device refused to free (destroy): destroyed at the
// next safe point (bury_dead_pools), which tries the frees and destroys again.
struct Graveyard {
  std::mutex mutex;
  std::vector<PoolCore*> dead;
};
Graveyard& graveyard() {
  static Graveyard* instance = new Graveyard;  // never destroyed: used until the very end
  return *instance;
}

}  // namespace

void check_failed(const char* condition, const char* file, int line) noexcept {
  std::fprintf(stderr, "streampool: invariant broken at %s:%d: %s\n", file, line, condition);
  std::abort();
}

void misuse(const std::string& what) noexcept {
  std::fprintf(stderr, "streampool: misuse: %s\n", what.c_str());
  std::abort();
}

PoolCore::PoolCore(std::shared_ptr<Device> device, const PoolOptions& options)
    : device_(std::move(device)),
      notify_(device_->wants_notifications()),
      allocate_(allocate_of(options.stream_checks)),
      options_(options),
      classes_(options.size_classes),
      policy_(FencePolicy::from(options)),
      byte_slack_(2 * static_cast<std::int64_t>(options.stats_granule)),
      // Allocation counts move by one: 64 allocations of slack for every MiB of byte granule.
      count_slack_(options.stats_granule == 0
                       ? 0
                       : 2 * std::max<std::int64_t>(
                                 1, static_cast<std::int64_t>(options.stats_granule >> 14))),
      events_(*device_),
      registry_(*this, options.stream_checks, classes_.count()),
      small_(*this, options_, classes_.count()),
      large_(*this, options_),
      raw_(new RawShard[raw_shards]) {
  bury_dead_pools();
}

PoolCore::~PoolCore() {
  owned_gate_.reset();
  owned_observer_.reset();  // the last buffer is gone: a recorder closes its file here
}

bool PoolCore::release_device_memory() noexcept {
  if (!synchronized_at_end_) {
    // Every buffer is gone. Pending work may still use cached memory: wait for it before
    // freeing. Where the device cannot synchronize, cudaMalloc's segments may still go (cudaFree
    // waits for the work), but an expandable segment may not: unmapping waits for nothing, so it
    // stays mapped until a synchronize succeeds, at a later safe point.
    synchronized_at_end_ = device_->device_synchronize() == cudaSuccess;
  }
  if (!events_taken_) {
    // The fences' events and the idle ones: each destroyed below, and an event the device
    // refuses to destroy kept to be tried again, as a segment is. (CUDA releases a destroyed
    // event's resources once it completes: no synchronize needed.)
    std::vector<cudaEvent_t> idle = events_.drain();
    try {
      for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
        for (const Fence& fence : s->fences) {
          if (fence.event != nullptr) undestroyed_events_.push_back(fence.event);
        }
        s->fences.clear();
      }
      undestroyed_events_.insert(undestroyed_events_.end(), idle.begin(), idle.end());
    } catch (const std::bad_alloc&) {
      // No room to list them: each destroyed once, here (a refusal leaks that event).
      for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
        for (const Fence& fence : s->fences) {
          if (fence.event != nullptr) device_->event_destroy(fence.event);
        }
        s->fences.clear();
      }
      for (cudaEvent_t event : idle) device_->event_destroy(event);
      undestroyed_events_.clear();
    }
    events_taken_ = true;
  }
  // Once more at once where the first attempt failed, then at the next safe point: nothing else
  // will ever destroy it (for events and segments alike).
  std::erase_if(undestroyed_events_, [&](cudaEvent_t event) {
    return device_->event_destroy(event) == cudaSuccess ||
           device_->event_destroy(event) == cudaSuccess;
  });
  bool all = undestroyed_events_.empty();
  for (const auto& segment : large_.segments()) {
    if (segment->expandable && !synchronized_at_end_) {
      all = all && segment->base == nullptr;  // mapped until a synchronize succeeds
    } else if (!large_.return_segment(*segment)) {
      all = false;  // kept for a later attempt
    }
  }
  // Handles the device refused to release once unmapped: unmapped already (no synchronize
  // needed), and theirs may be the only memory left when trim gave their reservation back. One
  // still refused keeps the core for a later attempt, as a segment does.
  large_.release_unreleased();
  return all && large_.all_released();
}

Gate& PoolCore::install_gate(std::unique_ptr<Gate> gate) noexcept {
  std::lock_guard<std::mutex> lock(gate_mutex_);
  if (owned_gate_ == nullptr) {
    owned_gate_ = std::move(gate);
    gate_.store(owned_gate_.get(), std::memory_order_release);
  }
  return *owned_gate_;
}

Observer& PoolCore::install_observer(std::unique_ptr<Observer> observer) noexcept {
  std::lock_guard<std::mutex> lock(gate_mutex_);
  if (owned_observer_ == nullptr) owned_observer_ = std::move(observer);
  return *owned_observer_;
}

Observer* PoolCore::installed_observer() noexcept {
  std::lock_guard<std::mutex> lock(gate_mutex_);
  return owned_observer_.get();
}

void PoolCore::observing(bool on) noexcept {
  std::lock_guard<std::mutex> lock(gate_mutex_);
  observer_.store(on ? owned_observer_.get() : nullptr, std::memory_order_release);
}

void PoolCore::orphan() noexcept {
  if (Gate* gate = gate_.load(std::memory_order_acquire)) gate->closing();
  // Count the live buffers under each stream's lock, flagging the stream at the same time: a
  // drop either happened before (not counted, sees no flag) or after (counted, sees the flag and
  // counts down). The bias of one keeps the count from reaching zero before all are counted.
  orphan_remaining_.store(1);
  {
    BiasedLock::Sweep sweep;
    registry_.mark_every(sweep);
    for (StreamState* s = registry_.first(); s != nullptr; s = s->next_state) {
      sweep.lock(s->lock);
      s->orphaned = true;
      orphan_remaining_.fetch_add(s->counters.live);
      s->lock.unlock();
    }
  }
  {
    std::lock_guard<std::mutex> lock(keepers_mutex_);
    orphaned_ = true;
    orphan_remaining_.fetch_add(keepers_);
  }
  count_down();
}

void PoolCore::keep() noexcept {
  std::lock_guard<std::mutex> lock(keepers_mutex_);
  ++keepers_;
  // Once orphaned, the count orphan() took is the one let_go() counts down: a keeper added
  // since (a graph destroy CUDA refused, deferred) joins it. The caller holds a keep already,
  // so the core cannot have reached zero.
  if (orphaned_) {
    STREAMPOOL_ASSERT(orphan_remaining_.load() > 0);
    orphan_remaining_.fetch_add(1);
  }
}

void PoolCore::let_go() noexcept {
  bool orphaned = false;
  {
    std::lock_guard<std::mutex> lock(keepers_mutex_);
    --keepers_;
    orphaned = orphaned_;
  }
  if (orphaned) count_down();
}

void PoolCore::count_down() noexcept {
  if (orphan_remaining_.fetch_sub(1) == 1) destroy();
}

void PoolCore::destroy() noexcept {
  // Destruction synchronizes the device and frees memory: not while calls_allowed() forbids it.
  // A segment the device refused to free keeps the core until a later safe point frees it.
  bool released = false;
  {
    const CallPermit may_sync(Restricted::device_sync);
    const CallPermit may_free(Restricted::free);
    released = may_sync && may_free && release_device_memory();
  }
  if (released) {
    delete this;  // its gate and observer go: the caller's code, which no permit may span
    return;
  }
  try {
    std::lock_guard<std::mutex> lock(graveyard().mutex);
    graveyard().dead.push_back(this);
  } catch (const std::bad_alloc&) {
    // leaked rather than destroyed where it is forbidden
  }
}

void bury_dead_pools() noexcept {
  if (!calls_allowed(Restricted::device_sync) || !calls_allowed(Restricted::free)) return;
  std::vector<PoolCore*> dead;
  {
    std::lock_guard<std::mutex> lock(graveyard().mutex);
    dead.swap(graveyard().dead);
  }
  for (PoolCore* core : dead) core->destroy();
}

void PoolCore::grant_access(int device) {
  const std::string what = "MemoryPool::grant_access(" + std::to_string(device) + ")";
  if (device < 0 || device >= 64) throw Error(Errc::invalid_value, what + ": no such device");
  if (device == device_->ordinal()) return;  // its own memory: always
  // Its cudaDeviceEnablePeerAccess is refused where cudaMalloc is (device_calls.def).
  cudaError_t status = cudaSuccess;
  {
    const CallPermit permit(Restricted::malloc);
    if (!permit) {
      throw Error(forbidden_now(), what + ": cudaDeviceEnablePeerAccess is forbidden now");
    }
    // cudaMalloc's memory (fixed segments, now or after a fallback) through the device's peer
    // access; the mappings through their own access, below.
    status = device_->enable_peer_access(device);
  }
  if (status != cudaSuccess) throw Error(status, what + ": cudaDeviceEnablePeerAccess");
  if (const Failure failed = large_.grant(device)) throw error_of(failed, what);
}

}  // namespace streampool::detail
