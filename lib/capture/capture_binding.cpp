#include "capture_binding.hpp"

#include "../pool/capture_guard.hpp"

#include <streampool/error.hpp>

namespace streampool::detail {
namespace {
constexpr std::size_t piece_alignment = 256;   // what cudaMalloc guarantees
constexpr std::size_t growth = std::size_t{2} << 20;  // relaxed-mode growth step
}

CaptureBinding::~CaptureBinding() {
  for (Block* b : adopted_) core_.release(b);
  for (Block* range : ranges_) core_.return_private(range);
}

void CaptureBinding::unref() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void CaptureBinding::reserve(std::size_t bytes, std::error_code& error) noexcept {
  error.clear();
  Block* range = core_.take_private(bytes, error);
  if (range == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    ranges_.push_back(range);
    insert_piece(range->ptr, {range->size, nullptr});
  } catch (const std::bad_alloc&) {
    core_.return_private(range);
    error = make_error_code(Errc::out_of_memory);
  }
}

std::size_t CaptureBinding::reserved_bytes() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t total = 0;
  for (const Block* range : ranges_) total += range->size;
  return total;
}

std::size_t CaptureBinding::free_bytes() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t total = 0;
  for (const auto& [ptr, piece] : free_) total += piece.size;
  return total;
}

void CaptureBinding::insert_piece(std::byte* ptr, Piece piece) {
  auto next = free_.lower_bound(ptr);
  if (next != free_.end() && ptr + piece.size == next->first &&
      next->second.dropped_on == piece.dropped_on) {
    piece.size += next->second.size;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size == ptr && prev->second.dropped_on == piece.dropped_on) {
      prev->second.size += piece.size;
      return;
    }
  }
  free_.emplace(ptr, piece);
}

Block* CaptureBinding::allocate(StreamState& s, std::size_t bytes, std::error_code& error) noexcept {
  if (sealed.load(std::memory_order_acquire)) {
    error = make_error_code(Errc::capture_pool_sealed);
    return nullptr;
  }
  const std::size_t size = (bytes + piece_alignment - 1) / piece_alignment * piece_alignment;
  Block* b = nullptr;
  try {
    b = new Block{};
  } catch (const std::bad_alloc&) {
    error = make_error_code(Errc::out_of_memory);
    return nullptr;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Best fit among the pieces this stream may use.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        const Piece& piece = it->second;
        if (piece.size < size || (piece.dropped_on != nullptr && piece.dropped_on != &s)) continue;
        if (best == free_.end() || piece.size < best->second.size) best = it;
      }
      if (best != free_.end()) {
        std::byte* ptr = best->first;
        const Piece piece = best->second;
        free_.erase(best);
        try {
          if (piece.size > size) insert_piece(ptr + size, {piece.size - size, piece.dropped_on});
        } catch (const std::bad_alloc&) {
          // the remainder is lost to reuse until the binding goes; nothing breaks
        }
        b->ptr = ptr;
        b->size = size;
        b->hold = this;
        ref();
        return b;
      }
    }
    // Out of private memory: grow only where CUDA allows a device allocation now.
    const bool relaxed = capture().mode == CaptureMode::relaxed;
    if (attempt == 1 || !relaxed || !unsafe_calls_allowed_here()) break;
    std::error_code grow_error;
    reserve(std::max(size, growth), grow_error);
    if (grow_error) break;
  }
  delete b;
  error = make_error_code(Errc::capture_pool_exhausted);
  return nullptr;
}

void CaptureBinding::release(Block* b) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      insert_piece(b->ptr, {b->size, capture_.active ? b->state : nullptr});
    } catch (const std::bad_alloc&) {
    }
  }
  delete b;
  unref();
}

void CaptureBinding::adopt(Block* b) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    adopted_.push_back(b);
  } catch (const std::bad_alloc&) {
    // Cannot hold it: leaking the block is the only safe choice (the graph may use it).
  }
}

CaptureBinding::Capture CaptureBinding::capture() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return capture_;
}

void CaptureBinding::set_capture(const Capture& capture) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_ = capture;
}

void CaptureBinding::end_capture() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_ = Capture{};
  // Pieces dropped in the capture become free for every stream: re-insert to coalesce them.
  std::map<std::byte*, Piece> pieces;
  pieces.swap(free_);
  for (auto& [ptr, piece] : pieces) {
    try {
      insert_piece(ptr, {piece.size, nullptr});
    } catch (const std::bad_alloc&) {
    }
  }
}

}  // namespace streampool::detail
