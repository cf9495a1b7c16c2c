// The small tier: requests up to size_classes.largest get a block of their size class, carved
// from a slab (a range of the arena). Free blocks live on their stream's list of the class
// (StreamState::free); clean ones in the depot.
//
// A stream that misses its own list takes, in order: clean blocks from the depot; covered blocks
// from other streams' lists, oldest first (with cross_stream_wait, blocks whose fence is
// recorded, by waiting on it); parked blocks that became clean; a new slab. A stream whose blocks
// it could use are unfenced is asked for a fence (its own next call records it). Blocks taken in
// bulk go to the taker's list: clean ones stay clean there, so others may still take them.
#pragma once

#include "block.hpp"
#include "failure.hpp"

#include <streampool/pool_options.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace streampool::detail {

class PoolCore;
struct StreamState;

// A large range carved into blocks of one size class.
struct Slab {
  Block* range = nullptr;
  std::uint32_t size_class = 0;
  std::vector<Block> blocks;
  std::size_t in_depot = 0;  // [depot mutex]
};

class SmallTier {
 public:
  SmallTier(PoolCore& pool, const PoolOptions& options, std::size_t classes);
  SmallTier(const SmallTier&) = delete;
  SmallTier& operator=(const SmallTier&) = delete;

  // The slow path: a block of `size_class` for `s` (not locked), counted as a miss there.
  Block* take(StreamState& s, std::uint32_t size_class, Failure& error) noexcept;
  // Clean blocks to the depot.
  void put_clean(const std::vector<Block*>& blocks) noexcept;
  // Slabs whose every block is in the depot go back to the arena.
  void return_free_slabs() noexcept;

  std::size_t depot_bytes() noexcept;
  std::size_t slab_bytes() noexcept;
  bool consistent() noexcept;  // STREAMPOOL_EXPENSIVE_ASSERT

 private:
  Block* from_depot(StreamState& s, std::uint32_t size_class) noexcept;
  Block* steal(StreamState& s, std::uint32_t size_class) noexcept;
  Block* carve(StreamState& s, std::uint32_t size_class, Failure& error) noexcept;

  PoolCore& pool_;
  const PoolOptions& options_;
  std::mutex depot_mutex_;  // lock order: before the arena's, never inside a stream's
  std::vector<BlockList> depot_;
  std::vector<std::unique_ptr<Slab>> slabs_;  // [depot_mutex_]
};

}  // namespace streampool::detail
