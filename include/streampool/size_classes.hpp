// Size classes: the pure mapping from a request size to the block size the pool caches it in.
//
// Configured by four numbers (SizeClassConfig):
//   smallest     the smallest block; every request up to it gets one of these (default 512 B)
//   per_doubling classes between one power-of-two multiple of `smallest` and the next: 1, 2, 4, 8
//   largest      the largest request that is cached in a class; larger ones are "large" and
//                take the pool's large-block path
//   alignment    every block size is a multiple of it: a power of two, at least 256 B (what
//                cudaMalloc guarantees, so a block carved at an aligned offset stays aligned)
//
// Class 0 holds requests of 1..smallest bytes. Above that, the band (smallest·2^k, smallest·2^(k+1)]
// is cut into steps of round_up(smallest·2^k / per_doubling, alignment); a request rounds up to the
// next step. Low bands, whose nominal step is finer than the alignment, therefore have fewer than
// `per_doubling` classes.
//
// The promise, checked for every size up to a few MiB and sampled beyond by the size-class test:
//   block_size(class_of(n)) >= n
//   block_size(class_of(n)) % alignment == 0
//   block_size(class_of(n)) - n < max(smallest, n / per_doubling + alignment)
// so with 4 classes per doubling a large request wastes under a quarter of its size, and a small
// one under one alignment unit more than that.
#pragma once

#include <streampool/export.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace streampool {

// The defaults are PoolOptions' (pool_options.hpp says where they come from).
struct SizeClassConfig {
  std::size_t smallest = 512;
  unsigned per_doubling = 4;
  std::size_t largest = std::size_t{256} << 10;
  std::size_t alignment = 256;

  friend constexpr bool operator==(const SizeClassConfig&, const SizeClassConfig&) = default;
};

// Why `config` is unusable, or an empty string when it is fine.
STREAMPOOL_API std::string validate(const SizeClassConfig& config);

class SizeClasses {
 public:
  static constexpr unsigned max_bands = 48;
  static constexpr unsigned max_classes = 1 + max_bands * 8;

  // Precondition: validate(config) is empty (MemoryPool checks and throws before it gets here).
  constexpr explicit SizeClasses(const SizeClassConfig& config = {}) : config_(config) {
    unsigned count = 1;
    block_[0] = config.smallest;
    if (std::has_single_bit(config.smallest)) {
      smallest_shift_ = static_cast<int>(std::countr_zero(config.smallest));
    }
    for (unsigned k = 0; k < max_bands; ++k) {
      band_first_[k] = count;
      const std::size_t base = config.smallest << k;
      const std::size_t step = step_of(base);
      step_shift_[k] = std::has_single_bit(step) ? static_cast<int>(std::countr_zero(step)) : -1;
      for (std::size_t block = base + step; ; block += step) {
        block_[count++] = block < 2 * base ? block : 2 * base;
        if (block >= 2 * base) break;
      }
      if (2 * base >= config.largest || count + 8 > max_classes) break;
    }
    count_ = class_of_unchecked(config.largest) + 1;
    max_block_ = block_[count_ - 1];
    alignment_shift_ = static_cast<int>(std::countr_zero(config.alignment));
    // Every block size is a multiple of the alignment, so all requests of one alignment unit
    // ((i·alignment, (i+1)·alignment]) share a class: the table holds it for the first units.
    const std::size_t units =
        std::min<std::size_t>(lookup_units, max_block_size() >> alignment_shift_);
    for (std::size_t i = 0; i < units; ++i) {
      lookup_[i] = static_cast<std::uint16_t>(class_of_unchecked((i + 1) << alignment_shift_));
    }
    lookup_limit_ = units << alignment_shift_;
  }

  const SizeClassConfig& config() const noexcept { return config_; }
  // Number of classes; class indices are 0 .. count() - 1.
  constexpr unsigned count() const noexcept { return count_; }
  // The largest block a class holds: requests above it are large.
  constexpr std::size_t max_block_size() const noexcept { return max_block_; }
  constexpr bool is_large(std::size_t bytes) const noexcept { return bytes > max_block_size(); }

  // Precondition: !is_large(bytes). Class 0 up to the smallest block, a load above it for
  // requests of up to lookup_units alignment units (256 KiB with the defaults: every small one),
  // the arithmetic below beyond.
  constexpr unsigned class_of(std::size_t bytes) const noexcept {
    if (bytes <= config_.smallest) return 0;
    if (bytes - 1 < lookup_limit_) [[likely]] return lookup_[(bytes - 1) >> alignment_shift_];
    return class_of_unchecked(bytes);
  }
  // Precondition: index < count().
  constexpr std::size_t block_size(unsigned index) const noexcept { return block_[index]; }

 private:
  constexpr std::size_t step_of(std::size_t base) const noexcept {
    const std::size_t nominal = base / config_.per_doubling;
    return (nominal + config_.alignment - 1) / config_.alignment * config_.alignment;
  }

  // The table's source, and class_of beyond it: with power-of-two sizes (the usual
  // configuration) every division below is a shift, and the whole mapping is a dozen
  // instructions.
  constexpr unsigned class_of_unchecked(std::size_t bytes) const noexcept {
    if (bytes <= config_.smallest) return 0;
    // k: the band with smallest·2^k < bytes <= smallest·2^(k+1)
    const std::size_t multiple = smallest_shift_ >= 0 ? (bytes - 1) >> smallest_shift_
                                                      : (bytes - 1) / config_.smallest;
    // (multiple >= 1 here; `| 1` changes no bit width but says so to a compiler that would
    // otherwise warn of a band -1 where this is inlined.)
    const unsigned k = static_cast<unsigned>(std::bit_width(multiple | 1)) - 1;
    const std::size_t base = config_.smallest << k;
    const std::size_t above = bytes - base - 1;
    // 1-based step within the band: ceil((bytes - base) / step)
    const std::size_t j = step_shift_[k] >= 0 ? (above >> step_shift_[k]) + 1
                                              : above / step_of(base) + 1;
    return band_first_[k] + static_cast<unsigned>(j) - 1;
  }

  static constexpr std::size_t lookup_units = 1024;
  static_assert(max_classes <= 0xffff, "a class index fits the table's entries");

  // What the allocation fast path reads (is_large, class_of) first, on one cache line with the
  // configuration; the table last.
  SizeClassConfig config_;
  int smallest_shift_ = -1;  // log2(smallest) when it is a power of two, else -1
  int alignment_shift_ = 0;  // log2(alignment)
  std::size_t lookup_limit_ = 0;  // the table answers requests of smallest + 1 .. lookup_limit_
  std::size_t max_block_ = 0;     // block_[count_ - 1]
  unsigned count_ = 0;
  std::array<unsigned, max_bands> band_first_{};
  std::array<int, max_bands> step_shift_{};  // log2(step) of each band when a power of two
  std::array<std::size_t, max_classes> block_{};
  std::array<std::uint16_t, lookup_units> lookup_{};  // the class of each alignment unit's requests
};

}  // namespace streampool
