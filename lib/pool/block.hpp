// Blocks and the intrusive lists that hold free ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace streampool::detail {

struct StreamState;
struct Segment;
struct Slab;
class CaptureBinding;

// One range of device memory: a small block of a size class, carved from a slab, or a large range
// of the arena (a slab itself is a large range carved into small blocks).
//
// Invariants:
//   live block      on no list; `state` is the stream it was allocated on; `requested` > 0.
//   free, on a stream's list, or a large range owned by a stream: `state` is the stream it was
//                   last used on, `tag` the index of that stream's fence that covers its last use
//                   (every use was enqueued before the stream's fence number `tag` is recorded).
//                   Safe on `state` at once; safe elsewhere once that fence has completed
//                   (tag < state->completed).
//   free and clean  `state` is null: no pending work uses it (fresh memory, a completed fence, or
//                   a device synchronize since its last use). Safe anywhere.
struct Block {
  std::byte* ptr = nullptr;
  StreamState* state = nullptr;
  std::uint64_t tag = 0;
  Block* next = nullptr;  // links of the free list the block is on
  Block* prev = nullptr;
  std::size_t requested = 0;
  std::uint32_t size_class = 0;
  bool large = false;
  bool free = true;
  bool is_slab = false;         // a large range carved into small blocks
  std::size_t size = 0;         // bytes of the block or range

  Slab* slab = nullptr;         // small blocks: the slab they were carved from
  Segment* segment = nullptr;   // large ranges: the device allocation they lie in
  Block* before = nullptr;      // large ranges: neighbours in address order within the segment
  Block* after = nullptr;
  std::vector<StreamState*>* recorded = nullptr;  // other streams named by record_stream
  CaptureBinding* hold = nullptr;  // cut from a CapturePool's private memory
};

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
    if (b != nullptr) remove(b);
    return b;
  }
  void remove(Block* b) noexcept {
    if (b->prev != nullptr) b->prev->next = b->next;
    else head = b->next;
    if (b->next != nullptr) b->next->prev = b->prev;
    else tail = b->prev;
    b->next = b->prev = nullptr;
    --count;
  }
};

}  // namespace streampool::detail
