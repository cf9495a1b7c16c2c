// CaptureBinding: a CapturePool's private memory, and the capture it is bound to.
//
// Private memory is a set of ranges taken from the MemoryPool's arena (clean: no pending work),
// cut into pieces as captures allocate. A piece dropped during a capture is reusable in that
// capture only on the stream that dropped it (stream order within the graph); once the capture
// ends, on any stream of a later capture (graphs sharing a pool replay in stream order).
//
// Owners (reference count): the CapturePool, each live block cut from it, and the capture under
// way. The last reference returns adopted blocks and private ranges to the MemoryPool; it is
// always dropped at a safe point (never inside a CUDA user-object destructor).
#pragma once

#include "../pool/pool_core.hpp"

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace streampool::detail {

class CaptureBinding {
 public:
  explicit CaptureBinding(PoolCore& core) noexcept : core_(core) {}
  CaptureBinding(const CaptureBinding&) = delete;
  CaptureBinding& operator=(const CaptureBinding&) = delete;

  void ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  // The last reference returns everything to the MemoryPool and deletes the binding.
  void unref() noexcept;

  PoolCore& core() const noexcept { return core_; }

  // Takes at least `bytes` more private memory from the MemoryPool.
  void reserve(std::size_t bytes, std::error_code& error) noexcept;
  std::size_t reserved_bytes() const noexcept;
  std::size_t free_bytes() const noexcept;

  // An allocation during the capture, on stream `s`. The block holds a reference.
  Block* allocate(StreamState& s, std::size_t bytes, std::error_code& error) noexcept;
  // A private block dropped (its counters already updated by the pool).
  void release(Block* block) noexcept;
  // A block of the shared cache dropped on a bound stream during the capture: the graph may use
  // it, so it stays out of the cache until the binding goes.
  void adopt(Block* block) noexcept;

  // The capture under way, if any [mutex_ for writes; `capturing` read by the pool].
  struct Capture {
    bool active = false;
    CaptureId id = 0;
    CaptureMode mode = CaptureMode::global;
    cudaStream_t stream = nullptr;
    StreamState* origin = nullptr;
    std::thread::id thread;
  };
  Capture capture() const noexcept;
  void set_capture(const Capture& capture) noexcept;
  // The capture ended: pieces dropped in it become free for any stream of a later capture.
  void end_capture() noexcept;

  std::atomic<bool> sealed{false};

 private:
  ~CaptureBinding();

  struct Piece {
    std::size_t size;
    StreamState* dropped_on;  // null: free for any stream
  };
  void insert_piece(std::byte* ptr, Piece piece);  // [mutex_], coalesces with equal neighbours

  PoolCore& core_;
  std::atomic<int> refs_{1};
  mutable std::mutex mutex_;
  Capture capture_;
  std::vector<Block*> ranges_;
  std::map<std::byte*, Piece> free_;
  std::vector<Block*> adopted_;
};

}  // namespace streampool::detail
