#include "capture_binding.hpp"
#include "capture_gate.hpp"

#include <streampool/error.hpp>

#include <algorithm>

namespace streampool::detail {
namespace {
constexpr std::size_t piece_alignment = 256;          // what cudaMalloc guarantees
constexpr std::size_t growth = std::size_t{2} << 20;  // growth step during a capture
std::atomic<std::uint64_t> next_serial{1};
}

CaptureBinding::CaptureBinding(PoolCore& core) noexcept
    : core_(core), serial_(next_serial.fetch_add(1, std::memory_order_relaxed)) {
  core_.keep();
}

CaptureBinding::~CaptureBinding() {
  STREAMPOOL_ASSERT(holders_.load(std::memory_order_relaxed) == 0);
  no_graph_left();  // done by the last unhold already, unless that never came
  // Its own memory: every graph made with it is gone, its launches complete, and every piece is
  // dropped. What has uses nobody could list goes back stranded, until a device synchronize.
  for (Block* range : ranges_) {
    std::vector<Need> needs;
    bool listed = !lost_;  // lost_: some piece's uses are unknown, and so every range's
    try {
      for (const auto& [ptr, piece] : free_) {
        if (listed && piece.range == range) {
          needs.insert(needs.end(), piece.needs.begin(), piece.needs.end());
        }
      }
    } catch (const std::bad_alloc&) {
      listed = false;
    }
    if (listed) core_.return_range(range, std::move(needs));
    else core_.strand_range(range);
  }
  core_.let_go();  // last: it may destroy the core
}

void CaptureBinding::release_adopted() noexcept {
  // Nothing can use the blocks any more but the work that used them last: every graph made with
  // the binding is gone and its launches complete (CUDA releases a graph's user objects after
  // them; the CapturePool goes with the last of them). What has uses nobody could list waits for
  // a device synchronize (strand), which covers them all: each was enqueued before now.
  // Another binding's pieces go back to it, with the same needs (take_back). Here, once no
  // holder is left, and not at the binding's end: a binding stays while any of its pieces is
  // live, and two bindings each holding a piece of the other's would keep each other for good.
  std::vector<std::pair<Block*, std::vector<Need>>> adopted;
  BlockList unfiled;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    adopted.swap(adopted_);
    std::swap(unfiled, unfiled_);
  }
  for (auto& [block, needs] : adopted) {
    auto* const keeper = static_cast<CaptureBinding*>(block->keeper);
    if (keeper == nullptr) core_.announce_dropped(block, nullptr);
    core_.count_drop(block);
    const bool unlisted = std::any_of(needs.begin(), needs.end(), [](const Need& need) {
      return need.timeline == never().timeline;
    });
    if (keeper != nullptr) keeper->take_back(block, std::move(needs), !unlisted);
    else if (unlisted) core_.strand(block);
    else core_.settle(block, needs);
  }
  while (Block* block = unfiled.pop_front()) {  // counted dropped by adopt
    if (block->keeper != nullptr) {
      static_cast<CaptureBinding*>(block->keeper)->take_back(block, {}, false);
    } else {
      core_.strand(block);
    }
  }
}

bool CaptureBinding::keep_binding(CaptureBinding* other) noexcept {
  STREAMPOOL_ASSERT(other->serial() < serial_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(kept_bindings_.begin(), kept_bindings_.end(), other) != kept_bindings_.end()) {
    return true;
  }
  try {
    kept_bindings_.push_back(other);
  } catch (const std::bad_alloc&) {
    return false;
  }
  other->ref();
  other->hold();
  return true;
}

void CaptureBinding::release_kept_pools() noexcept {
  // The pools of graphs launched into its captures go at the next safe point. Not here: this may
  // run in a buffer's drop, or during another capture.
  std::vector<std::shared_ptr<CapturePool>*> kept;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kept.swap(kept_);
  }
  for (std::shared_ptr<CapturePool>* pool : kept) queue_release(pool);
}

void CaptureBinding::unhold() noexcept {
  if (holders_.fetch_sub(1, std::memory_order_acq_rel) == 1) no_graph_left();
}

void CaptureBinding::no_graph_left() noexcept {
  // No graph made with this binding, or with one that kept it, is left: none can launch the
  // graphs of the pools it keeps (else one of those, adopting a piece of this binding's, would
  // keep it, and it them, for good: found in review, 2026-12-07), nor use what it adopted, nor
  // what the older bindings it keeps adopted for its captures too.
  release_kept_pools();
  release_adopted();
  std::vector<CaptureBinding*> kept;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kept.swap(kept_bindings_);
  }
  for (CaptureBinding* binding : kept) {
    binding->unhold();
    binding->unref();
  }
}

void CaptureBinding::keep_alive(const std::shared_ptr<CapturePool>& pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const std::shared_ptr<CapturePool>* kept : kept_) {
    if (kept->get() == pool.get()) return;  // once: a capture a step would grow the list for good
  }
  auto reference = std::make_unique<std::shared_ptr<CapturePool>>(pool);
  kept_.push_back(reference.get());
  reference.release();  // the binding's now
}

void CaptureBinding::unref() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void CaptureBinding::reserve(std::size_t bytes, Failure& error) noexcept {
  error.clear();
  Block* range = core_.take_range(bytes, error);
  if (range == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    ranges_.push_back(range);
    insert_piece(range->ptr, {range->size, range, nullptr, {}});
  } catch (const std::bad_alloc&) {
    if (!ranges_.empty() && ranges_.back() == range) ranges_.pop_back();
    core_.return_range(range, {});
    error = Errc::out_of_memory;
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

const Block* CaptureBinding::range_of(const std::byte* ptr) const noexcept {
  for (const Block* range : ranges_) {
    if (ptr >= range->ptr && ptr < range->ptr + range->size) return range;
  }
  return nullptr;
}

void CaptureBinding::insert_piece(std::byte* ptr, Piece piece) {
  const auto joins = [&](const Piece& other) {
    return other.range == piece.range && other.dropped_on == piece.dropped_on;
  };
  auto next = free_.lower_bound(ptr);
  const bool with_next =
      next != free_.end() && ptr + piece.size == next->first && joins(next->second);
  auto prev = free_.end();
  if (next != free_.begin()) {
    const auto before = std::prev(next);
    if (before->first + before->second.size == ptr && joins(before->second)) prev = before;
  }
  // Everything that may throw comes first, so that a failure leaves the free pieces as they were
  // (a neighbour grown over the piece without its needs would be handed out early).
  std::vector<Need> needs;
  const auto append = [&needs](const std::vector<Need>& more) {
    needs.insert(needs.end(), more.begin(), more.end());
  };
  needs.reserve((prev != free_.end() ? prev->second.needs.size() : 0) + piece.needs.size() +
                (with_next ? next->second.needs.size() : 0));
  if (prev != free_.end()) append(prev->second.needs);
  append(piece.needs);
  if (with_next) append(next->second.needs);
  const std::size_t size = piece.size + (with_next ? next->second.size : 0);
  if (prev == free_.end()) {
    const auto it = free_.emplace_hint(next, ptr, Piece{size, piece.range, piece.dropped_on, {}});
    it->second.needs.swap(needs);
  } else {
    prev->second.size += size;
    prev->second.needs.swap(needs);
  }
  if (with_next) free_.erase(next);
}

Block* CaptureBinding::allocate(StreamState& s, std::size_t bytes, Failure& error) noexcept {
  if (sealed.load(std::memory_order_acquire)) {
    error = Errc::capture_pool_sealed;
    return nullptr;
  }
  const std::size_t size = (bytes + piece_alignment - 1) / piece_alignment * piece_alignment;
  Block* b = nullptr;
  try {
    b = new Block{};
  } catch (const std::bad_alloc&) {
    error = Errc::out_of_memory;
    return nullptr;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Best fit among the pieces this stream may use now: free for it, and no use pending
      // (during a capture nothing can be asked of the device, so only what is known counts).
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        const Piece& piece = it->second;
        if (piece.size < size || (piece.dropped_on != nullptr && piece.dropped_on != &s)) continue;
        if (!std::all_of(piece.needs.begin(), piece.needs.end(), covered)) continue;
        if (best == free_.end() || piece.size < best->second.size) best = it;
      }
      if (best != free_.end()) {
        std::byte* ptr = best->first;
        Piece piece = std::move(best->second);
        free_.erase(best);
        try {
          if (piece.size > size) {
            insert_piece(ptr + size, {piece.size - size, piece.range, piece.dropped_on, {}});
          }
        } catch (const std::bad_alloc&) {
          // the remainder is lost to reuse until the binding goes; nothing breaks
        }
        b->ptr = ptr;
        b->size = size;
        b->keeper = this;
        b->need = {nullptr, capture_.id};  // while live: the capture it was allocated in
        ref();
        return b;
      }
    }
    // Out of private memory: grow where CUDA allows the pool's growth now - cudaMalloc (a relaxed
    // capture), or, in any mode, mappings into the pool's expandable segments.
    if (attempt == 1 || !core_.large().may_grow_now()) break;
    Failure grow_error;
    reserve(std::max(size, growth), grow_error);
    if (grow_error) {
      // Exhausted, for the reason the growth gave (a device call's refusal is kept).
      delete b;
      error = Failure::with(Errc::capture_pool_exhausted, grow_error.cuda, grow_error.call);
      return nullptr;
    }
  }
  delete b;
  error = Errc::capture_pool_exhausted;
  return nullptr;
}

bool CaptureBinding::Capture::named_here() const noexcept {
  return stream != cudaStreamPerThread || token == this_thread_token();
}

bool CaptureBinding::captures(cudaStream_t stream, bool* unknown) const noexcept {
  const Capture now = capture();
  if (!now.active) return false;
  const GateStatus status = gate_status(core_.device(), stream);
  if (status.error != cudaSuccess) {
    if (unknown != nullptr) *unknown = true;
    return true;
  }
  return status.status == CaptureStatus::active && status.id == now.id;
}

void CaptureBinding::drop_piece(Block* b, cudaStream_t stream, UseSpan uses) noexcept {
  const Capture now = capture();
  // Dropped in the capture, on its stream, and only ever used by it (allocated in it, named by no
  // record_stream): only the graph uses it, in stream order. Anything else used it for real work:
  // its uses are fenced now (this drop names their streams), and what the capture's stream did
  // before the capture is covered by the fence recorded as it began. On its stream as this thread
  // names it, and while that stream is still in the capture (captures()).
  const bool in_capture =
      now.active && stream == now.stream && now.named_here() && captures(stream);
  const bool graph_only = in_capture && b->need.index == now.id && uses.size() <= 1;
  std::vector<Need> needs;
  bool listed = true;
  if (!graph_only) {
    // In the capture, the uses besides the capture's stream: none is none (fence_uses takes an
    // empty list as uses unknown, which only a device synchronize covers: found in review,
    // 2026-12-06).
    const UseSpan others = in_capture && !uses.empty() ? uses.subspan(1) : uses;
    listed = (in_capture && !uses.empty() && others.empty()) || core_.fence_uses(others, needs);
    if (listed && in_capture && now.before.timeline != nullptr) {
      try {
        needs.push_back(now.before);
      } catch (const std::bad_alloc&) {
        listed = false;
      }
    }
  }
  core_.count_drop(b);
  if (listed) {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      insert_piece(b->ptr, {b->size, range_of(b->ptr), in_capture ? now.origin : nullptr,
                            std::move(needs)});
    } catch (const std::bad_alloc&) {
      // the piece is lost to reuse until the binding goes, which strands its range
      lost_ = true;
    }
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    lost_ = true;  // its uses could not be listed: its range goes back stranded
  }
  delete b;
  unref();
}

void CaptureBinding::take_back(Block* b, std::vector<Need> needs, bool listed) noexcept {
  STREAMPOOL_ASSERT(b->keeper == this);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (listed) {
      try {
        insert_piece(b->ptr, {b->size, range_of(b->ptr), nullptr, std::move(needs)});
      } catch (const std::bad_alloc&) {
        lost_ = true;  // the piece is lost to reuse until the binding goes, which strands its range
      }
    } else {
      lost_ = true;  // its uses could not be listed: its range goes back stranded
    }
  }
  delete b;
  unref();
}

void CaptureBinding::adopt(Block* b, UseSpan uses, const Capture& now,
                           std::size_t captured) noexcept {
  std::vector<Need> needs;
  // The captured stream's work before the capture is covered by the fence recorded when the
  // capture began. The other uses are fenced now; a stream that joined the capture cannot be
  // (a fence there would be the graph's), so its need is that stream's next fence, recorded once
  // the capture has ended (fence_now).
  // (Other uses, where there are none, need nothing: fence_uses takes an empty list as uses
  // unknown, which only a device synchronize covers. Found in review, 2026-12-06: a block used by
  // the captured stream alone stayed parked until a trim synchronized the device.)
  const auto fence_others = [&](UseSpan others) {
    return others.empty() || core_.fence_uses(others, needs);
  };
  bool listed = captured == no_origin || uses.empty() ? core_.fence_uses(uses, needs)
                : captured == 0 ? fence_others(uses.subspan(1))
                                : fence_others(uses.first(captured)) &&
                                      fence_others(uses.subspan(captured + 1));
  try {
    // Its needs complete before it is filed: filed without never(), a block whose uses could not
    // be listed would go back with the needs of some of them only.
    if (!listed) needs.push_back(never());
    else if (now.before.timeline != nullptr) needs.push_back(now.before);
    std::lock_guard<std::mutex> lock(mutex_);
    adopted_.emplace_back(b, std::move(needs));
  } catch (const std::bad_alloc&) {
    // Cannot file it: held on a list that needs no memory until the binding goes (the graph may
    // use it), then stranded (another binding's piece: given back with its uses unknown).
    // Counted dropped now, as a filed block is counted live no longer either (a live block would
    // keep the core, and all its memory, for good).
    if (b->keeper == nullptr) core_.announce_dropped(b, nullptr);
    core_.count_drop(b);
    std::lock_guard<std::mutex> lock(mutex_);
    unfiled_.push_back(b);
  }
}

void CaptureBinding::learn() noexcept {
  std::vector<Need> pending;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [ptr, piece] : free_) {
      for (const Need& need : piece.needs) {
        if (!covered(need)) pending.push_back(need);
      }
    }
  } catch (const std::bad_alloc&) {
    return;
  }
  for (const Need& need : pending) core_.learn_covered(need);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [ptr, piece] : free_) std::erase_if(piece.needs, covered);
}

CaptureBinding::Capture CaptureBinding::capture() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return capture_;
}

bool CaptureBinding::claim() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (claimed_ || capture_.active) return false;
  claimed_ = true;
  return true;
}

void CaptureBinding::unclaim() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  claimed_ = false;
}

void CaptureBinding::set_capture(const Capture& capture) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_ = capture;
}

void CaptureBinding::end_capture() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_ = Capture{};
  claimed_ = false;
  // Pieces dropped in the capture become free for every stream: re-insert to coalesce them.
  std::map<std::byte*, Piece> pieces;
  pieces.swap(free_);
  for (auto& [ptr, piece] : pieces) {
    try {
      piece.dropped_on = nullptr;
      insert_piece(ptr, std::move(piece));
    } catch (const std::bad_alloc&) {
      lost_ = true;  // its needs are gone with it: its range goes back stranded
    }
  }
}

}  // namespace streampool::detail
