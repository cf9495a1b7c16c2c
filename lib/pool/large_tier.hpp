// The large tier: the arena. Device segments, each an address-ordered list of ranges that tile
// it; free ranges indexed by size and served best-fit, split, and merged back with free
// neighbours. Slabs of the small tier and the ranges the gate's layer holds are ranges too.
//
// A free range is owned by a stream (its need is on that stream's timeline: usable there at
// once, elsewhere once covered) or clean. Two free neighbours merge when both are clean, when
// both are owned by the same stream (the merged range keeps the later need), or when a clean one
// is no larger than its owned neighbour; a larger clean range stays apart, usable by every stream.
//
// Two indexes: clean ranges by size, owned ones by owner and size. A request takes the tightest
// of its stream's own ranges and the clean ones, walked together by size, a range just before a
// hole last (best_fit; a first look also walks the owned index by owner for another stream's
// tight fit: find_tight); owned ranges whose fences completed move to the clean index when they
// are next looked at, or when a request finds nothing (a sweep of the owned index, before
// growing).
//
// Expandable segments (PoolOptions::expandable_segments, where the device has virtual memory
// management; expandable.cpp): a segment is then a reservation of addresses backed in part by
// mappings of physical memory. Its unmapped parts are holes: ranges in no index, never free, that
// growth maps (at the start of the hole after a free range the request can extend, so that the
// segment grows in place) and that release_free_segments makes of whole free, covered mappings.
// With PoolOptions::stream_homes, a stream's large growths map into a reservation of its own (its
// home), and its large requests take no clean range from the home of another live stream that
// asked for large memory lately: the streams' memory stays apart, as in a pool per stream, and
// moves between them as whole mappings (given back by one home, mapped by another), when a home's
// stream is idle, or when a growth fails.
//
// Invariants, under the arena mutex: a segment's ranges tile it exactly, in address order; every
// free range that is not a slab is in exactly one index, the clean one iff it has no need, and
// no range in use is in either; in an expandable segment the ranges that are not holes are
// exactly its mappings' bytes, its mappings are sorted by offset, apart, and each a whole number
// of granules (at least one), and holes begin and end at multiples of the granularity; only an
// expandable segment has a home, and no two segments have the same one.
#pragma once

#include "block.hpp"
#include "contention.hpp"
#include "failure.hpp"

#include <streampool/device.hpp>
#include <streampool/pool_options.hpp>
#include <streampool/pool_stats.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace streampool::detail {

class PoolCore;
struct StreamState;

// Physical memory mapped into an expandable segment: one vm_create, mapped whole.
struct Mapping {
  std::size_t offset = 0;  // from the segment's base
  std::size_t size = 0;
  VmHandle handle = 0;
};

// A device allocation of the arena, or (expandable) a reservation of addresses.
struct Segment {
  std::byte* base = nullptr;
  std::size_t size = 0;  // the allocation's bytes, or the reservation's
  Block* first = nullptr;
  bool expandable = false;
  std::size_t mapped = 0;          // expandable: the bytes of `mappings`
  std::vector<Mapping> mappings;   // expandable: by offset
  // Expandable: the stream whose large growths map here (its state's timeline, which passes to
  // the stream its state is recycled for), or none; and the tier's large-request clock at that
  // stream's last large request that missed its shelf. [LargeTier's mutex_]
  const Timeline* home = nullptr;
  std::uint64_t home_active = 0;
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
  // may serve it. Fails with out_of_memory, or forbidden_now() when calls_allowed() forbids device
  // allocation (what a failed growth mapped stays in the arena, free). `grew`, if given, says
  // whether it did grow.
  // While calls_allowed() forbids cudaMalloc, it still grows by mapping into the
  // holes of a reservation made before, once the pool knows it has virtual memory.
  // With stream homes, where s cannot grow (forbidden now, or the growth failed) it takes a
  // clean range that s's requests leave to another stream's home (kept_for_other), if one
  // fits, and returns that range (`grew` then says whether the failed growth mapped anything).
  Block* grow(StreamState* s, std::size_t rounded, Need* had, bool* grew,
              Failure& error) noexcept;
  // Whether grow() may make device calls now: cudaMalloc allowed, or mappings into a known
  // expandable segment (the gate's layer grows the memory it owns when this holds).
  bool may_grow_now() const noexcept;
  // Back to the arena, owned as `need` says (no timeline: clean). Returns the bytes of clean
  // neighbours it absorbed while its need is uncovered: they now wait for that need too, so they
  // count as the owner's unfenced bytes.
  std::size_t put(Block* range, Need need) noexcept;
  void put_clean(const std::vector<Block*>& ranges) noexcept;

  // find(&s, ...), but where another stream's own free range would fit the request tightly
  // (within 1/8), and more tightly than anything s may take now, it first learns whether that
  // stream's fence, if one was recorded, completed, so that s gets it (clean) rather than a cut of
  // a looser range (nothing asks for a fence here: ask_owners does, before growing). A
  // block freed on another stream than its own (as cudaFreeAsync allows) comes back to its stream
  // this way. One arena lock when s has an exact fit or no other stream's fence needs learning.
  Block* find_tight(StreamState& s, std::size_t rounded, Need* had) noexcept;
  // Before growing for `s`: learns which fences of other owners of free ranges completed, and
  // asks those with unfenced ranges for a fence.
  void ask_owners(StreamState& s) noexcept;
  // Merges neighbouring free ranges that are all covered.
  void coalesce_covered() noexcept;
  // Returns wholly free, covered segments to the device until at most `bytes_to_keep` stay
  // reserved; the bytes returned.
  std::size_t release_free_segments(std::size_t bytes_to_keep) noexcept;
  // Kernels of device `peer` may read and write every mapping from now on: those made so far
  // (vm_set_access for `peer`, one call per run of adjacent mappings) and every later one (its
  // bit joins the mask a growth gives vm_set_access). On a refusal, the mappings given access so
  // far keep it and later ones are not given it; the failure names the call. Memory from
  // cudaMalloc is the device's peer access (PoolCore::grant_access), not this.
  Failure grant(int peer) noexcept;

  // Every segment, for the pool's destruction. [no other thread]
  const std::vector<std::unique_ptr<Segment>>& segments() const noexcept { return segments_; }
  // Gives a segment's memory (and an expandable one's addresses) back to the device, each call
  // tried twice; true once all of it is back (its base is then null). [no other thread]
  bool return_segment(Segment& segment) noexcept;
  // Tries again to release the handles the device refused (unreleased_), counting what goes back;
  // the bytes released. [mutex_, or no other thread]
  std::size_t release_unreleased() noexcept;
  // No handle is waiting for release_unreleased(). [mutex_, or no other thread]
  bool all_released() const noexcept { return unreleased_.empty(); }
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
      const Timeline* x = a->need.timeline;
      const Timeline* y = b->need.timeline;
      if (x != y) {
        // None (a clean range, as consistent() asks of each) sorts with the timelines of no
        // stream, which have order 0.
        const std::uint64_t ox = x != nullptr ? x->order : 0;
        const std::uint64_t oy = y != nullptr ? y->order : 0;
        if (ox != oy) return ox < oy;
        return std::less<const Timeline*>()(x, y);
      }
      return BySize()(a, b);
    }
  };
  // All [mutex_].
  Block* find_locked(StreamState* s, std::size_t rounded, Need* had,
                     bool anywhere = false) noexcept;
  // Stream homes (PoolOptions::stream_homes). s's home, or null (s null, no home, or homes off).
  Segment* home_of(const StreamState* s) const noexcept;
  // Whether `segment` is kept for a stream other than s: the home of a stream that is not
  // retired and made a large request within the last idle_home_requests. s's large requests take
  // no clean range there while s has a home, and growths without a home map elsewhere first.
  bool kept_for_other(const Segment& segment, const StreamState* s) const noexcept;
  // Segments homed to streams that are not retired.
  std::size_t live_homes() const noexcept;
  // s's home; else a reservation with no home, or one whose stream retired, made s's while
  // fewer than stream_homes live streams have one; else null.
  const Segment* claim_home(StreamState& s) noexcept;
  void set_home(Segment& segment, StreamState& s) noexcept;
  // Counts a large request of s on the clocks above.
  void note_request(StreamState& s) noexcept;
  // The tightest of s's own ranges and the clean ones that holds `rounded`, a range just before
  // a hole last (a growth extends it in place): taken only where no other range of its segment
  // holds the request among the next few in size order (large_tier.cpp, growable_scan).
  // `anywhere`: also clean ranges in another stream's home (see home_of).
  Block* best_fit(StreamState* s, std::size_t rounded, bool anywhere = false) noexcept;
  Block* waitable(StreamState& s, std::size_t rounded) noexcept;  // cross_stream_wait
  // The tightest fit among other streams' own ranges that is tighter than best_fit(s)'s choice
  // (not always the tightest of s's: best_fit takes a range before a hole last) and within 1/8
  // of `rounded`, fenced but not known covered (null when best_fit(s) fits exactly);
  // those met that are covered move to the clean index on the way.
  Block* tighter_owned(StreamState& s, std::size_t rounded) noexcept;
  Block* extend_own(StreamState& s, std::size_t rounded, Need* had) noexcept;  // cut, or null
  void sweep() noexcept;  // covered owned ranges to the clean index
  // `range` takes in the range after it, which is free and in no index.
  void absorb_next(Block* range) noexcept;
  // The reverse: `piece` (a block fresh from new_block) becomes the addresses of `range` from
  // `at` on, linked after it; `range` keeps those before `at`. The piece's state (free, hole,
  // need, index) is the caller's to set. Returns `piece`.
  static Block* split_at(Block* range, Block* piece, std::byte* at) noexcept;
  Block* cut(Block* range, std::size_t bytes) noexcept;  // rest indexed as free
  // An indexed free range taken for a request of `rounded` bytes: out of its index, its need
  // into `had` (if given), cut. [mutex_]
  Block* take(Block* range, std::size_t rounded, Need* had) noexcept {
    if (had != nullptr) *had = range->need;
    unindex(range);
    return cut(range, rounded);
  }
  // A free range into clean_ or owned_ (by its need). Where the index finds no host memory the
  // range stays unindexed, counted in unindexed_: lost to reuse until it merges with a neighbour
  // or its segment goes, each of which unindexes it.
  void index(Block* range) noexcept;
  // A free range out of its index (or out of unindexed_'s count). Its need must be the one it
  // was indexed with.
  void unindex(Block* range) noexcept;
  // An indexed range whose need is covered moves to the clean index; true when clean.
  bool normalize(Block* range) noexcept;
  Block* new_block();
  void delete_block(Block* b) noexcept;
  // Room in segments_ for one more, so that adding a segment cannot throw. Segments are added
  // only under growth_mutex_ (grow, reserve), so the room stays until the caller adds its own.
  // [growth_mutex_, mutex_]
  void make_room_for_segment();
  // A growth's new segment: what its bookkeeping needs is taken before the device call
  // (prepare_segment, [growth_mutex_]), so that nothing can fail once the pool holds the memory:
  // giving it back then could be refused, and it would leak unknown to the pool. add_segment
  // makes `base`, `size` the segment, its first range `first`; give_up returns what was taken
  // when the device call failed. [growth_mutex_, mutex_]
  struct NewSegment {
    std::unique_ptr<Segment> segment;
    Block* first = nullptr;
  };
  bool prepare_segment(NewSegment& fresh, Failure& error) noexcept;
  Segment& add_segment(NewSegment&& fresh, std::byte* base, std::size_t size) noexcept;
  void give_up(NewSegment& fresh) noexcept;

  // Expandable segments (expandable.cpp).
  enum class Vm : std::uint8_t { unknown, on, off };
  struct Plan {
    Block* hole = nullptr;  // maps `bytes` at the start of this hole
    std::size_t bytes = 0;
  };
  // Addresses that give-back leaves mapped: the free range a plan extends, or none.
  struct Kept {
    const std::byte* begin = nullptr;
    const std::byte* end = nullptr;
    bool overlaps(const std::byte* b, const std::byte* e) const noexcept {
      return b < end && begin < e;
    }
  };
  static Kept kept_by(const Plan& plan) noexcept;
  // The range of a segment's list that holds `begin`, walking on from r (the range that held an
  // earlier address); and whether it is a free large range holding all of [.., end).
  template <class B>
  static B* range_holding(B* r, const std::byte* begin) noexcept {
    while (r->ptr + r->size <= begin) r = r->after;
    return r;
  }
  static bool free_through(const Block* r, const std::byte* end) noexcept {
    return r->free && !r->is_slab && r->ptr + r->size >= end;
  }
  bool expandable() noexcept;  // decided at the first growth [growth_mutex_]
  std::size_t mapping_limit() const noexcept;  // the bytes of one mapping, at most
  // Mappings into a known expandable segment are possible now (may_grow_now's second half).
  bool may_map_now() const noexcept;
  // With `stranded` given, returns null with *stranded true where it should wait for s first
  // (strands_own): grow() waits with growth_mutex_ released, then grows again.
  Block* grow_mapped(StreamState* s, std::size_t rounded, Need* had, bool* grew, bool* stranded,
                     Failure& error) noexcept;  // [growth_mutex_]
  // `alone`: map the whole request at a hole, extending nothing (after another thread took the
  // range a plan extended). Only the holes of `home` if given; else, with `spare_kept`, none of a
  // segment kept for another stream (kept_for_other).
  Plan plan_growth(StreamState* s, std::size_t rounded, bool alone, const Segment* home,
                   bool spare_kept) noexcept;  // [mutex_]
  // A new reservation, homed to `home` if given. [growth_mutex_]
  bool reserve(std::size_t rounded, StreamState* home, Failure& error) noexcept;
  // What the chunk whose calls failed left that is still the pool's (none, usually): a handle
  // the device refused to release (its memory), or a mapping it refused to unmap after refusing
  // its access (addresses that can be neither used nor mapped again).
  struct Leftover {
    Mapping unreleased;
    Mapping stuck;
  };
  // Maps plan.bytes in chunks; those mapped before a failure are kept in `out`, and what the
  // failed chunk left in `left`. [growth_mutex_]
  bool map(const Plan& plan, std::vector<Mapping>& out, Leftover& left, Failure& error) noexcept;
  // The hole's first bytes, now mapped, become a clean free range, merged with its clean
  // neighbours and indexed; returns it. [growth_mutex_, mutex_]
  Block* fill(Block* hole, std::vector<Mapping>& mappings, Block* rest) noexcept;
  // Keeps what a failed chunk left: an unreleased handle counted reserved until a trim releases
  // it; a stuck mapping as a range in use by nobody at the start of `hole` (the rest stays a
  // hole), counted reserved, unmapped again only at the pool's destruction. [growth_mutex_, mutex_]
  void keep_leftover(Block* hole, const Leftover& left) noexcept;
  // Cuts the first `bytes` of `hole` off; `rest` (a spare block) becomes the hole's remainder,
  // or is deleted where nothing remains. [growth_mutex_, mutex_]
  void split_hole(Block* hole, std::size_t bytes, Block* rest) noexcept;
  // Unmaps whole free, covered mappings until at most `bytes_to_keep` stay reserved, except any
  // that overlaps `kept`. [growth_mutex_, mutex_, a CallPermit of Restricted::free]
  struct Unmapped {
    std::size_t bytes = 0;     // unmapped: holes now
    std::size_t returned = 0;  // of those, back to the device (a handle it refused to release
                               // is still the pool's memory, counted reserved: unreleased_)
  };
  Unmapped unmap_free(Segment& segment, std::size_t bytes_to_keep, Kept kept) noexcept;
  // The whole mappings that lie each in one free range outside `kept` (what give-back may
  // unmap once their ranges are covered), found through the indexes: only a free range of a
  // granule or more can hold a mapping, and a cold pool grows hundreds of times, where a walk
  // of every mapping and range at each growth made growth quadratic. While a free range is left
  // unindexed (index() found no host memory), by the walk. A growth looks once, for the plan
  // it made, and asks strands_own and give_back_for with what it found: nothing (Unmappable{})
  // where the plan has no hole or a free is forbidden. Whether a free is allowed can change
  // after the look (another thread engages the gate), so both ask that again.
  // [growth_mutex_, mutex_]
  struct Unmappable {
    std::size_t whole = 0;      // the bytes of all of them
    std::size_t coverable = 0;  // of those in covered ranges
    bool own_pending = false;   // one of more than a granule in an uncovered range of `own`
    // Counts `m`, which lies wholly in the free range `r`, outside the kept range.
    void count(const Block& r, const Mapping& m, const Timeline* own,
               std::size_t granule) noexcept;
  };
  Unmappable unmappable(Kept kept, const Timeline* own) const noexcept;
  // The same, by walking every mapping and range of every segment. [growth_mutex_, mutex_]
  Unmappable walk_unmappable(Kept kept, const Timeline* own) const noexcept;
  // Before a growth maps plan.bytes: unmaps up to as much of the whole free mappings elsewhere
  // (not the free range the plan extends), so that the growth reuses memory fragmentation left
  // idle instead of adding to it; true when anything was unmapped (the holes changed: plan
  // again). `found`: unmappable() for the plan. [growth_mutex_, mutex_]
  bool give_back_for(const Plan& plan, const Unmappable& found, const StreamState* s) noexcept;
  // Whether waiting for s would let give_back_for unmap what this plan maps: a whole mapping of
  // more than one granule lies in a free range of s's own that no completed fence covers yet,
  // outside the range the plan extends, and the covered whole free mappings come to less than
  // plan.bytes. Until s's work is done give-back cannot unmap it, and a program on one stream
  // records no fence: it would stay mapped until trim or the out-of-memory ladder synchronized
  // the device. Single-granule mappings are the growths of small requests: moving them only
  // churns. `found`: unmappable() for the plan, with s's timeline as `own`.
  // [growth_mutex_, mutex_]
  bool strands_own(const Plan& plan, const Unmappable& found) const noexcept;
  // Waits for s's work so far (PoolCore::wait_for_stream), counted in s's growth_waits. With no
  // lock held. [no lock]
  void wait_for_own(StreamState& s) noexcept;

  PoolCore& pool_;
  const PoolOptions& options_;
  CountedMutex growth_mutex_{contention::growth};  // one device allocation at a time; before mutex_
  CountedMutex mutex_{contention::arena};
  std::vector<std::unique_ptr<Segment>> segments_;
  std::set<Block*, BySize> clean_;
  std::set<Block*, ByOwner> owned_;
  std::size_t unindexed_ = 0;  // free ranges in neither index (index() found no host memory)
  std::vector<Block*> spare_;
  // Large requests that missed their stream's shelf (find_tight): the clock by which a home's
  // stream counts as active. [mutex_]
  std::uint64_t large_requests_ = 0;
  // The streams of the last recent_requests of them (their distinct count is taken each time
  // the ring wraps); the growths that gave back memory of a home kept for another stream
  // (give_back_for) in the current window of move_window requests; and until which request
  // homes are set aside (crowded_: no home kept for its stream, growths anywhere), because more
  // than stream_homes distinct streams made the ring's requests, or too many growths of a
  // window moved memory between homes. [mutex_]
  static constexpr std::size_t recent_requests = 64;
  std::array<const Timeline*, recent_requests> recent_{};
  std::size_t moves_ = 0;
  std::uint64_t crowded_until_ = 0;
  std::uint32_t set_asides_ = 0;     // for moves, one after the other
  std::uint32_t quiet_windows_ = 0;  // with homes and few moves, since the last set-aside
  bool crowded_ = false;
  std::atomic<Vm> vm_{Vm::unknown};  // written under growth_mutex_; may_grow_now() reads it
  std::uint64_t peers_ = 0;  // devices grant() gave access to, bit d for d [growth_mutex_]
  std::size_t granule_ = 0;  // vm_granularity, once vm_ is on
  // Unmapped, but the device refused to release their handles: still counted reserved. [mutex_]
  std::vector<Mapping> unreleased_;
};

}  // namespace streampool::detail
