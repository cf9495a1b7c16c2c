// Expandable segments: the large tier on the driver's virtual memory management.
//
// A segment is a reservation of addresses (as large as the device's memory) that physical memory
// is mapped into as the arena needs it. Growth maps only what a request lacks, where it extends
// a free range the request may use (the clean range, or the requesting stream's own, just before
// a hole), so the arena grows in place instead of adding a segment beside a fragmented one; and
// release_free_segments unmaps whole mappings that lie in free, covered ranges, wherever they
// are, leaving holes that a later growth maps again; before it maps, a growth gives back such
// mappings itself, first waiting for its own stream where only that stream's pending work keeps
// one mapped (strands_own). docs/design.md says why and what it measured.
//
// A growth maps one physical allocation (several past 1 GiB, or past PoolOptions::mapping_bytes
// where that is set): one vm_create, vm_map and vm_set_access each. Holes change only under
// growth_mutex_ (growth, and release_free_segments, which takes it too), so a plan made under the
// arena mutex stays valid while the device calls run outside it; the free range before the hole
// may be taken meanwhile, in which case the request (which looks again under the lock that fills
// the hole) grows once more, by the whole request.
#include "large_tier.hpp"

#include "pool_core.hpp"

#include <streampool/error.hpp>

#include <algorithm>
#include <new>

namespace streampool::detail {
namespace {

std::size_t round_up(std::size_t bytes, std::size_t unit) noexcept {
  return (bytes + unit - 1) / unit * unit;
}

// When the device cannot say how large it is: the reservation's size.
constexpr std::size_t fallback_reservation = std::size_t{64} << 30;
constexpr int growth_attempts = 4;
// A growth maps one physical allocation of up to this (or segment_bytes, if larger): every
// mapping costs a cuMemCreate, cuMemMap and cuMemSetAccess, and 20 MiB chunks made replays of
// the traces on the H200 2.1-2.4x slower per event than cudaMalloc's segments.
// PoolOptions::mapping_bytes, where set, is the size instead.
constexpr std::size_t max_mapping = std::size_t{1} << 30;

// A call given a second chance: true when either succeeded.
template <class Call>
bool twice(Call&& call) noexcept {
  return call() == cudaSuccess || call() == cudaSuccess;
}

// A mapping whose handle the device refused to release, once unmapped: its memory is still the
// pool's (counted reserved), tried again at each trim and at the pool's destruction (lost, with
// its memory the device's, only when even the list cannot grow).
void keep_unreleased(std::vector<Mapping>& unreleased, const Mapping& mapping) noexcept {
  try {
    unreleased.push_back(mapping);
  } catch (const std::bad_alloc&) {
  }
}

}  // namespace

std::size_t LargeTier::mapping_limit() const noexcept {
  if (options_.mapping_bytes != 0) return round_up(options_.mapping_bytes, granule_);
  return round_up(std::max(options_.segment_bytes, max_mapping), granule_);
}

bool LargeTier::expandable() noexcept {
  if (vm_ == Vm::unknown) {
    std::size_t granule = 0;
    // nvtx_memory registers the pool's cudaMalloc segments with compute-sanitizer, and knows
    // nothing of mappings: it keeps fixed segments.
    const bool on = options_.expandable_segments && !options_.nvtx_memory &&
                    pool_.device().vm_granularity(&granule) == cudaSuccess && granule > 0 &&
                    (granule & (granule - 1)) == 0 && granule <= (std::size_t{1} << 30);
    granule_ = on ? granule : 0;
    vm_ = on ? Vm::on : Vm::off;
  }
  return vm_ == Vm::on;
}

LargeTier::Plan LargeTier::plan_growth(StreamState* s, std::size_t rounded, bool alone,
                                       const Segment* home, bool spare_kept) noexcept {
  // The free range just before a hole counts when the request may take it with what is mapped
  // after it: a clean one, or s's own (extend_own then joins them).
  const auto usable_before = [&](const Block* hole) -> std::size_t {
    const Block* left = hole->before;
    if (left == nullptr || !left->free || left->is_slab) return 0;
    if (covered(left->need) || (s != nullptr && left->need.timeline == &s->timeline)) {
      return left->size;
    }
    return 0;
  };
  Plan best;
  for (const auto& segment : segments_) {
    if (!segment->expandable || (home != nullptr && segment.get() != home) ||
        (home == nullptr && spare_kept && kept_for_other(*segment, s))) {
      continue;
    }
    for (Block* r = segment->first; r != nullptr; r = r->after) {
      if (!r->hole) continue;
      const std::size_t before = alone ? 0 : usable_before(r);
      std::size_t bytes = round_up(before < rounded ? rounded - before : 1, granule_);
      if (bytes > r->size) bytes = round_up(rounded, granule_);  // the hole alone, if it can
      if (bytes > r->size) continue;
      if (best.hole == nullptr || bytes < best.bytes) best = {r, bytes};
    }
  }
  return best;
}

bool LargeTier::reserve(std::size_t rounded, StreamState* home, Failure& error) noexcept {
  // A reservation is made where cudaMalloc is (gate.hpp): under its permit, through both calls.
  const CallPermit permit(Restricted::malloc);
  if (!permit) {
    error = forbidden_now();
    return false;
  }
  // Its bookkeeping first: nothing can fail once the addresses are reserved (prepare_segment).
  NewSegment fresh;
  if (!prepare_segment(fresh, error)) return false;
  Device& device = pool_.device();
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  std::size_t size = device.mem_get_info(&free_bytes, &total) == cudaSuccess && total > 0
                         ? total
                         : fallback_reservation;
  size = round_up(std::max(size, rounded), granule_);
  void* ptr = nullptr;
  const cudaError_t status = device.vm_reserve(&ptr, size);
  std::lock_guard<CountedMutex> lock(mutex_);
  if (status != cudaSuccess) {
    give_up(fresh);
    if (status == cudaErrorNotSupported) vm_ = Vm::off;
    error = Failure::of(status, "cuMemAddressReserve");
    return false;
  }
  Block* hole = fresh.first;
  hole->free = false;
  hole->hole = true;
  Segment& segment = add_segment(std::move(fresh), static_cast<std::byte*>(ptr), size);
  segment.expandable = true;
  if (home != nullptr && home_of(home) == nullptr) set_home(segment, *home);
  return true;
}

bool LargeTier::map(const Plan& plan, std::vector<Mapping>& out, Leftover& left,
                    Failure& error) noexcept {
  Device& device = pool_.device();
  const Segment& segment = *plan.hole->segment;
  const std::size_t chunk = mapping_limit();
  std::byte* const start = plan.hole->ptr;
  for (std::size_t done = 0; done < plan.bytes;) {
    if (!calls_allowed(Restricted::vm_map)) {  // never refused today (gate.hpp)
      error = forbidden_now();
      return false;
    }
    const std::size_t bytes = std::min(chunk, plan.bytes - done);
    std::byte* const at = start + done;
    VmHandle handle = 0;
    const char* call = "cuMemCreate";
    cudaError_t status = device.vm_create(&handle, bytes);
    if (status == cudaSuccess) {
      call = "cuMemMap";
      status = device.vm_map(at, bytes, handle);
      const Mapping made{static_cast<std::size_t>(at - segment.base), bytes, handle};
      if (status == cudaSuccess) {
        call = "cuMemSetAccess";
        status = device.vm_set_access(at, bytes, device.own_access() | peers_);
        if (status != cudaSuccess && !twice([&] { return device.vm_unmap(at, bytes); })) {
          left.stuck = made;
        }
      }
      if (status != cudaSuccess && left.stuck.size == 0 &&
          !twice([&] { return device.vm_release(handle); })) {
        left.unreleased = made;
      }
    }
    if (status != cudaSuccess) {
      if (status == cudaErrorNotSupported) vm_ = Vm::off;
      error = Failure::of(status, call);  // cudaErrorMemoryAllocation: out_of_memory
      return false;
    }
    // `out` has room: grow_mapped reserved it.
    out.push_back({static_cast<std::size_t>(at - segment.base), bytes, handle});
    done += bytes;
  }
  return true;
}

Block* LargeTier::fill(Block* hole, std::vector<Mapping>& mappings, Block* rest) noexcept {
  Segment& segment = *hole->segment;
  std::size_t bytes = 0;
  for (const Mapping& m : mappings) {
    bytes += m.size;
    pool_.count_device_allocation(m.size);
  }
  // Room was reserved before the calls (grow_mapped), so the insertion cannot throw.
  const auto at = std::upper_bound(segment.mappings.begin(), segment.mappings.end(),
                                   mappings.front().offset,
                                   [](std::size_t offset, const Mapping& m) {
                                     return offset < m.offset;
                                   });
  segment.mappings.insert(at, mappings.begin(), mappings.end());
  segment.mapped += bytes;
  split_hole(hole, bytes, rest);
  // A clean range, merged with clean neighbours only: an owned neighbour keeps its need (its
  // owner's request takes both through extend_own), as in put().
  Block* range = hole;
  range->hole = false;
  range->need = {};
  const auto clean = [&](Block* neighbour) {
    return neighbour != nullptr && neighbour->free && !neighbour->is_slab && normalize(neighbour);
  };
  while (clean(range->before)) {
    Block* left = range->before;
    unindex(left);
    absorb_next(left);
    range = left;
  }
  while (clean(range->after)) {
    unindex(range->after);
    absorb_next(range);
  }
  index(range);
  return range;
}

void LargeTier::split_hole(Block* hole, std::size_t bytes, Block* rest) noexcept {
  if (hole->size == bytes) {
    delete_block(rest);
    return;
  }
  split_at(hole, rest, hole->ptr + bytes);
  rest->free = false;
  rest->hole = true;
}

void LargeTier::keep_leftover(Block* hole, const Leftover& left) noexcept {
  if (left.unreleased.size != 0) {
    pool_.count_device_allocation(left.unreleased.size);
    keep_unreleased(unreleased_, left.unreleased);
  }
  const Mapping& stuck = left.stuck;
  if (stuck.size == 0) return;
  Segment& segment = *hole->segment;
  STREAMPOOL_ASSERT(hole->hole && hole->ptr == segment.base + stuck.offset &&
                    hole->size >= stuck.size);
  Block* rest = nullptr;
  try {
    rest = new_block();
  } catch (const std::bad_alloc&) {
    return;  // lost, with its memory and its addresses: only when the device refused 3 calls
  }
  split_hole(hole, stuck.size, rest);
  // In use, by nobody: never handed out, merged or unmapped by trim.
  hole->hole = false;
  hole->need = {};
  // Room was reserved before the calls (grow_mapped: one place per chunk).
  const auto at = std::upper_bound(segment.mappings.begin(), segment.mappings.end(), stuck.offset,
                                   [](std::size_t offset, const Mapping& m) {
                                     return offset < m.offset;
                                   });
  segment.mappings.insert(at, stuck);
  segment.mapped += stuck.size;
  pool_.count_device_allocation(stuck.size);
}

Block* LargeTier::grow_mapped(StreamState* s, std::size_t rounded, Need* had, bool* grew,
                              bool* stranded, Failure& error) noexcept {
  bool lost = false;  // another thread took the range the last plan extended
  bool homeless = false;  // a reservation of s's own could not be made: s grows anywhere
  for (int attempt = 0; attempt < growth_attempts; ++attempt) {
    Plan plan;
    Block* rest = nullptr;
    std::size_t chunks = 0;  // the mappings this growth makes, at most
    bool new_home = false;
    {
      std::lock_guard<CountedMutex> lock(mutex_);
      // Stream homes: s grows in its own reservation, which it claims (one with no home, or a
      // retired stream's) or makes while fewer than stream_homes live streams have one. Not
      // while more streams than that ask for large memory (crowded_): growths confined to
      // homes then moved memory between them at nearly every growth (give-back, then a mapping
      // in the home), where growing anywhere extends the free range that needs least.
      const bool homed = s != nullptr && !homeless && !crowded_;
      const Segment* home = homed ? claim_home(*s) : nullptr;
      new_home = homed && home == nullptr && options_.stream_homes != 0 &&
                 live_homes() < options_.stream_homes;
      bool alone = lost;
      // In s's home; else (s has none, or no hole of its home holds the request) where no other
      // stream's home is, if a hole there holds it; else anywhere.
      const auto planned = [&] {
        Plan p = home != nullptr ? plan_growth(s, rounded, alone, home, false) : Plan{};
        if (p.hole == nullptr) p = plan_growth(s, rounded, alone, nullptr, true);
        return p.hole != nullptr ? p : plan_growth(s, rounded, alone, nullptr, false);
      };
      if (!new_home) {
        plan = planned();
        // No hole holds the whole request: extending is still better than a new reservation.
        if (alone && plan.hole == nullptr) {
          alone = false;
          plan = planned();
        }
        // What give-back could unmap for this plan: one look for both questions below.
        const Unmappable found =
            plan.hole != nullptr && calls_allowed(Restricted::free)
                ? unmappable(kept_by(plan), s != nullptr ? &s->timeline : nullptr)
                : Unmappable{};
        if (stranded != nullptr && s != nullptr && strands_own(plan, found)) {
          *stranded = true;  // grow() waits for s, with growth_mutex_ released, and comes back
          return nullptr;
        }
        if (give_back_for(plan, found, s)) plan = planned();
      }
      if (plan.hole != nullptr) {
        // What fill() needs, taken now so that nothing can fail once memory is mapped.
        try {
          chunks = (plan.bytes + mapping_limit() - 1) / mapping_limit();
          Segment& segment = *plan.hole->segment;
          // Geometrically: with small mappings (PoolOptions::mapping_bytes) a segment holds tens
          // of thousands, and an exact reserve would copy them all at every growth.
          const std::size_t need = segment.mappings.size() + chunks;
          if (need > segment.mappings.capacity()) {
            segment.mappings.reserve(std::max(need, 2 * segment.mappings.capacity()));
          }
          rest = new_block();
        } catch (const std::bad_alloc&) {
          error = Errc::out_of_memory;
          return nullptr;
        }
      }
    }
    if (new_home) {
      if (!reserve(rounded, s, error)) {
        if (vm_ != Vm::on) return nullptr;  // no virtual memory after all: segments, as below
        // Forbidden now (the gate allows no cudaMalloc-class call, so no new reservation), or
        // the device refused: grow where s may without a home.
        error.clear();
        homeless = true;
      }
      continue;
    }
    if (plan.hole == nullptr) {
      if (!reserve(rounded, nullptr, error)) return nullptr;
      continue;
    }
    const Segment* const grown_in = plan.hole->segment;
    std::vector<Mapping> mappings;
    try {
      mappings.reserve(chunks);
    } catch (const std::bad_alloc&) {
      std::lock_guard<CountedMutex> lock(mutex_);
      delete_block(rest);
      error = Errc::out_of_memory;
      return nullptr;
    }
    Leftover left;
    const bool mapped = map(plan, mappings, left, error);
    Block* range = nullptr;
    {
      std::lock_guard<CountedMutex> lock(mutex_);
      // Where the addresses of a chunk whose calls failed begin: what fill() leaves a hole.
      Block* const unfilled = mappings.empty() ? plan.hole : rest;
      Block* made = nullptr;  // what was mapped stays, also after a failure
      if (mappings.empty()) delete_block(rest);
      else made = fill(plan.hole, mappings, rest);
      keep_leftover(unfilled, left);
      // Under the same lock: no other thread's request can take what this growth mapped (under
      // churn on the H200, threads that looked again after unlocking lost it to each other and
      // retried through the out-of-memory ladder). The range it made, where it holds the
      // request: a search might give up before reaching it (best_fit's foreign_scan). Else (s's
      // own range before it is what it extended) a search; where s's requests would not look (a
      // home of another's, when s's own had no hole for it), this one looks anyway: it mapped
      // there for s.
      STREAMPOOL_ASSERT(!mapped || made != nullptr);
      if (mapped && made->size >= rounded) {
        range = take(made, rounded, had);
      } else if (mapped) {
        range = find_locked(s, rounded, had, /*anywhere=*/grown_in != home_of(s));
      }
    }
    if (!mappings.empty() && grew != nullptr) *grew = true;
    if (!mapped) return nullptr;
    if (range != nullptr) return range;
    // What it mapped joined nothing large enough: the free range before the hole was taken
    // meanwhile. Mapping the whole request next time cannot lose the same way (under churn on
    // the H200, growths that extended again lost again and ran the out-of-memory ladder).
    lost = true;
  }
  error = Errc::out_of_memory;
  return nullptr;
}

bool LargeTier::give_back_for(const Plan& plan, const Unmappable& found,
                              const StreamState* s) noexcept {
  // No walk for nothing, nor where a free is forbidden now: another thread may have engaged the
  // gate since the look (which found nothing where the gate forbade the free).
  if (found.coverable == 0) return false;
  const CallPermit permit(Restricted::free);  // through every unmap below
  if (!permit) return false;
  STREAMPOOL_ASSERT(plan.hole != nullptr);
  const Kept kept = kept_by(plan);
  const auto reserved = static_cast<std::size_t>(std::max<std::int64_t>(0, pool_.stats_reserved()));
  const std::size_t keep = reserved > plan.bytes ? reserved - plan.bytes : 0;
  std::size_t unmapped = 0;
  bool moved = false;  // memory of a home kept for another stream
  for (const auto& segment : segments_) {
    if (!segment->expandable) continue;
    if (static_cast<std::size_t>(pool_.stats_reserved()) <= keep) break;
    const std::size_t here = unmap_free(*segment, keep, kept).bytes;
    moved = moved || (here > 0 && s != nullptr && segment.get() != plan.hole->segment &&
                      kept_for_other(*segment, s));
    unmapped += here;
  }
  if (moved) ++moves_;
  return unmapped > 0;
}

bool LargeTier::strands_own(const Plan& plan, const Unmappable& found) const noexcept {
  // The free as well as the wait: the give-back that the wait is for is a free (as above).
  return found.own_pending && found.coverable < plan.bytes &&
         calls_allowed(Restricted::event_wait) && calls_allowed(Restricted::free);
}

void LargeTier::Unmappable::count(const Block& r, const Mapping& m, const Timeline* own,
                                  std::size_t granule) noexcept {
  whole += m.size;
  if (covered(r.need)) {
    coverable += m.size;
  } else if (m.size > granule && r.need.timeline == own) {
    own_pending = true;
  }
}

LargeTier::Unmappable LargeTier::unmappable(Kept kept, const Timeline* own) const noexcept {
  if (unindexed_ != 0) return walk_unmappable(kept, own);  // rare: host memory ran out
  Unmappable found;
  const auto look = [&](const Block* r) {
    const Segment& segment = *r->segment;
    if (!segment.expandable) return;
    const auto from = static_cast<std::size_t>(r->ptr - segment.base);
    const std::size_t to = from + r->size;
    auto m = std::lower_bound(segment.mappings.begin(), segment.mappings.end(), from,
                              [](const Mapping& mapping, std::size_t offset) {
                                return mapping.offset < offset;
                              });
    for (; m != segment.mappings.end() && m->offset + m->size <= to; ++m) {
      const std::byte* const begin = segment.base + m->offset;
      if (!kept.overlaps(begin, begin + m->size)) found.count(*r, *m, own, granule_);
    }
  };
  // The clean index orders its ranges by size, the owned one by owner, then size: each from its
  // first of a granule on.
  Block probe;
  probe.size = granule_;
  for (auto it = clean_.lower_bound(&probe); it != clean_.end(); ++it) look(*it);
  for (auto it = owned_.begin(); it != owned_.end();) {
    if ((*it)->size >= granule_) {
      look(*it++);
      continue;
    }
    probe.need.timeline = (*it)->need.timeline;  // past this owner's smaller ranges
    it = owned_.lower_bound(&probe);
  }
  // `whole` alone: a fence may complete between the two looks (coverable, own_pending).
  STREAMPOOL_EXPENSIVE_ASSERT(found.whole == walk_unmappable(kept, own).whole);
  return found;
}

LargeTier::Unmappable LargeTier::walk_unmappable(Kept kept, const Timeline* own) const noexcept {
  Unmappable found;
  for (const auto& segment : segments_) {
    if (!segment->expandable) continue;
    const Block* r = segment->first;
    for (const Mapping& m : segment->mappings) {
      const std::byte* const begin = segment->base + m.offset;
      const std::byte* const end = begin + m.size;
      r = range_holding(r, begin);
      if (free_through(r, end) && !kept.overlaps(begin, end)) found.count(*r, m, own, granule_);
    }
  }
  return found;
}

void LargeTier::wait_for_own(StreamState& s) noexcept {
  if (!pool_.wait_for_stream(s)) return;
  s.lock.lock();
  ++s.counters.growth_waits;
  s.lock.unlock();
}

LargeTier::Kept LargeTier::kept_by(const Plan& plan) noexcept {
  const Block* extended = plan.hole->before;
  if (extended == nullptr || !extended->free) return {};
  return {extended->ptr, extended->ptr + extended->size};
}

LargeTier::Unmapped LargeTier::unmap_free(Segment& segment, std::size_t bytes_to_keep,
                                          Kept kept) noexcept {
  Device& device = pool_.device();
  Unmapped done;
  Block* r = segment.first;
  for (std::size_t i = 0; i < segment.mappings.size();) {
    if (static_cast<std::size_t>(pool_.stats_reserved()) <= bytes_to_keep) break;
    const Mapping m = segment.mappings[i];
    std::byte* const begin = segment.base + m.offset;
    std::byte* const end = begin + m.size;
    r = range_holding(r, begin);
    if (kept.overlaps(begin, end)) {
      ++i;
      continue;
    }
    const bool whole = free_through(r, end) && normalize(r);
    Block* left = nullptr;
    Block* right = nullptr;
    try {
      if (whole && r->ptr < begin) left = new_block();
      if (whole && r->ptr + r->size > end) right = new_block();
    } catch (const std::bad_alloc&) {
      if (left != nullptr) delete_block(left);
      ++i;
      continue;
    }
    if (!whole || device.vm_unmap(begin, m.size) != cudaSuccess) {
      if (left != nullptr) delete_block(left);
      if (right != nullptr) delete_block(right);
      ++i;
      continue;
    }
    // Unmapped: the handle goes too (its memory returns now that nothing maps it); one the device
    // refuses to release stays the pool's, and counted, until a later try succeeds.
    const bool handle_released = twice([&] { return device.vm_release(m.handle); });
    if (!handle_released) keep_unreleased(unreleased_, m);
    // r becomes [r->ptr, begin) clean + the hole [begin, end) + [end, ...) clean.
    unindex(r);
    if (left != nullptr) {
      Block* hole = split_at(r, left, begin);
      index(r);
      r = hole;
    }
    if (right != nullptr) index(split_at(r, right, end));
    r->free = false;
    r->hole = true;
    r->need = {};
    while (r->before != nullptr && r->before->hole) {
      r = r->before;
      absorb_next(r);
    }
    while (r->after != nullptr && r->after->hole) absorb_next(r);
    segment.mapped -= m.size;
    segment.mappings[i++].size = 0;  // erased below, all at once
    done.bytes += m.size;
    if (handle_released) {
      pool_.count_device_free(m.size);
      done.returned += m.size;
    }
  }
  std::erase_if(segment.mappings, [](const Mapping& m) { return m.size == 0; });
  return done;
}

Failure LargeTier::grant(int peer) noexcept {
  std::lock_guard<CountedMutex> growing(growth_mutex_);  // mappings change only under it
  const std::uint64_t bit = std::uint64_t{1} << peer;
  if ((peers_ & bit) != 0) return {};
  Device& device = pool_.device();
  for (const auto& segment : segments_) {
    if (!segment->expandable) continue;
    const auto& mappings = segment->mappings;  // by offset
    for (std::size_t i = 0; i < mappings.size();) {
      std::size_t end = mappings[i].offset + mappings[i].size;
      std::size_t j = i + 1;
      while (j < mappings.size() && mappings[j].offset == end) end += mappings[j++].size;
      const cudaError_t status =
          device.vm_set_access(segment->base + mappings[i].offset, end - mappings[i].offset, bit);
      if (status != cudaSuccess) return Failure::of(status, "cuMemSetAccess");
      i = j;
    }
  }
  peers_ |= bit;
  return {};
}

std::size_t LargeTier::release_unreleased() noexcept {
  Device& device = pool_.device();
  std::size_t released = 0;
  std::erase_if(unreleased_, [&](const Mapping& m) {
    if (!twice([&] { return device.vm_release(m.handle); })) return false;
    pool_.count_device_free(m.size);
    released += m.size;
    return true;
  });
  return released;
}

bool LargeTier::return_segment(Segment& segment) noexcept {
  if (segment.base == nullptr) return true;
  Device& device = pool_.device();
  if (!segment.expandable) {
    if (device.free(segment.base) != cudaSuccess && device.free(segment.base) != cudaSuccess) {
      return false;
    }
    pool_.count_device_free(segment.size);
    segment.base = nullptr;
    return true;
  }
  std::erase_if(segment.mappings, [&](const Mapping& m) {
    std::byte* const at = segment.base + m.offset;
    if (!twice([&] { return device.vm_unmap(at, m.size); })) return false;
    segment.mapped -= m.size;
    if (twice([&] { return device.vm_release(m.handle); })) pool_.count_device_free(m.size);
    else keep_unreleased(unreleased_, m);
    return true;
  });
  release_unreleased();
  if (!segment.mappings.empty() ||
      !twice([&] { return device.vm_unreserve(segment.base, segment.size); })) {
    return false;
  }
  segment.base = nullptr;
  return true;
}

}  // namespace streampool::detail
