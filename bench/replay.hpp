// Replaying a trace through a MemoryPool, on the fake device or a real one.
#pragma once

#include "call_counts.hpp"
#include "trace.hpp"

#include <streampool/device.hpp>
#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace streampool::bench {

// Where a replay runs: the device, and how to make and destroy its streams.
struct Target {
  std::shared_ptr<Device> device;
  std::function<cudaStream_t()> create_stream;
  std::function<void(cudaStream_t)> destroy_stream;
  std::string description;  // "fake device" or the GPU's name
  bool real = false;        // timings mean something only on a real device
};

// The fake device (memory never backed, work completes at once), or GPU 0 when `gpu` is true.
// Throws streampool::Error when a GPU is asked for and there is none.
Target fake_target();
Target gpu_target();
// GPU 0 where CUDA sees one, the fake device otherwise.
Target default_target();

// One stretch of the timeline: the lowest and highest requested and reserved bytes after any
// event of it, so that a plot of the points keeps every peak and every trough.
struct TimelinePoint {
  std::uint64_t event;  // the stretch's first event (0-based)
  std::uint64_t requested_min, requested_max;
  std::uint64_t reserved_min, reserved_max;
};

struct ReplayReport {
  std::string trace;
  std::string target;
  std::string config;  // the STREAMPOOL_CONF line of the options replayed with
  bool raw = false;    // through the raw API (ReplayOptions::raw)
  std::uint64_t events = 0;
  std::uint64_t allocations = 0;
  // What the trace reader left out (Trace): frees of blocks allocated before recording began,
  // requests of 0 bytes; and allocations the trace never frees.
  std::uint64_t unmatched_frees = 0;
  std::uint64_t empty_allocations = 0;
  std::uint64_t left_live = 0;
  std::uint64_t peak_requested = 0;  // the trace's own peak (Trace::peak_requested), failed
                                     // allocations included
  // The highest sum of live requested bytes the replay reached (failed allocations included;
  // an allocation counted once made, a free uncounted before it is made). A trace of several
  // threads replays each thread's events in its order, not the recorded order across threads, so
  // this may be below peak_requested; with no failed allocation, peak_reserved is at least this.
  std::uint64_t replayed_peak_requested = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t waste_at_peak = 0;   // block bytes minus requested bytes, at the requested peak
  std::uint64_t device_allocations = 0;
  std::uint64_t device_frees = 0;
  std::uint64_t fences = 0;
  std::uint64_t events_recorded = 0;  // cudaEventRecord calls seen by the device
  std::uint64_t cross_stream_reuses = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t cache_misses = 0;
  std::uint64_t blocking_fallbacks = 0;
  std::uint64_t oom_retries = 0;
  std::uint64_t growth_waits = 0;  // PoolStats::growth_waits
  std::uint64_t failed_allocations = 0;
  // With ReplayOptions::count_calls: the pool's device calls by kind (calls_counted true), from
  // its construction to its destruction (the unmapping and freeing of its memory included), and
  // the CPU time they took (only the calls before the replay's end count in `seconds`).
  bool calls_counted = false;
  std::vector<DeviceCallCount> device_calls;
  double seconds = 0;
  bool timed = false;  // seconds measured on a real device
  std::vector<TimelinePoint> timeline;

  double ratio() const {
    return peak_requested == 0 ? 0.0 : double(peak_reserved) / double(peak_requested);
  }
  double hit_rate() const {
    const auto all = cache_hits + cache_misses;
    return all == 0 ? 0.0 : double(cache_hits) / double(all);
  }
  double ns_per_event() const { return events == 0 ? 0.0 : seconds * 1e9 / double(events); }
};

struct ReplayOptions {
  PoolOptions pool;  // as given: the replay does not read STREAMPOOL_CONF (user_settings does)
  // The timeline's stretches of events (fewer when the trace has fewer events); 0: no timeline.
  // Requested bytes count every allocation of the trace, failed ones too; reserved bytes are the
  // device memory the pool holds, read by the thread of each event after it (exact when the
  // trace has one thread).
  std::size_t timeline_points = 0;
  std::function<void(double)> progress;  // called with the fraction done, now and then
  // Through the raw API (MemoryPool::allocate, deallocate) instead of PooledBuffer: a free of a
  // block another stream used is a deallocate on that stream (as with cudaFreeAsync).
  bool raw = false;
  // Count the pool's device calls by kind (ReplayReport::device_calls). Each call then costs two
  // clock reads more, which a timed replay's checked allocations (two driver calls each) feel.
  bool count_calls = false;
};

// Replays every event in order, on the trace's streams (one stream per recorded stream) and
// threads (one thread per recorded thread, each keeping its own order; a free waits for its
// allocation). A free whose block was used on another stream calls record_stream first (raw:
// is a deallocate on that stream).
// Throws std::runtime_error when a thread cannot be created (the threads already running are
// stopped and joined first) or one of them fails.
ReplayReport replay(const Trace& trace, const Target& target, const ReplayOptions& options);

}  // namespace streampool::bench
