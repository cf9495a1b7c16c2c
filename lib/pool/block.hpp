// Blocks, the needs that keep them from other streams, and the intrusive lists of free blocks.
#pragma once

#include "checks.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

namespace streampool::detail {

struct StreamState;
struct Segment;
struct Slab;

// A sequence of fences: those recorded on one stream, or the pool's device synchronizes.
//
// Invariant: completed <= recorded. A fence's index is `recorded` before it was recorded; fence i
// has completed once completed > i. Both only grow, and are never reset, also when the stream's
// state is recycled for another stream: an index that was covered stays covered.
struct Timeline {
  std::atomic<std::uint64_t> recorded{0};   // fences recorded so far; the next one's index
  std::atomic<std::uint64_t> completed{0};  // every fence with a smaller index has completed
  StreamState* stream = nullptr;            // whose fences; null for the device's synchronizes
  // Where it sorts among timelines (LargeTier's ranges by owner): a stream state's creation
  // number, from 1; 0 for the others. Not its address, so that the same calls make the same
  // choices in every run.
  std::uint64_t order = 0;
};

// What must happen before a free block may go to a stream other than the one it is kept for:
// every use of it was enqueued before fence `index` of `timeline`. No timeline: the block is
// clean, no pending work uses it.
struct Need {
  const Timeline* timeline = nullptr;
  std::uint64_t index = 0;
};

// The one rule: a need is covered once its fence has completed (or it has none). Every decision
// that a free block may go to another stream is this function.
inline bool covered(const Need& need) noexcept {
  return need.timeline == nullptr ||
         need.index < need.timeline->completed.load(std::memory_order_acquire);
}

// Other streams named by record_stream, each with the generation of its state then: a state
// retired or recycled since no longer names that stream (see StreamState::generation).
struct RecordedStream {
  StreamState* state;
  std::uint32_t generation;
};

// The streams whose work may still use a dropped block: the drop's stream first, then those
// record_stream named. Most blocks have one, kept inline; `lost` when they could not be listed
// (no memory): then only a device synchronize covers them.
class Uses {
 public:
  Uses() = default;
  explicit Uses(RecordedStream one) noexcept : one_(one), count_(one.state != nullptr ? 1 : 0) {}
  // Takes `more` (the drop's stream already first in it).
  explicit Uses(std::unique_ptr<std::vector<RecordedStream>> more) noexcept
      : more_(std::move(more)) {}
  std::span<const RecordedStream> view() const noexcept {
    if (more_ != nullptr) return {more_->data(), more_->size()};
    return {&one_, count_};
  }

 private:
  RecordedStream one_{nullptr, 0};
  std::size_t count_ = 0;
  std::unique_ptr<std::vector<RecordedStream>> more_;
};
using UseSpan = std::span<const RecordedStream>;

// One range of device memory: a small block of a size class, carved from a slab, or a large range
// of the arena (a slab itself is a large range carved into small blocks).
//
// Invariants:
//   live     `free` is false and the block is on no list; `home` is the stream it was allocated
//            on and `home_generation` that state's generation then; `requested` > 0.
//   free     `need` says who may have it: a block on stream S's list, or a large range owned by
//            S, has need.timeline == &S.timeline (S may reuse it at once; others once covered) or
//            no timeline (clean); a parked block's needs are in its Parked entry; a block in the
//            depot, or a range nobody owns, is clean.
//
// Each block has cache lines of its own (128 bytes, 64-aligned): the blocks of one slab lie side
// by side in its vector but go to different streams, whose threads write them on their fast
// paths (free, need, requested, the list links), and a line shared by two threads' blocks was
// passed between their cores at every allocation and drop.
struct alignas(64) Block {
  std::byte* ptr = nullptr;
  std::size_t size = 0;       // bytes of the block or range
  std::uint32_t size_class = 0;
  bool large = false;         // a range of the arena (else a small block of a slab)
  bool free = true;
  bool is_slab = false;       // a large range carved into small blocks
  bool hole = false;          // addresses of an expandable segment with nothing mapped (never free)

  // While live.
  StreamState* home = nullptr;
  std::uint32_t home_generation = 0;
  std::size_t requested = 0;
  std::vector<RecordedStream>* recorded = nullptr;

  // While free.
  Need need;

  Block* next = nullptr;  // links of the free list the block is on
  Block* prev = nullptr;
  Slab* slab = nullptr;         // small blocks: the slab they were carved from
  Segment* segment = nullptr;   // large ranges: the device allocation they lie in
  Block* before = nullptr;      // large ranges: neighbours in address order within the segment
  Block* after = nullptr;
  // Memory a layer above the pool owns (the gate's layer): its drop goes to the
  // gate (gate.hpp), never to the pool's lists.
  void* keeper = nullptr;
};

static_assert(sizeof(Block) == 128 && alignof(Block) == 64);

// A doubly linked list of free blocks, newest at the head.
struct BlockList {
  Block* head = nullptr;
  Block* tail = nullptr;
  std::size_t count = 0;

  bool empty() const noexcept { return head == nullptr; }

  void push_front(Block* b) noexcept {
    b->prev = nullptr;
    b->next = head;
    if (head != nullptr) head->prev = b;
    else tail = b;
    head = b;
    ++count;
  }
  void push_back(Block* b) noexcept {
    b->next = nullptr;
    b->prev = tail;
    if (tail != nullptr) tail->next = b;
    else head = b;
    tail = b;
    ++count;
  }
  Block* pop_front() noexcept {
    Block* b = head;
    if (b == nullptr) return nullptr;
    STREAMPOOL_ASSERT(count > 0 && b->prev == nullptr);
    head = b->next;
    if (head != nullptr) head->prev = nullptr;
    else tail = nullptr;
    b->next = nullptr;
    --count;
    return b;
  }
  void remove(Block* b) noexcept {
    STREAMPOOL_ASSERT(count > 0);
    if (b->prev != nullptr) b->prev->next = b->next;
    else head = b->next;
    if (b->next != nullptr) b->next->prev = b->prev;
    else tail = b->prev;
    b->next = b->prev = nullptr;
    --count;
  }
};

static_assert(std::is_trivially_destructible_v<BlockList>);

// One stream's lists, one per size class, on cache lines no other allocation shares: the lists
// of another stream, allocated next to them, would otherwise share the first and the last line
// with them, which two threads' fast paths then write.
struct FreeListsDelete {
  void operator()(BlockList* lists) const noexcept {
    ::operator delete[](lists, std::align_val_t{64});
  }
};
using FreeLists = std::unique_ptr<BlockList[], FreeListsDelete>;
inline FreeLists make_free_lists(std::size_t classes) {
  const std::size_t bytes = (classes * sizeof(BlockList) + 63) / 64 * 64;
  auto* lists = static_cast<BlockList*>(::operator new[](bytes, std::align_val_t{64}));
  for (std::size_t c = 0; c < classes; ++c) new (lists + c) BlockList{};
  return FreeLists(lists);
}

}  // namespace streampool::detail
