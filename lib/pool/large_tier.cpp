#include "large_tier.hpp"

#include "pool_core.hpp"

#include <streampool/error.hpp>

#include <algorithm>

namespace streampool::detail {
namespace {
constexpr int waitable_scan = 64;  // cross_stream_wait: other streams' ranges examined
// Groups of clean ranges kept for other streams' homes (those of one home and one size, stepped
// over at once) that best_fit steps over before it gives up and lets the request grow in its own.
constexpr int foreign_scan = 64;
// Ranges best_fit looks at past a range before a hole for another of its segment (the clean
// ranges it steps over in other streams' homes not counted).
constexpr int growable_scan = 8;
// Large requests over which LargeTier counts the growths that moved memory between homes.
constexpr std::uint64_t move_window = 1024;
// Large requests (those that miss their stream's shelf) since a home's stream made its last,
// after which that stream counts as idle (kept_for_other). Eight streams taking turns (the test
// "streams that take turns ...") made 188 / 192 / 279 / 1195 mappings with 32 / 64 / 256 / 1024
// against 266 without homes; the pipeline workload replays at 1.285 from 64 up (1.298 at 32).
constexpr std::uint64_t idle_home_requests = 64;

// Whether a segment's home names a stream that is not retired.
bool live_home(const Timeline* home) noexcept {
  return home != nullptr && home->stream != nullptr &&
         (home->stream->attention.load(std::memory_order_relaxed) & retired) == 0;
}
}

LargeTier::LargeTier(PoolCore& pool, const PoolOptions& options) noexcept
    : pool_(pool), options_(options) {}

LargeTier::~LargeTier() {
  for (Block* b : spare_) delete b;
  for (const auto& segment : segments_) {
    for (Block* r = segment->first; r != nullptr;) {
      Block* next = r->after;
      delete r;
      r = next;
    }
  }
}

std::size_t LargeTier::round(std::size_t bytes, Failure& error) const noexcept {
  if (bytes > (std::size_t{1} << 50)) {  // no device has a PiB; also keeps the rounding exact
    error = Errc::out_of_memory;
    return 0;
  }
  const std::size_t rounding = options_.large_rounding;
  return (bytes + rounding - 1) / rounding * rounding;
}

Block* LargeTier::new_block() {
  if (!spare_.empty()) {
    Block* b = spare_.back();
    spare_.pop_back();
    *b = Block{};
    return b;
  }
  return new Block{};
}

void LargeTier::delete_block(Block* b) noexcept {
  try {
    spare_.push_back(b);
  } catch (const std::bad_alloc&) {
    delete b;
  }
}

bool LargeTier::normalize(Block* range) noexcept {
  if (range->need.timeline == nullptr) return true;
  if (!covered(range->need)) return false;
  const bool indexed = range->free && !range->is_slab;
  if (indexed) unindex(range);
  range->need = {};
  if (indexed) index(range);
  return true;
}

void LargeTier::index(Block* range) noexcept {
  range->free = true;
  try {
    if (range->need.timeline == nullptr) clean_.insert(range);
    else owned_.insert(range);
  } catch (const std::bad_alloc&) {
    ++unindexed_;  // lost to reuse for now (large_tier.hpp); nothing breaks
  }
}

void LargeTier::unindex(Block* range) noexcept {
  const std::size_t erased =
      range->need.timeline == nullptr ? clean_.erase(range) : owned_.erase(range);
  if (erased == 0) {
    STREAMPOOL_ASSERT(range->free && unindexed_ > 0);
    --unindexed_;
  }
}

Segment* LargeTier::home_of(const StreamState* s) const noexcept {
  // Homes are made only on virtual memory, where the segments are a few reservations (with
  // fixed segments there may be hundreds, and none is a home).
  if (s == nullptr || options_.stream_homes == 0 ||
      vm_.load(std::memory_order_relaxed) != Vm::on) {
    return nullptr;
  }
  for (const auto& segment : segments_) {
    if (segment->home == &s->timeline) return segment.get();
  }
  return nullptr;
}

void LargeTier::note_request(StreamState& s) noexcept {
  if (options_.stream_homes == 0) return;
  const std::uint64_t n = ++large_requests_;
  recent_[n % recent_requests] = &s.timeline;
  if (n % recent_requests == 0) {
    // Distinct streams among the last recent_requests, counted up to one past the limit.
    std::array<const Timeline*, recent_requests> seen{};
    std::size_t distinct = 0;
    for (const Timeline* t : recent_) {
      if (t == nullptr || std::find(seen.begin(), seen.begin() + distinct, t) !=
                              seen.begin() + distinct) {
        continue;
      }
      seen[distinct++] = t;
      if (distinct > options_.stream_homes) break;
    }
    if (distinct > options_.stream_homes) {
      crowded_until_ = std::max(crowded_until_, n + recent_requests);
    }
  }
  if (n % move_window == 0) {
    // Memory moved between homes at more than one growth in 32 large requests: homes cost more
    // device calls than they save memory (four streams of random sizes up to 8 MiB under
    // streampool-bench stress --fake: ~9,000 mappings in 10 s, against ~60 without homes).
    // Set aside for 16 windows, twice as long each time it happens again (up to 1024 windows)
    // before 16 windows in a row with homes and few moves.
    if (moves_ * 32 > move_window) {
      crowded_until_ = std::max(crowded_until_, n + (move_window << (4 + set_asides_)));
      set_asides_ = std::min<std::uint32_t>(set_asides_ + 1, 6);
      quiet_windows_ = 0;
    } else if (n >= crowded_until_ + move_window && ++quiet_windows_ == 16) {
      set_asides_ = 0;
    }
    moves_ = 0;
  }
  crowded_ = n < crowded_until_;
  if (Segment* home = home_of(&s)) home->home_active = n;
}

bool LargeTier::kept_for_other(const Segment& segment, const StreamState* s) const noexcept {
  if (!live_home(segment.home) || (s != nullptr && segment.home == &s->timeline)) return false;
  // More streams ask for large memory than there are homes: keeping ranges for some of them
  // would move memory by unmapping and mapping it again at nearly every growth (24 streams on 4
  // homes under streampool-bench stress: ~10,000 mappings in 12 s on the H200, ~120 without).
  if (crowded_) return false;
  // A stream that has not asked for large memory for a while leaves its home's free ranges to
  // the others: keeping them would move memory between homes by unmapping and mapping it again
  // (~100-170 us a move on the H200) where streams take turns.
  return large_requests_ - segment.home_active <= idle_home_requests;
}

std::size_t LargeTier::live_homes() const noexcept {
  std::size_t n = 0;
  for (const auto& segment : segments_) n += live_home(segment->home) ? 1 : 0;
  return n;
}

void LargeTier::set_home(Segment& segment, StreamState& s) noexcept {
  segment.home = &s.timeline;
  segment.home_active = large_requests_;
}

const Segment* LargeTier::claim_home(StreamState& s) noexcept {
  if (options_.stream_homes == 0) return nullptr;
  if (const Segment* home = home_of(&s)) return home;
  if (live_homes() >= options_.stream_homes) return nullptr;
  for (const auto& segment : segments_) {
    // No home, or a retired stream's (a timeline with no stream is never a home).
    if (segment->expandable && !live_home(segment->home)) {
      set_home(*segment, s);
      return segment.get();
    }
  }
  return nullptr;
}

namespace {
// best_fit's choice, fed the candidates in size order: the first range that lies before no hole,
// unless a range before a hole came first; then the first after it in that range's segment, among
// the next growable_scan; else that range before a hole.
struct Fit {
  Block* range = nullptr;
  Block* growable = nullptr;  // the first range met that lies just before a hole
  int seen = 0;               // ranges met after it

  // The next candidate; true when the choice is made.
  bool consider(Block* r) noexcept {
    const bool before_hole = r->after != nullptr && r->after->hole;
    if (growable == nullptr) {
      if (before_hole) {
        growable = r;
        return false;
      }
      range = r;
      return true;
    }
    if (!before_hole && r->segment == growable->segment) {
      range = r;
      return true;
    }
    return ++seen == growable_scan;
  }
  Block* chosen() const noexcept { return range != nullptr ? range : growable; }
};
}  // namespace

Block* LargeTier::best_fit(StreamState* s, std::size_t bytes, bool anywhere) noexcept {
  Block probe;
  probe.size = bytes;
  auto own = owned_.end();
  if (s != nullptr) {
    probe.need.timeline = &s->timeline;
    own = owned_.lower_bound(&probe);
  }
  auto clean = clean_.lower_bound(&probe);  // by size alone
  // A stream with a home takes no clean range from another's: its own memory grows instead, and
  // the other stream's stays where it frees it for itself (docs/design.md, "A reservation per
  // stream for large growths").
  // A home's ranges of one size lie together in clean_ (a segment's addresses are contiguous), so
  // all of those kept for another stream are stepped over at once: one stream that freed many
  // ranges costs a step per size, not per range.
  const bool homed = !anywhere && home_of(s) != nullptr;
  int stepped = 0;
  const auto next_clean = [&]() -> Block* {
    while (clean != clean_.end()) {
      const Block* r = *clean;
      if (!homed || !kept_for_other(*r->segment, s)) return *clean;
      if (stepped++ == foreign_scan) {
        clean = clean_.end();
        break;
      }
      Block past;  // the first range of r's size after r's segment, or the next size
      past.size = r->size;
      past.ptr = r->segment->base + r->segment->size;
      clean = clean_.lower_bound(&past);
    }
    return nullptr;
  };
  // s's own ranges and the clean ones in one walk by size, s's own first on a tie (it needs no
  // fence for anyone and leaves the clean one to every stream). A range before a hole is taken
  // only where no other range of its segment holds the request (Fit): a growth extends it in
  // place, so a request that fits elsewhere would spend what the next larger one could grow from
  // (docs/design.md, "The range before a hole last").
  Fit fit;
  for (;;) {
    Block* mine = own != owned_.end() && (*own)->need.timeline == &s->timeline ? *own : nullptr;
    Block* other = next_clean();
    if (mine == nullptr && other == nullptr) break;
    const bool take_mine = mine != nullptr && (other == nullptr || mine->size <= other->size);
    if (take_mine) ++own;
    else ++clean;
    if (fit.consider(take_mine ? mine : other)) break;
  }
  return fit.chosen();
}

void LargeTier::sweep() noexcept {
  for (auto it = owned_.begin(); it != owned_.end();) {
    Block* range = *it++;  // before normalize() takes it out of owned_
    normalize(range);
  }
}

void LargeTier::absorb_next(Block* range) noexcept {
  Block* next = range->after;
  range->size += next->size;
  range->after = next->after;
  if (next->after != nullptr) next->after->before = range;
  delete_block(next);
}

Block* LargeTier::split_at(Block* range, Block* piece, std::byte* at) noexcept {
  STREAMPOOL_ASSERT(range->ptr < at && at < range->ptr + range->size);
  piece->ptr = at;
  piece->size = static_cast<std::size_t>(range->ptr + range->size - at);
  piece->large = true;
  piece->segment = range->segment;
  piece->before = range;
  piece->after = range->after;
  if (range->after != nullptr) range->after->before = piece;
  range->after = piece;
  range->size -= piece->size;
  return piece;
}

Block* LargeTier::waitable(StreamState& s, std::size_t bytes) noexcept {
  // A range of another stream whose fence is recorded but pending is s's once s waits on it.
  if (!s.addressable()) return nullptr;
  int scanned = 0;
  for (auto it = owned_.begin(); it != owned_.end() && scanned < waitable_scan; ++it) {
    Block* range = *it;
    if (range->size < bytes || range->need.timeline == &s.timeline) continue;
    ++scanned;
    StreamState* owner = range->need.timeline->stream;
    if (owner == nullptr) continue;  // waits for a device synchronize: nothing to wait on
    const LegacyPermit wait(s.handle);
    if (!wait) return nullptr;
    owner->lock.lock();
    const Fence* fence = pool_.fence_at(*owner, range->need.index);
    const bool waited = fence != nullptr &&
                        pool_.device().stream_wait_event(s.handle, fence->event) == cudaSuccess;
    owner->lock.unlock();
    if (waited) return range;
  }
  return nullptr;
}

Block* LargeTier::extend_own(StreamState& s, std::size_t bytes, Need* had) noexcept {
  // One of s's own ranges with the clean ranges after it, if together they hold the request:
  // s may use its own at once and the clean ones anywhere. What is left over lies in the last
  // clean one taken, and stays clean.
  Block probe;
  probe.need.timeline = &s.timeline;
  const auto usable = [](const Block* r) {
    return r != nullptr && r->free && !r->is_slab && covered(r->need);
  };
  for (auto it = owned_.lower_bound(&probe); it != owned_.end() && (*it)->need.timeline == &s.timeline;
       ++it) {
    Block* own = *it;
    std::size_t run = own->size;
    for (const Block* next = own->after; run < bytes && usable(next); next = next->after) {
      run += next->size;
    }
    if (run < bytes) continue;
    unindex(own);
    if (had != nullptr) *had = own->need;
    while (own->size < bytes) {
      unindex(own->after);
      absorb_next(own);
    }
    own->need = {};  // the rest, if any, is the clean part
    return cut(own, bytes);
  }
  return nullptr;
}

// Only a tight fit (at most 1/8 more than asked) of another stream's: a looser one is a cut of
// memory that stream frees for itself, and the embedded pipeline workload, whose side stream's
// requests would cut the compute stream's freed ranges, grew from 1.670 to 1.731 reserved per
// requested byte with any fit taken, 1.718 with fits up to 1/2, 1.670 with 1/8 (fake device).
Block* LargeTier::tighter_owned(StreamState& s, std::size_t rounded) noexcept {
  if (owned_.empty()) return nullptr;
  const std::size_t tight = rounded + rounded / 8;
  const Block* mine = best_fit(&s, rounded);
  if (mine != nullptr && mine->size == rounded) return nullptr;  // exact: nothing is tighter
  std::size_t best = mine != nullptr ? mine->size : SIZE_MAX;
  Block* found = nullptr;
  Block probe;
  for (auto it = owned_.begin(); it != owned_.end();) {
    const Timeline* owner = (*it)->need.timeline;
    probe.need.timeline = owner;
    if (owner != &s.timeline && owner->stream != nullptr) {
      probe.size = rounded;
      probe.ptr = nullptr;
      const auto fit = owned_.lower_bound(&probe);
      Block* range = fit != owned_.end() && (*fit)->need.timeline == owner ? *fit : nullptr;
      if (range != nullptr && range->size < best && range->size <= tight) {
        if (covered(range->need)) {
          normalize(range);  // to the clean index, where best_fit finds it
          best = range->size;
          found = nullptr;
        } else if (range->need.index < owner->recorded.load(std::memory_order_acquire)) {
          best = range->size;
          found = range;
        }
      }
    }
    // On to the next owner's ranges.
    probe.size = SIZE_MAX;
    probe.ptr = reinterpret_cast<std::byte*>(UINTPTR_MAX);
    it = owned_.upper_bound(&probe);
  }
  return found;
}

Block* LargeTier::find_tight(StreamState& s, std::size_t rounded, Need* had) noexcept {
  StreamState* owner = nullptr;
  {
    std::lock_guard<CountedMutex> lock(mutex_);
    note_request(s);
    const Block* other = tighter_owned(s, rounded);
    if (other == nullptr) return find_locked(&s, rounded, had);
    owner = other->need.timeline->stream;
  }
  owner->lock.lock();
  pool_.refresh(*owner);
  owner->lock.unlock();
  std::lock_guard<CountedMutex> lock(mutex_);
  tighter_owned(s, rounded);  // moves the range to the clean index if its fence completed
  return find_locked(&s, rounded, had);
}

Block* LargeTier::find(StreamState* s, std::size_t rounded, Need* had) noexcept {
  std::lock_guard<CountedMutex> lock(mutex_);
  return find_locked(s, rounded, had);
}

Block* LargeTier::find_locked(StreamState* s, std::size_t rounded, Need* had,
                              bool anywhere) noexcept {
  Block* range = best_fit(s, rounded, anywhere);
  if (range == nullptr && s != nullptr) {
    if (Block* extended = extend_own(*s, rounded, had)) return extended;
  }
  if (range == nullptr) {
    sweep();  // other streams' ranges may be covered by now
    range = best_fit(s, rounded, anywhere);
  }
  if (range == nullptr && s != nullptr && options_.cross_stream_wait) range = waitable(*s, rounded);
  if (range == nullptr) return nullptr;
  return take(range, rounded, had);
}

bool LargeTier::may_map_now() const noexcept {
  return vm_.load(std::memory_order_acquire) == Vm::on && calls_allowed(Restricted::vm_map);
}

bool LargeTier::may_grow_now() const noexcept {
  return calls_allowed(Restricted::malloc) || may_map_now();
}

Block* LargeTier::grow(StreamState* s, std::size_t rounded, Need* had, bool* grew,
                       Failure& error) noexcept {
  if (grew != nullptr) *grew = false;
  // A stream with a home that cannot grow takes a clean range of another's home, as it would
  // without homes: homes place memory, they never make a request fail.
  const auto anywhere = [&]() -> Block* {
    if (s == nullptr || options_.stream_homes == 0) return nullptr;
    std::lock_guard<CountedMutex> lock(mutex_);
    Block* range = find_locked(s, rounded, had, /*anywhere=*/true);
    if (range != nullptr) error.clear();
    return range;
  };
  if (!may_grow_now()) {
    error = forbidden_now();
    return anywhere();
  }
  // One thread grows at a time (cudaMalloc is slow, and threads that missed together would each
  // add a segment): the arena's own mutex stays free meanwhile, so others allocate from it.
  std::unique_lock<CountedMutex> growing(growth_mutex_);
  // Held from the decision through the cudaMalloc below (gate.hpp, CallPermit).
  CallPermit malloc_permit;
  // At most one wait for s per growth (strands_own), made with growth_mutex_ released: other
  // growths (slabs of any stream, trim) go on while s's queued work drains.
  for (bool may_wait = s != nullptr;; may_wait = false) {
    if (Block* range = find(s, rounded, had)) return range;
    // The gate may have changed while this thread waited. While it forbids cudaMalloc, only
    // mappings into a reservation made before (grow_mapped makes no new one then).
    malloc_permit = CallPermit(Restricted::malloc);
    const bool may_malloc = static_cast<bool>(malloc_permit);
    if (!may_malloc && !may_map_now()) {
      error = forbidden_now();
      return anywhere();
    }
    if (!(may_malloc ? expandable() : vm_ == Vm::on)) break;
    bool stranded = false;
    Block* range = grow_mapped(s, rounded, had, grew, may_wait ? &stranded : nullptr, error);
    if (stranded) {
      malloc_permit.release();
      growing.unlock();
      wait_for_own(*s);
      growing.lock();
      continue;
    }
    if (range == nullptr && vm_ == Vm::on) range = anywhere();
    if (range != nullptr || vm_ == Vm::on || !may_malloc) return range;
    error.clear();  // the device turned out to lack virtual memory: segments as below
    break;
  }
  // Its bookkeeping first: nothing can fail once the pool holds the memory (prepare_segment).
  NewSegment fresh;
  if (!prepare_segment(fresh, error)) return nullptr;
  Device& device = pool_.device();
  std::size_t size = std::max(rounded, options_.segment_bytes);
  void* ptr = nullptr;
  cudaError_t status = device.malloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation && size > rounded) {
    size = rounded;  // a whole segment does not fit: the request alone may
    status = device.malloc(&ptr, size);
  }
  std::lock_guard<CountedMutex> lock(mutex_);
  if (status != cudaSuccess) {
    give_up(fresh);
    error = Failure::of(status, "cudaMalloc");  // cudaErrorMemoryAllocation: out_of_memory
    return nullptr;
  }
  Block* range = fresh.first;
  add_segment(std::move(fresh), static_cast<std::byte*>(ptr), size);
  pool_.count_device_allocation(size);
  if (grew != nullptr) *grew = true;
  return cut(range, rounded);
}

bool LargeTier::prepare_segment(NewSegment& fresh, Failure& error) noexcept {
  try {
    fresh.segment = std::make_unique<Segment>();
    std::lock_guard<CountedMutex> lock(mutex_);
    make_room_for_segment();
    fresh.first = new_block();
    return true;
  } catch (const std::bad_alloc&) {
    error = Errc::out_of_memory;
    return false;
  }
}

void LargeTier::give_up(NewSegment& fresh) noexcept {
  delete_block(fresh.first);
  fresh.first = nullptr;
}

Segment& LargeTier::add_segment(NewSegment&& fresh, std::byte* base, std::size_t size) noexcept {
  Block* first = fresh.first;
  Segment& segment = *fresh.segment;
  first->ptr = base;
  first->size = size;
  first->large = true;
  first->segment = &segment;
  segment.base = base;
  segment.size = size;
  segment.first = first;
  segments_.push_back(std::move(fresh.segment));  // prepare_segment made room: cannot throw
  return segment;
}

void LargeTier::make_room_for_segment() {
  // Geometrically: with fixed segments there may be hundreds.
  if (segments_.size() == segments_.capacity()) {
    segments_.reserve(std::max<std::size_t>(8, 2 * segments_.capacity()));
  }
}

Block* LargeTier::cut(Block* range, std::size_t bytes) noexcept {
  STREAMPOOL_ASSERT(range->size >= bytes);
  if (range->size - bytes >= options_.large_rounding) {
    Block* rest = nullptr;
    try {
      rest = new_block();
    } catch (const std::bad_alloc&) {
    }
    if (rest != nullptr) {
      split_at(range, rest, range->ptr + bytes);
      rest->need = range->need;
      index(rest);
    }
  }
  range->free = false;
  range->need = {};
  return range;
}

std::size_t LargeTier::put(Block* range, Need need) noexcept {
  std::lock_guard<CountedMutex> lock(mutex_);
  STREAMPOOL_ASSERT(!range->free || range->is_slab);  // not indexed
  std::size_t tainted = 0;
  range->need = need;
  // Merge with free neighbours: clean with clean, two ranges of one stream with the later need,
  // and a clean range into an owned neighbour at least as large (so that a stream's freed ranges
  // do not stay cut by the slivers between them; the clean part then waits for the owner's fence,
  // and is counted as the owner's unfenced bytes). A larger clean range stays apart: taken into
  // the owner's range it would be unusable to every other stream until that fence completes (the
  // clean rest of every segment was, under stream churn). Ranges of different streams stay apart
  // until they are covered.
  normalize(range);
  const auto mergeable = [&](Block* neighbour) {
    if (neighbour == nullptr || !neighbour->free || neighbour->is_slab) return false;
    normalize(neighbour);
    if (neighbour->need.timeline == range->need.timeline) return true;
    if (neighbour->need.timeline == nullptr) return neighbour->size <= range->size;
    if (range->need.timeline == nullptr) return range->size <= neighbour->size;
    return false;
  };
  // `keep` absorbs its right neighbour `gone`.
  // The merged range takes the later need: the part that had an earlier one (or none) now waits
  // longer, and is counted as tainted.
  const auto later = [](const Need& a, const Need& b) {
    return a.timeline == nullptr || (b.timeline != nullptr && b.index > a.index);
  };
  const auto absorb = [&](Block* keep, Block* gone) {
    if (later(keep->need, gone->need)) {
      if (keep->need.timeline != gone->need.timeline || keep->need.index != gone->need.index) {
        tainted += keep->size;
      }
      keep->need = gone->need;
    } else if (gone->need.timeline != keep->need.timeline || gone->need.index != keep->need.index) {
      tainted += gone->size;
    }
    absorb_next(keep);
  };
  while (mergeable(range->before)) {
    Block* left = range->before;
    unindex(left);
    absorb(left, range);
    range = left;
  }
  while (mergeable(range->after)) {
    Block* right = range->after;
    unindex(right);
    absorb(range, right);
  }
  range->is_slab = false;
  index(range);
  return range->need.timeline != nullptr ? tainted : 0;
}

void LargeTier::put_clean(const std::vector<Block*>& ranges) noexcept {
  for (Block* range : ranges) put(range, {});
}

void LargeTier::ask_owners(StreamState& s) noexcept {
  // Streams that own uncovered free ranges (other than s), and whether each has ranges no fence
  // covers yet.
  std::vector<std::pair<StreamState*, bool>> owners;
  try {
    std::lock_guard<CountedMutex> lock(mutex_);
    for (Block* range : owned_) {
      if (covered(range->need)) continue;
      StreamState* owner = range->need.timeline->stream;
      if (owner == nullptr || owner == &s) continue;
      const bool unfenced =
          range->need.index >= owner->timeline.recorded.load(std::memory_order_acquire);
      auto it = std::find_if(owners.begin(), owners.end(),
                             [owner](const auto& o) { return o.first == owner; });
      if (it == owners.end()) owners.emplace_back(owner, unfenced);
      else it->second = it->second || unfenced;
    }
  } catch (const std::bad_alloc&) {
    return;
  }
  for (auto [owner, unfenced] : owners) {
    owner->lock.lock();
    pool_.refresh(*owner);
    // Only the owner's own next call may record its fence.
    if (unfenced && (owner->attention.load(std::memory_order_relaxed) & retired) == 0) {
      owner->attention.fetch_or(wants_fence, std::memory_order_relaxed);
    }
    owner->lock.unlock();
  }
}

void LargeTier::coalesce_covered() noexcept {
  std::lock_guard<CountedMutex> lock(mutex_);
  const auto free_covered = [&](Block* r) {
    return r != nullptr && r->free && !r->is_slab && normalize(r);
  };
  for (const auto& segment : segments_) {
    for (Block* r = segment->first; r != nullptr; r = r->after) {
      if (!free_covered(r) || !free_covered(r->after)) continue;
      unindex(r);
      while (free_covered(r->after)) {
        unindex(r->after);
        absorb_next(r);
      }
      index(r);
    }
  }
}

std::size_t LargeTier::release_free_segments(std::size_t bytes_to_keep) noexcept {
  const CallPermit free_permit(Restricted::free);  // through every free and unmap below
  if (!free_permit) return 0;
  coalesce_covered();
  std::lock_guard<CountedMutex> growing(growth_mutex_);  // holes change only under it
  std::lock_guard<CountedMutex> lock(mutex_);
  Device& device = pool_.device();
  std::size_t released = release_unreleased();
  for (std::size_t i = 0; i < segments_.size();) {
    // Down to what is kept: no more memory goes back, but reservations with nothing mapped
    // (give-back emptied some) still do, as they hold no reserved bytes.
    const bool enough = static_cast<std::size_t>(pool_.stats_reserved()) <= bytes_to_keep;
    Segment& segment = *segments_[i];
    Block* range = segment.first;
    if (segment.expandable) {
      if (!enough) released += unmap_free(segment, bytes_to_keep, Kept{}).returned;
      // Nothing mapped: the addresses go back too.
      if (segment.mapped == 0 &&
          device.vm_unreserve(segment.base, segment.size) == cudaSuccess) {
        delete_block(range);
        segments_[i] = std::move(segments_.back());
        segments_.pop_back();
      } else {
        ++i;
      }
      continue;
    }
    if (enough) {
      ++i;
      continue;
    }
    const bool whole = range->free && !range->is_slab && range->size == segment.size &&
                       normalize(range);
    if (!whole || device.free(segment.base) != cudaSuccess) {
      ++i;
      continue;
    }
    unindex(range);
    delete_block(range);
    pool_.count_device_free(segment.size);
    released += segment.size;
    segments_[i] = std::move(segments_.back());
    segments_.pop_back();
  }
  return released;
}

void LargeTier::describe(PoolBreakdown& out) noexcept {
  std::lock_guard<CountedMutex> lock(mutex_);
  for (const auto& segment : segments_) {
    ++out.segments;
    out.segment_bytes +=
        static_cast<std::int64_t>(segment->expandable ? segment->mapped : segment->size);
    for (Block* r = segment->first; r != nullptr; r = r->after) {
      // A range in use (a slab among them) is its user's: only free ones are read.
      const auto bytes = static_cast<std::int64_t>(r->size);
      if (r->free && !r->is_slab) {
        ++out.free_ranges;
        (covered(r->need) ? out.free_clean_bytes : out.free_owned_bytes) += bytes;
        out.largest_free_range = std::max(out.largest_free_range, bytes);
      }
    }
  }
  // Unmapped, but still the pool's: the device refused to release them.
  for (const Mapping& m : unreleased_) out.segment_bytes += static_cast<std::int64_t>(m.size);
}

bool LargeTier::consistent() noexcept {
  std::lock_guard<CountedMutex> lock(mutex_);
  std::size_t indexed = 0;
  std::size_t unindexed = 0;
  for (const auto& segment : segments_) {
    std::byte* at = segment->base;
    const Block* previous = nullptr;
    std::size_t mapped = 0;
    for (const Block* r = segment->first; r != nullptr; r = r->after) {
      if (r->ptr != at || r->before != previous || r->segment != segment.get() || !r->large) {
        return false;
      }
      if (r->hole) {
        const auto offset = static_cast<std::size_t>(r->ptr - segment->base);
        if (!segment->expandable || r->free || offset % granule_ != 0 ||
            r->size % granule_ != 0 || (previous != nullptr && previous->hole)) {
          return false;
        }
      } else {
        mapped += r->size;
      }
      // A range in use is its user's: its need is not read here (it is written without this
      // mutex). That none is indexed follows from the count below: every free one is found in
      // the index of its need and in no other, or in neither (counted in unindexed_).
      if (r->free && !r->is_slab) {
        Block* const range = const_cast<Block*>(r);
        const bool clean = r->need.timeline == nullptr;
        const std::size_t in_clean = clean_.count(range);
        const std::size_t in_owned = owned_.count(range);
        if (in_clean + in_owned == 0) {
          ++unindexed;
        } else if (in_clean + in_owned != 1 || (clean ? in_clean : in_owned) != 1) {
          return false;
        } else {
          ++indexed;
        }
      }
      at += r->size;
      previous = r;
    }
    if (at != segment->base + segment->size) return false;
    // Homes: only an expandable segment has one, and no two segments have the same.
    if (segment->home != nullptr) {
      if (!segment->expandable) return false;
      for (const auto& other : segments_) {
        if (other != segment && other->home == segment->home) return false;
      }
    }
    if (segment->expandable) {
      std::size_t in_mappings = 0;
      std::size_t next = 0;  // where the next mapping may begin
      for (const Mapping& m : segment->mappings) {
        if (m.offset < next || m.size == 0 || m.size % granule_ != 0) return false;
        next = m.offset + m.size;
        in_mappings += m.size;
      }
      if (mapped != segment->mapped || in_mappings != mapped) return false;
    }
  }
  return indexed == clean_.size() + owned_.size() && unindexed == unindexed_;
}

}  // namespace streampool::detail
