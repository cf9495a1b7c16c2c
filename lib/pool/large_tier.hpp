// The large tier: the arena. Device segments, each an address-ordered list of ranges that tile
// it; free ranges indexed by size and served best-fit, split, and merged back with free
// neighbours. Slabs of the small tier and the ranges the gate's layer holds are ranges too.
//
// A free range is owned by a stream (its need is on that stream's timeline: usable there at
// once, elsewhere once covered) or clean. Two free neighbours merge when both are clean, when
// both are owned by the same stream (the merged range keeps the later need), or when a clean one
// is no larger than its owned neighbour; a larger clean range stays apart, usable by every stream.
//
// Two indexes: clean ranges by size, owned ones by owner and size. A request takes the tighter of
// its stream's best own fit and the best clean fit, each one lookup; owned ranges whose fences
// completed move to the clean index when they are next looked at, or when a request finds
// nothing (a sweep of the owned index, before growing).
//
// Invariants, under the arena mutex: a segment's ranges tile it exactly, in address order; every
// free range that is not a slab is in exactly one index, the clean one iff it has no need, and
// no range in use is in either.
#pragma once

#include "block.hpp"
#include "failure.hpp"

#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace streampool::detail {

class PoolCore;
struct StreamState;

// A device allocation of the arena.
struct Segment {
  std::byte* base = nullptr;
  std::size_t size = 0;
  Block* first = nullptr;
};

class LargeTier {
 public:
  LargeTier(PoolCore& pool, const PoolOptions& options) noexcept;
  ~LargeTier();  // the Block objects; the device memory is PoolCore's to free
  LargeTier(const LargeTier&) = delete;
  LargeTier& operator=(const LargeTier&) = delete;

  // A request's size in the arena (rounded to large_rounding), or 0 and out_of_memory when no
  // device could hold it.
  std::size_t round(std::size_t bytes, Failure& error) const noexcept;

  // A range of `rounded` bytes for stream `s` (null: one that is clean), without growing: s's
  // own, a covered one, or with cross_stream_wait one whose fence s then waits on. `had`, if
  // given, gets the need the range had.
  Block* find(StreamState* s, std::size_t rounded, Need* had) noexcept;
  // A range of `rounded` bytes from a new segment, for `s` as find() says. Threads grow one at a
  // time, and each looks again (find()) once its turn comes: a segment another thread just added
  // may serve it. Fails (out_of_memory, or forbidden_now() when calls_allowed() forbids device
  // allocation) without touching the arena. `grew`, if given, says whether it did grow.
  Block* grow(StreamState* s, std::size_t rounded, Need* had, bool* grew,
              Failure& error) noexcept;
  // Back to the arena, owned as `need` says (no timeline: clean). Returns the bytes of clean
  // neighbours it absorbed while its need is uncovered: they now wait for that need too, so they
  // count as the owner's unfenced bytes.
  std::size_t put(Block* range, Need need) noexcept;
  void put_clean(const std::vector<Block*>& ranges) noexcept;

  // Before growing for `s`: learns which fences of other owners of free ranges completed, and
  // asks those with unfenced ranges for a fence.
  void ask_owners(StreamState& s) noexcept;
  // Merges neighbouring free ranges that are all covered.
  void coalesce_covered() noexcept;
  // Returns wholly free, covered segments to the device until at most `bytes_to_keep` stay
  // reserved; the bytes returned.
  std::size_t release_free_segments(std::size_t bytes_to_keep) noexcept;

  // Every segment, for the pool's destruction, which sets a segment's base to null once the
  // device has it back. [no other thread]
  const std::vector<std::unique_ptr<Segment>>& segments() const noexcept { return segments_; }
  // Adds the arena's part of a breakdown: segments, free ranges.
  void describe(PoolBreakdown& out) noexcept;
  // Walks every segment (STREAMPOOL_EXPENSIVE_ASSERT).
  bool consistent() noexcept;

 private:
  struct BySize {
    bool operator()(const Block* a, const Block* b) const noexcept {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  struct ByOwner {
    bool operator()(const Block* a, const Block* b) const noexcept {
      if (a->need.timeline != b->need.timeline) {
        return std::less<const Timeline*>()(a->need.timeline, b->need.timeline);
      }
      return BySize()(a, b);
    }
  };
  // All [mutex_].
  Block* best_fit(StreamState* s, std::size_t rounded) noexcept;
  Block* waitable(StreamState& s, std::size_t rounded) noexcept;  // cross_stream_wait
  Block* extend_own(StreamState& s, std::size_t rounded, Need* had) noexcept;  // cut, or null
  void sweep() noexcept;  // covered owned ranges to the clean index
  // `range` takes in the range after it, which is free and in no index.
  void absorb_next(Block* range) noexcept;
  Block* cut(Block* range, std::size_t bytes) noexcept;  // rest indexed as free
  void index(Block* range) noexcept;
  void unindex(Block* range) noexcept;
  // An indexed range whose need is covered moves to the clean index; true when clean.
  bool normalize(Block* range) noexcept;
  Block* new_block();
  void delete_block(Block* b) noexcept;

  PoolCore& pool_;
  const PoolOptions& options_;
  std::mutex growth_mutex_;  // one device allocation at a time; taken before mutex_
  std::mutex mutex_;
  std::vector<std::unique_ptr<Segment>> segments_;
  std::set<Block*, BySize> clean_;
  std::set<Block*, ByOwner> owned_;
  std::vector<Block*> spare_;
};

}  // namespace streampool::detail
