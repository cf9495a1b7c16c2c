// CaptureBinding: a CapturePool's private memory, and the capture it is bound to.
//
// Private memory is a set of ranges taken clean from the MemoryPool's arena, cut into pieces as
// captures allocate. A piece never spans two ranges (two device allocations). A piece dropped
// during a capture, on the capture's stream, is reusable in that capture only on that stream
// (stream order within the graph); once the capture ends, in any later capture (graphs sharing a
// pool replay in stream order). A piece dropped outside a capture may still be used by ordinary
// work: it keeps the needs of that use, and a capture takes it only once they are covered; its
// range goes back to the MemoryPool with them. A shared block dropped on the captured stream
// during the capture is adopted: kept, with the needs of its uses before the capture (a fence
// recorded on the stream just before it began), until the binding goes. So is another binding's
// piece, which then goes back to that binding (take_back) rather than to the MemoryPool.
//
// Owners (reference count): the CapturePool, each live piece, and the capture under way. The
// binding keeps the MemoryPool's core alive; its last reference returns what it holds to the core.
#pragma once

#include "../pool/pool_core.hpp"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace streampool {
class CapturePool;
}

namespace streampool::detail {

class CaptureBinding {
 public:
  explicit CaptureBinding(PoolCore& core) noexcept;
  CaptureBinding(const CaptureBinding&) = delete;
  CaptureBinding& operator=(const CaptureBinding&) = delete;

  void ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  // Holders: the CapturePool, and each binding that keeps this one (keep_binding), whose graphs
  // may use what this one adopted. When the last lets go, no graph can use the adopted blocks
  // any more: they go (release_adopted), and so do the bindings this one kept.
  void hold() noexcept { holders_.fetch_add(1, std::memory_order_relaxed); }
  void unhold() noexcept;
  // The last reference returns everything to the core and deletes the binding.
  void unref() noexcept;

  PoolCore& core() const noexcept { return core_; }

  // Takes at least `bytes` more private memory from the core.
  void reserve(std::size_t bytes, Failure& error) noexcept;
  std::size_t reserved_bytes() const noexcept;
  std::size_t free_bytes() const noexcept;

  // An allocation during the capture, on stream `s`. The block holds a reference.
  Block* allocate(StreamState& s, std::size_t bytes, Failure& error) noexcept;
  // A private piece dropped on `stream` (the gate's take_drop), still counted live.
  void drop_piece(Block* block, cudaStream_t stream,
                  UseSpan uses) noexcept;
  // A shared block dropped during the capture on the captured stream, or on another that
  // record_stream named the captured stream for (uses[captured] is the captured stream's use),
  // or on a stream that joined the capture (captured = no_origin: no use is the captured
  // stream's), still counted live: kept until the binding goes.
  // Another binding's private piece is adopted the same way, and given back to that binding
  // (take_back) when this one goes. `now`: the capture as the caller saw it when it chose this
  // binding (asked again, it may have ended on another thread meanwhile, and its fence from
  // before it began would be missed: found in review, 2026-12-07).
  static constexpr std::size_t no_origin = static_cast<std::size_t>(-1);
  struct Capture;
  void adopt(Block* block, UseSpan uses, const Capture& now, std::size_t captured = 0) noexcept;
  // One of this binding's pieces that another binding adopted, given back with the needs of its
  // uses (counted dropped already); `listed` false: its uses are unknown, and its range goes back
  // stranded. Drops the piece's reference.
  void take_back(Block* block, std::vector<Need> needs, bool listed) noexcept;
  // Gives up the adopted blocks, each to the MemoryPool or to the binding whose piece it is: when
  // the last holder lets go (unhold), and at the binding's end.
  void release_adopted() noexcept;
  // Queues the CapturePools kept for graphs launched into its captures (keep_alive) for release
  // at the next safe point: likewise.
  void release_kept_pools() noexcept;
  // Both, and lets the bindings it keeps (keep_binding) go: when the last holder lets go.
  void no_graph_left() noexcept;

  // The capture under way, if any.
  struct Capture {
    bool active = false;
    CaptureId id = 0;
    CaptureMode mode = CaptureMode::global;
    cudaStream_t stream = nullptr;
    StreamState* origin = nullptr;
    std::thread::id thread;  // the capturing thread, as the capture guard counts it
    Need before;  // covers the stream's work enqueued before the capture began
    std::uint64_t token = 0;  // the capturing thread's this_thread_token()
    std::uint64_t note = 0;   // note_capture_begin's, for its end (capture_guard.hpp)
    // Whether this thread names the capture's stream by its handle, and so can ask CUDA about it:
    // all but cudaStreamPerThread on another thread than the capturing one (there it names that
    // thread's own stream).
    bool named_here() const noexcept;
  };
  Capture capture() const noexcept;
  // Whether `stream`, as this thread names it, is in this binding's capture now, asked of CUDA:
  // between a framework's own cudaStreamEndCapture and detach_capture_with_pool the binding still
  // has the capture, and another thread's cudaStreamPerThread names another stream. True where
  // CUDA cannot tell (what the pool then does keeps the memory longer, never shorter).
  // `unknown` (if given) is set where CUDA could not tell.
  bool captures(cudaStream_t stream, bool* unknown = nullptr) const noexcept;
  // Claims the binding for a capture about to begin; false when another has it.
  bool claim() noexcept;
  void unclaim() noexcept;
  void set_capture(const Capture& capture) noexcept;
  // The capture ended: pieces dropped in it become free for any stream of a later capture.
  void end_capture() noexcept;
  // Before a capture (nothing can be asked of the device during one): learns which pieces'
  // pending uses have completed.
  void learn() noexcept;

  std::atomic<bool> sealed{false};

  // Keeps a CapturePool whose graph a capture of this binding launched, once, as long as the
  // binding. When the binding goes, its references are queued to be dropped at the next safe
  // point (queue_release): dropping a CapturePool may run its owners' destructors and make device
  // calls, and the binding may go inside a buffer's drop, or during another capture.
  void keep_alive(const std::shared_ptr<CapturePool>& pool);
  // Keeps `other` (a binding made before this one: serial() lower) as long as this binding, so
  // that a block `other` adopted, which this binding's captures may use too, stays out of the
  // pool until both have gone. Only an older binding is kept, so no two keep each other. False
  // (nothing kept) on host out of memory.
  bool keep_binding(CaptureBinding* other) noexcept;
  // The order the bindings were made in (unique over the program's life).
  std::uint64_t serial() const noexcept { return serial_; }

 private:
  ~CaptureBinding();

  struct Piece {
    std::size_t size;
    const Block* range;         // the private range it lies in
    StreamState* dropped_on;    // dropped in the capture under way: reusable only there
    std::vector<Need> needs;    // dropped outside a capture: uses that may still be pending
  };
  const Block* range_of(const std::byte* ptr) const noexcept;   // [mutex_]
  void insert_piece(std::byte* ptr, Piece piece);               // [mutex_], merges neighbours

  PoolCore& core_;
  const std::uint64_t serial_;
  std::atomic<int> refs_{1};
  std::atomic<int> holders_{1};  // hold()
  mutable std::mutex mutex_;
  bool claimed_ = false;  // [mutex_]
  Capture capture_;       // [mutex_]
  std::vector<Block*> ranges_;
  std::map<std::byte*, Piece> free_;
  std::vector<std::pair<Block*, std::vector<Need>>> adopted_;
  BlockList unfiled_;  // adopted blocks adopted_ found no memory for (their uses unknown) [mutex_]
  std::vector<std::shared_ptr<CapturePool>*> kept_;  // keep_alive's, each its own [mutex_]
  std::vector<CaptureBinding*> kept_bindings_;  // keep_binding's, each referenced [mutex_]
  bool lost_ = false;  // a piece's uses could not be kept: the ranges go back stranded [mutex_]
  // A need nothing covers: for a block whose uses could not be listed.
  static Need never() noexcept { return {&never_timeline_, 0}; }
  static inline const Timeline never_timeline_{};
};

}  // namespace streampool::detail
