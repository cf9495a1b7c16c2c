#include <streampool/size_classes.hpp>

#include <fmt/format.h>

namespace streampool {

std::string validate(const SizeClassConfig& config) {
  const auto power_of_two = [](std::size_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!power_of_two(config.alignment) || config.alignment < 256) {
    return fmt::format("alignment must be a power of two of at least 256 bytes, not {}",
                       config.alignment);
  }
  if (config.smallest == 0 || config.smallest % config.alignment != 0) {
    return fmt::format("smallest block ({} bytes) must be a non-zero multiple of the alignment ({})",
                       config.smallest, config.alignment);
  }
  if (config.per_doubling != 1 && config.per_doubling != 2 && config.per_doubling != 4 &&
      config.per_doubling != 8) {
    return fmt::format("classes per doubling must be 1, 2, 4 or 8, not {}", config.per_doubling);
  }
  constexpr std::size_t limit = std::size_t{1} << 40;
  if (config.largest < config.smallest || config.largest > limit) {
    return fmt::format("largest cached size ({} bytes) must lie between the smallest block ({}) "
                       "and 1 TiB",
                       config.largest, config.smallest);
  }
  return {};
}

}  // namespace streampool
