// Fences: the policy that decides when a drop records one, and the idle events they reuse.
//
// A fence is an event recorded on a stream after blocks were dropped on it; one fence covers
// every block dropped on its stream before it. Recording one costs ~0.4 us on the H200, so the
// policy records as few as keep memory moving between streams and bounded when a stream goes.
#pragma once

#include "contention.hpp"
#include "stream_state.hpp"

#include <streampool/device.hpp>
#include <streampool/pool_options.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

namespace streampool::detail {

enum class FenceResult { recorded, synchronized, failed };

// When a drop records a fence on its stream (besides being asked by another stream).
struct FencePolicy {
  // Every drop records a fence, on one stream or many (PoolOptions::fence_every_free).
  bool every_free;
  // With several streams, a drop that brings the stream's unfenced bytes to at least this records
  // a fence (0: no bound in bytes).
  std::size_t unfenced_bytes;
  // A drop on a stream whose oldest unfenced drop is older than this records a fence (checked
  // every `clock_every` drops, and on slow paths).
  std::int64_t unfenced_ns;
  static constexpr std::uint32_t clock_every = 64;

  static FencePolicy from(const PoolOptions& options) noexcept;

  // The bound a stream gets, given whether the pool has seen more than one stream (or a stream
  // retire): a program on one stream needs no fence at all (unbounded, which also turns the time
  // bound off); with several, no bound in bytes is no_byte_bound, and the time bound holds.
  std::size_t limit(bool several_streams) const noexcept;
  static constexpr std::size_t unbounded = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t no_byte_bound = unbounded - 1;
};

// Idle fence events, kept because create + destroy costs ~0.4 us. Thread-safe.
class EventPool {
 public:
  explicit EventPool(Device& device) noexcept : device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  cudaEvent_t take() noexcept;  // null when none can be created
  void give(cudaEvent_t event) noexcept;
  // Hands over every idle event, for the caller to destroy (the pool's destruction).
  std::vector<cudaEvent_t> drain() noexcept;

 private:
  Device& device_;
  CountedMutex mutex_{contention::events};
  std::vector<cudaEvent_t> idle_;
};

// The steady clock in nanoseconds (the policy's time bound).
std::int64_t now_ns() noexcept;

}  // namespace streampool::detail
