// The C entry points of streampool_torch.h: one MemoryPool per device, the pointers it handed
// out, and the CapturePools of PyTorch's graph captures.
//
//   Layer            one per     holds                                       lock
//   table            process     DevicePools by ordinal, made on first use   table mutex (to make)
//   └─ DevicePool    device      ReservedLimit → Device, MemoryPool          (both thread-safe)
//      ├─ shards     16          pointer → PooledBuffer handed to PyTorch    a mutex per shard
//      └─ graphs     device      MempoolId → CapturePool + use count,        graphs mutex
//                                captures to attach, pools released
//
// The pools are never destroyed (but by reset_for_tests): PyTorch frees tensors during
// interpreter shutdown, after static destructors may have run.
#include "streampool_torch.h"

#include "testing.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>
#include <streampool/reserved_limit.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace streampool::torch_layer {
namespace {

constexpr int max_devices = 64;
constexpr std::size_t shard_count = 16;

using Buffer = PooledBuffer<std::byte>;
using MempoolId = std::pair<std::uint64_t, std::uint64_t>;

struct Shard {
  std::mutex mutex;
  std::unordered_map<void*, Buffer> buffers;
};

// A private pool of PyTorch's (a MempoolId): the captures that name it, one after another, and
// the graphs made from them share its memory.
struct GraphPool {
  std::shared_ptr<CapturePool> pool;
  int uses = 0;            // captures begun with it, less releases
  bool capturing = false;  // between begin and end
};

struct DevicePool {
  DevicePool(std::shared_ptr<Device> device, const PoolOptions& options)
      : limit(std::make_shared<ReservedLimit>(std::move(device))), pool(limit, options) {}

  std::shared_ptr<ReservedLimit> limit;
  MemoryPool pool;
  std::array<Shard, shard_count> shards;
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> out_of_memory{0};

  std::mutex graphs_mutex;
  std::map<MempoolId, GraphPool> graphs;                   // [graphs_mutex]
  std::vector<std::shared_ptr<CapturePool>> to_attach;      // [graphs_mutex]
  std::vector<std::shared_ptr<CapturePool>> released;       // [graphs_mutex]
  std::atomic<int> preparing{0};  // to_attach.size(), read without the mutex

  // Route 2 (segment_alloc): the stream that segments asked for during a capture are allocated
  // on instead (no work is enqueued on it), made at the first; the segments handed out; those
  // freed while a synchronize was not possible, dropped at the next trim (room for every live
  // segment is reserved, so that a free needs no host memory).
  cudaStream_t segment_stream = nullptr;  // [graphs_mutex]
  std::size_t live_segments = 0;          // [graphs_mutex]
  std::vector<Buffer> released_segments;  // [graphs_mutex]

  Shard& shard_of(const void* ptr) noexcept {
    return shards[(reinterpret_cast<std::uintptr_t>(ptr) >> 9) % shard_count];
  }
};

struct Table {
  std::mutex mutex;  // to make a pool
  std::array<std::atomic<DevicePool*>, max_devices> pools{};
  DeviceFactory factory;  // [mutex]; empty: CudaDevice
  StreamFactory streams;  // [mutex]; empty: cudaStreamCreateWithFlags
  PoolOptions options;    // [mutex]
};
Table& table() {
  static Table* instance = new Table;  // never destroyed: see the top of the file
  return *instance;
}

// Captures with a pool under way (prepared, not yet ended), on every device.
std::atomic<int> captures_under_way{0};

thread_local std::string last_error;
thread_local bool last_out_of_memory = false;

int fail(std::string message, bool out_of_memory = false) noexcept {
  last_out_of_memory = out_of_memory;
  try {
    last_error = std::move(message);
  } catch (...) {
    last_error.clear();
  }
  return -1;
}

// Whether an allocation of `size` bytes asks for memory: not for 0 (null, as PyTorch's own
// allocator answers). Throws Error(invalid_value) for a negative size.
bool wants_memory(ssize_t size) {
  if (size < 0) throw Error(Errc::invalid_value, "negative size " + std::to_string(size));
  return size != 0;
}

// The pool of `device`, made on first use. Throws Error when it cannot be made.
DevicePool& pool_of(int device) {
  if (device < 0 || device >= max_devices) {
    throw Error(Errc::invalid_value, "device " + std::to_string(device) + " out of range");
  }
  Table& t = table();
  if (DevicePool* p = t.pools[device].load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lock(t.mutex);
  if (DevicePool* p = t.pools[device].load(std::memory_order_acquire)) return *p;
  // CudaDevice(device) runs each call on its GPU and leaves the caller's current device alone.
  std::shared_ptr<Device> made =
      t.factory ? t.factory(device) : std::make_shared<CudaDevice>(device);
  auto* p = new DevicePool(std::move(made), t.options);
  t.pools[device].store(p, std::memory_order_release);
  return *p;
}

DevicePool* existing(int device) noexcept {
  if (device < 0 || device >= max_devices) return nullptr;
  return table().pools[device].load(std::memory_order_acquire);
}

// While a capture with a pool is under way, every call into the pool runs in relaxed capture
// mode for its thread (cudaThreadExchangeStreamCaptureMode), as PyTorch's own allocator does
// around cudaMalloc: PyTorch captures in global mode by default, which would refuse the pool's
// cudaMalloc and cudaEventQuery (and invalidate the capture) in every thread. The pool is told
// the capture is relaxed (prepare_capture_with_pool), and so still makes none of the calls that
// CUDA refuses in every mode. No call at all when no capture is under way.
//
// `always`: whether or not a capture of this layer's is under way (route 2's segments are asked
// for inside captures PyTorch begins in global mode without telling this layer).
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(bool always = false) noexcept {
    if (!always && captures_under_way.load(std::memory_order_acquire) == 0) return;
    mode_ = cudaStreamCaptureModeRelaxed;
    exchanged_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
  }
  ~RelaxedCaptureMode() {
    if (exchanged_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

// Binds the captures prepared on `d` whose streams have begun capturing since. PyTorch begins
// the capture after the begin hook and tells the allocator nothing more, so this runs before
// every allocation, drop and record_stream while one is pending.
void attach_prepared(DevicePool& d) {
  if (d.preparing.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(d.graphs_mutex);
  std::erase_if(d.to_attach, [](const std::shared_ptr<CapturePool>& pool) {
    return attach_capture_with_pool(pool);
  });
  d.preparing.store(static_cast<int>(d.to_attach.size()), std::memory_order_release);
}

void* allocate(ssize_t size, int device, cudaStream_t stream) {
  if (!wants_memory(size)) return nullptr;
  DevicePool& d = pool_of(device);
  const RelaxedCaptureMode relaxed;
  attach_prepared(d);
  std::error_code error;
  Buffer buffer =
      Buffer::try_alloc_async(d.pool, static_cast<std::size_t>(size), stream, error);
  if (error) {
    d.failed.fetch_add(1, std::memory_order_relaxed);
    if (error == Errc::out_of_memory) d.out_of_memory.fetch_add(1, std::memory_order_relaxed);
    throw Error(static_cast<Errc>(error.value()),
                "streampool: allocation of " + std::to_string(size) + " bytes on device " +
                    std::to_string(device));
  }
  void* ptr = buffer.data();
  Shard& shard = d.shard_of(ptr);
  std::lock_guard<std::mutex> lock(shard.mutex);
  shard.buffers.emplace(ptr, std::move(buffer));  // on bad_alloc the buffer is dropped
  return ptr;
}

// The device whose pool handed `ptr` out and the buffer, taken out of its shard; empty if none.
Buffer take(void* ptr, int device_hint) noexcept {
  const auto take_from = [ptr](DevicePool* d) -> Buffer {
    if (d == nullptr) return {};
    Shard& shard = d->shard_of(ptr);
    std::lock_guard<std::mutex> lock(shard.mutex);
    const auto found = shard.buffers.find(ptr);
    if (found == shard.buffers.end()) return {};
    Buffer buffer = std::move(found->second);
    shard.buffers.erase(found);
    return buffer;
  };
  Buffer buffer = take_from(existing(device_hint));
  for (int i = 0; buffer.is_empty() && i < max_devices; ++i) {
    if (i != device_hint) buffer = take_from(existing(i));
  }
  return buffer;
}

// The stream route 2's capture segments are allocated on. [d.graphs_mutex]
cudaStream_t segment_stream_of(DevicePool& d) {
  if (d.segment_stream != nullptr) return d.segment_stream;
  const int ordinal = d.pool.device().ordinal();
  StreamFactory streams;
  {
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    streams = t.streams;
  }
  cudaStream_t made = nullptr;
  if (streams) {
    made = streams(ordinal);
  } else {
    int current = 0;
    throw_on_cuda_error(cudaGetDevice(&current), "segment stream: cudaGetDevice");
    throw_on_cuda_error(cudaSetDevice(ordinal), "segment stream: cudaSetDevice");
    const cudaError_t status = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
    cudaSetDevice(current);
    throw_on_cuda_error(status, "segment stream: cudaStreamCreateWithFlags");
  }
  d.segment_stream = made;
  return made;
}

void* allocate_segment(ssize_t size, int device, cudaStream_t stream) {
  if (!wants_memory(size)) return nullptr;
  DevicePool& d = pool_of(device);
  CaptureStatus status = CaptureStatus::none;
  throw_on_cuda_error(d.pool.device().capture_info(stream, &status, nullptr),
                      "segment allocation: cudaStreamGetCaptureInfo");
  // Inside a capture PyTorch began: the segment is the graph's private pool's, which PyTorch's
  // cache keeps until it releases that pool, after the graph. It is allocated on a stream with
  // no work, so that it is clean (a range that stream waited for would be safe only after it:
  // hence no cross_stream_wait), in relaxed mode and with the capture noticed, so that the pool
  // makes no call that the capture refuses, up to the end of this function (a drop on the
  // failure path below included).
  std::optional<RelaxedCaptureMode> relaxed;
  std::optional<CaptureNotice> notice;
  cudaStream_t on = stream;
  if (status == CaptureStatus::active) {
    if (d.pool.options().cross_stream_wait) {
      throw Error(Errc::invalid_value,
                  "segment allocation during a capture: not with cross_stream_wait (the segment "
                  "could wait for another stream that the graph is not ordered after)");
    }
    relaxed.emplace(true);
    notice.emplace(CaptureMode::relaxed);
    std::lock_guard<std::mutex> lock(d.graphs_mutex);
    on = segment_stream_of(d);
  }
  void* ptr = allocate(size, device, on);  // takes graphs_mutex itself when a capture is prepared
  if (ptr == nullptr) return nullptr;
  try {
    std::lock_guard<std::mutex> lock(d.graphs_mutex);
    // Room for every live segment in the list of those whose free waits for a trim, so that a
    // free never needs host memory (geometrically: this runs once per segment).
    std::vector<Buffer>& list = d.released_segments;
    const std::size_t need = list.size() + d.live_segments + 1;
    if (need > list.capacity()) list.reserve(std::max(need, 2 * list.capacity()));
    ++d.live_segments;
  } catch (...) {
    Buffer unused = take(ptr, device);  // never handed out: nothing used it
    throw;
  }
  return ptr;
}

// An allocation entry point's result: null on failure, the reason in last_error.
void* null_on_failure(void* (*allocate_with)(ssize_t, int, cudaStream_t), ssize_t size, int device,
                      cudaStream_t stream) noexcept {
  try {
    return allocate_with(size, device, stream);
  } catch (const Error& e) {
    fail(e.what(), e.errc() == Errc::out_of_memory);
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("streampool: allocation failed");
  }
  return nullptr;
}

}  // namespace

void reset_for_tests(DeviceFactory factory, const PoolOptions& options, StreamFactory streams) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (auto& slot : t.pools) delete slot.exchange(nullptr);
  t.factory = std::move(factory);
  t.streams = std::move(streams);
  t.options = options;
  captures_under_way.store(0);
}

}  // namespace streampool::torch_layer

using namespace streampool;
using namespace streampool::torch_layer;

extern "C" {

void* streampool_torch_alloc(ssize_t size, int device, cudaStream_t stream) {
  return null_on_failure(allocate, size, device, stream);
}

void* streampool_torch_alloc_or_throw(ssize_t size, int device, cudaStream_t stream) {
  try {
    return allocate(size, device, stream);
  } catch (const std::exception& e) {
    throw std::runtime_error(e.what());
  }
}

void streampool_torch_free(void* ptr, ssize_t /*size*/, int device, cudaStream_t stream) {
  if (ptr == nullptr) return;
  const RelaxedCaptureMode relaxed;
  if (DevicePool* d = existing(device)) {
    try {
      attach_prepared(*d);
    } catch (const std::exception& e) {
      fail(e.what());  // the drop goes on: a capture that cannot be asked is lost anyway
    }
  }
  Buffer buffer = take(ptr, device);
  if (buffer.is_empty()) return;
  if (stream != buffer.stream()) {
    // Freed on another stream than it was allocated on: its last use is ordered before the work
    // enqueued on `stream` so far.
    try {
      buffer.record_stream(stream);
    } catch (const std::exception& e) {
      fail(e.what());  // the drop still waits for the buffer's own stream
    }
  }
  buffer.reset();
}

void* streampool_torch_segment_alloc(ssize_t size, int device, cudaStream_t stream) {
  return null_on_failure(allocate_segment, size, device, stream);
}

void streampool_torch_segment_free(void* ptr, ssize_t /*size*/, int device,
                                   cudaStream_t /*stream*/) {
  if (ptr == nullptr) return;
  DevicePool* d = existing(device);
  if (d == nullptr) return;
  try {
    // PyTorch frees a segment when it empties its cache, after waiting for its own events of the
    // segment's blocks, and counts on cudaFree to wait for the rest (a graph's replays among
    // them): so the device is synchronized before the segment goes back to the pool. During a
    // capture of route 1 that would break the capture: then at the next trim. The mutex is held
    // across the check and the synchronize, so that no capture of route 1 begins in between
    // (begin_allocate_to_pool counts it under the same mutex).
    std::lock_guard<std::mutex> lock(d->graphs_mutex);
    Buffer buffer = take(ptr, device);
    if (buffer.is_empty()) return;
    const bool idle = captures_under_way.load(std::memory_order_acquire) == 0 &&
                      d->pool.device().device_synchronize() == cudaSuccess;
    if (idle) {
      buffer.reset();
    } else {
      d->released_segments.push_back(std::move(buffer));  // room reserved: no allocation
    }
    if (d->live_segments > 0) --d->live_segments;
  } catch (const std::exception& e) {
    fail(e.what());  // before the segment was taken: it stays out of reuse, never early
  }
}

int streampool_torch_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return 0;  // an empty tensor's storage, as PyTorch's allocator does
  const RelaxedCaptureMode relaxed;
  for (int i = 0; i < max_devices; ++i) {
    DevicePool* d = existing(i);
    if (d == nullptr) continue;
    try {
      attach_prepared(*d);
      Shard& shard = d->shard_of(ptr);
      std::lock_guard<std::mutex> lock(shard.mutex);
      const auto found = shard.buffers.find(ptr);
      if (found == shard.buffers.end()) continue;
      found->second.record_stream(stream);
      return 0;
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  return fail("record_stream: not a pointer streampool_torch handed out");
}

size_t streampool_torch_stats_size(void) { return sizeof(streampool_torch_stats); }

int streampool_torch_get_stats(int device, streampool_torch_stats* out) {
  if (out == nullptr) return fail("stats: null output");
  std::memset(out, 0, sizeof(*out));
  DevicePool* d = existing(device);
  if (d == nullptr) return 1;
  try {
    const PoolStats s = d->pool.stats();
    out->requested_bytes_current = s.requested_bytes.current;
    out->requested_bytes_peak = s.requested_bytes.peak;
    out->requested_bytes_total = s.requested_bytes.total;
    out->reserved_bytes_current = s.reserved_bytes.current;
    out->reserved_bytes_peak = s.reserved_bytes.peak;
    out->reserved_bytes_total = s.reserved_bytes.total;
    out->live_allocations_current = s.live_allocations.current;
    out->live_allocations_peak = s.live_allocations.peak;
    out->live_allocations_total = s.live_allocations.total;
    out->segments = d->pool.breakdown().segments;
    out->cache_hits = s.cache_hits;
    out->cache_misses = s.cache_misses;
    out->device_allocations = s.device_allocations;
    out->device_frees = s.device_frees;
    out->fences_recorded = s.fences_recorded;
    out->cross_stream_reuses = s.cross_stream_reuses;
    out->blocking_fallbacks = s.blocking_fallbacks;
    out->oom_retries = s.oom_retries;
    out->growth_waits = s.growth_waits;
    out->failed_allocations = d->failed.load(std::memory_order_relaxed);
    out->out_of_memory = d->out_of_memory.load(std::memory_order_relaxed);
    const std::size_t limit = d->limit->limit();
    out->reserved_limit = limit == ReservedLimit::none ? 0 : limit;
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

int streampool_torch_trim(int device) {
  // One trim at a time: each drops the deferred segments its own synchronize covered.
  static std::mutex trimming;
  std::lock_guard<std::mutex> one(trimming);
  if (captures_under_way.load(std::memory_order_acquire) != 0) {
    return fail("trim: skipped while a capture is under way");
  }
  int result = 0;
  for (int i = 0; i < max_devices; ++i) {
    if (device >= 0 && i != device) continue;
    DevicePool* d = existing(i);
    if (d == nullptr) continue;
    try {
      {
        // Route 2's segments freed when the device could not be synchronized: dropped once it
        // was, those freed before the synchronize began (the list keeps its room).
        std::size_t waiting = 0;
        {
          std::lock_guard<std::mutex> lock(d->graphs_mutex);
          waiting = d->released_segments.size();
        }
        if (waiting > 0) {
          const cudaError_t status = d->pool.device().device_synchronize();
          if (status != cudaSuccess) throw Error(status, "trim: cudaDeviceSynchronize");
          std::lock_guard<std::mutex> lock(d->graphs_mutex);
          auto& list = d->released_segments;
          for (std::size_t k = 0; k < waiting; ++k) list[k].reset();
          list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(waiting));
        }
      }
      std::vector<std::shared_ptr<CapturePool>> released;
      {
        std::lock_guard<std::mutex> lock(d->graphs_mutex);
        released.swap(d->released);
      }
      if (!released.empty()) {
        // PyTorch releases a graph's pool before it destroys the graph, and replays may still
        // run: its memory goes back to the shared cache only once the device is idle.
        const cudaError_t status = d->pool.device().device_synchronize();
        if (status != cudaSuccess) {
          std::lock_guard<std::mutex> lock(d->graphs_mutex);
          d->released.insert(d->released.end(), released.begin(), released.end());
          throw Error(status, "trim: cudaDeviceSynchronize");
        }
        released.clear();
      }
      d->pool.trim(0);
    } catch (const std::exception& e) {
      result = fail(e.what());
    }
  }
  return result;
}

int streampool_torch_grant_access(int device, int peer) {
  try {
    pool_of(device).pool.grant_access(peer);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

int streampool_torch_set_memory_fraction(double fraction, int device) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return fail("set_memory_fraction: the fraction must be in (0, 1]");
  }
  try {
    DevicePool& d = pool_of(device);
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    throw_on_cuda_error(d.pool.device().mem_get_info(&free_bytes, &total_bytes),
                        "set_memory_fraction: cudaMemGetInfo");
    d.limit->set_limit(fraction >= 1.0 ? ReservedLimit::none
                                       : static_cast<std::size_t>(
                                             fraction * static_cast<double>(total_bytes)));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

int streampool_torch_begin_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second,
                                            cudaStream_t stream) {
  try {
    DevicePool& d = pool_of(device);
    const RelaxedCaptureMode relaxed;
    std::lock_guard<std::mutex> lock(d.graphs_mutex);
    GraphPool& graph = d.graphs[{id_first, id_second}];
    if (graph.pool == nullptr) graph.pool = std::make_shared<CapturePool>(d.pool);
    // Relaxed: every call of ours into the pool runs in relaxed mode (RelaxedCaptureMode).
    try {
      prepare_capture_with_pool(graph.pool, stream, CaptureMode::relaxed);
    } catch (...) {
      if (graph.uses == 0) d.graphs.erase({id_first, id_second});
      throw;
    }
    ++graph.uses;
    graph.capturing = true;
    d.to_attach.push_back(graph.pool);
    d.preparing.store(static_cast<int>(d.to_attach.size()), std::memory_order_release);
    captures_under_way.fetch_add(1, std::memory_order_acq_rel);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

int streampool_torch_end_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second) {
  DevicePool* d = existing(device);
  if (d == nullptr) return fail("end_allocate_to_pool: no pool of that device");
  std::lock_guard<std::mutex> lock(d->graphs_mutex);
  const auto found = d->graphs.find({id_first, id_second});
  if (found == d->graphs.end()) return fail("end_allocate_to_pool: no capture with that pool");
  GraphPool& graph = found->second;
  if (!graph.capturing) return fail("end_allocate_to_pool: that pool is not capturing");
  std::erase(d->to_attach, graph.pool);
  d->preparing.store(static_cast<int>(d->to_attach.size()), std::memory_order_release);
  detach_capture_with_pool(graph.pool);
  graph.capturing = false;
  captures_under_way.fetch_sub(1, std::memory_order_acq_rel);
  return 0;
}

int streampool_torch_release_pool(int device, uint64_t id_first, uint64_t id_second) {
  DevicePool* d = existing(device);
  if (d == nullptr) return fail("release_pool: no pool of that device");
  try {
    std::lock_guard<std::mutex> lock(d->graphs_mutex);
    const auto found = d->graphs.find({id_first, id_second});
    if (found == d->graphs.end()) return fail("release_pool: no such pool");
    if (--found->second.uses > 0) return 0;
    // Kept until the next trim: see there.
    d->released.push_back(std::move(found->second.pool));
    d->graphs.erase(found);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

const char* streampool_torch_last_error(void) { return last_error.c_str(); }

int streampool_torch_last_error_was_out_of_memory(void) { return last_out_of_memory ? 1 : 0; }

}  // extern "C"
