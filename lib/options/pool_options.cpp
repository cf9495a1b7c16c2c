// PoolOptions: the STREAMPOOL_CONF syntax ("key=value,key=value") and validation.
#include <streampool/error.hpp>
#include <streampool/pool_options.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <limits>
#include <string>

namespace streampool {
namespace {

// Spaces, tabs and line ends (a variable read from a file may keep its line's end).
std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad(std::string_view key, std::string_view value, std::string_view why) {
  throw Error(Errc::invalid_value,
              fmt::format("STREAMPOOL_CONF: {}={}: {}", key, value, why));
}

// "512", "64K", "2M", "1G" (binary multiples).
std::size_t parse_size(std::string_view key, std::string_view value) {
  std::size_t number = 0;
  const char* first = value.data();
  const char* last = value.data() + value.size();
  const auto [end, ec] = std::from_chars(first, last, number);
  if (ec != std::errc() || end == first) bad(key, value, "expected a size such as 512, 64K, 2M");
  unsigned shift = 0;
  const std::string_view suffix(end, static_cast<std::size_t>(last - end));
  if (suffix == "K" || suffix == "k" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") shift = 30;
  else if (!suffix.empty()) bad(key, value, "unknown size suffix (use K, M or G)");
  if (number > (~std::size_t{0} >> shift)) bad(key, value, "too large");
  return number << shift;
}

// A count or a time: digits alone (a size suffix there would multiply it by 1024).
std::size_t parse_count(std::string_view key, std::string_view value) {
  std::size_t number = 0;
  const char* last = value.data() + value.size();
  const auto [end, ec] = std::from_chars(value.data(), last, number);
  if (ec == std::errc::result_out_of_range) bad(key, value, "too large");
  if (ec != std::errc() || end != last || value.empty()) bad(key, value, "expected a whole number");
  return number;
}

bool parse_bool(std::string_view key, std::string_view value) {
  if (value == "1" || value == "true" || value == "on" || value == "yes") return true;
  if (value == "0" || value == "false" || value == "off" || value == "no") return false;
  bad(key, value, "expected true or false");
}

std::string size_text(std::size_t bytes) {
  if (bytes != 0 && bytes % (std::size_t{1} << 30) == 0) return fmt::format("{}G", bytes >> 30);
  if (bytes != 0 && bytes % (std::size_t{1} << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes != 0 && bytes % (std::size_t{1} << 10) == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

const char* checks_text(StreamChecks checks) {
  switch (checks) {
    case StreamChecks::none: return "none";
    case StreamChecks::identity: return "identity";
    case StreamChecks::full: return "full";
  }
  return "full";
}

}  // namespace

PoolOptions PoolOptions::parse(std::string_view conf) { return parse(conf, PoolOptions{}); }

PoolOptions PoolOptions::parse(std::string_view conf, const PoolOptions& base) {
  PoolOptions o = base;
  while (!conf.empty()) {
    const std::size_t comma = conf.find(',');
    const std::string_view item = trim(conf.substr(0, comma));
    conf = comma == std::string_view::npos ? std::string_view() : conf.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      throw Error(Errc::invalid_value,
                  fmt::format("STREAMPOOL_CONF: '{}': expected key=value", item));
    }
    const std::string_view key = trim(item.substr(0, eq));
    const std::string_view value = trim(item.substr(eq + 1));
    if (key == "smallest") o.size_classes.smallest = parse_size(key, value);
    else if (key == "per_doubling") {
      const std::size_t n = parse_count(key, value);
      if (n > 8) bad(key, value, "must be 1, 2, 4 or 8");
      o.size_classes.per_doubling = static_cast<unsigned>(n);
    }
    else if (key == "largest") o.size_classes.largest = parse_size(key, value);
    else if (key == "alignment") o.size_classes.alignment = parse_size(key, value);
    else if (key == "slab") o.slab_bytes = parse_size(key, value);
    else if (key == "segment") o.segment_bytes = parse_size(key, value);
    else if (key == "large_rounding") o.large_rounding = parse_size(key, value);
    else if (key == "large_shelf") {
      const std::size_t n = parse_count(key, value);
      if (n > max_large_shelf) bad(key, value, fmt::format("at most {}", max_large_shelf));
      o.large_shelf = static_cast<std::uint32_t>(n);
    }
    else if (key == "max_reserved") o.max_reserved_bytes = parse_size(key, value);
    else if (key == "unfenced") o.unfenced_bytes = parse_size(key, value);
    else if (key == "unfenced_us") {
      const std::size_t n = parse_count(key, value);
      if (n > std::numeric_limits<std::uint32_t>::max()) bad(key, value, "too large");
      o.unfenced_us = static_cast<std::uint32_t>(n);
    }
    else if (key == "idle_ms") {
      const std::size_t n = parse_count(key, value);
      if (n > std::numeric_limits<std::uint32_t>::max()) bad(key, value, "too large");
      o.idle_ms = static_cast<std::uint32_t>(n);
    }
    else if (key == "expandable_segments") o.expandable_segments = parse_bool(key, value);
    else if (key == "mapping") o.mapping_bytes = parse_size(key, value);
    else if (key == "stream_homes") {
      const std::size_t n = parse_count(key, value);
      if (n > max_stream_homes) bad(key, value, fmt::format("at most {}", max_stream_homes));
      o.stream_homes = static_cast<std::uint32_t>(n);
    }
    else if (key == "fence_every_free") o.fence_every_free = parse_bool(key, value);
    else if (key == "cross_stream_wait") o.cross_stream_wait = parse_bool(key, value);
    else if (key == "nvtx_memory") o.nvtx_memory = parse_bool(key, value);
    else if (key == "stats_granule") o.stats_granule = parse_size(key, value);
    else if (key == "trace_file") {
      // A path, taken as written: only an empty one is refused here (one that cannot be opened
      // is refused by the pool's construction, which names it).
      if (value.empty()) bad(key, value, "expected a file path");
      o.trace_file = std::string(value);
    }
    else if (key == "stream_checks") {
      if (value == "none") o.stream_checks = StreamChecks::none;
      else if (value == "identity") o.stream_checks = StreamChecks::identity;
      else if (value == "full") o.stream_checks = StreamChecks::full;
      else bad(key, value, "expected none, identity or full");
    } else {
      throw Error(Errc::invalid_value, fmt::format("STREAMPOOL_CONF: unknown key '{}' (known: "
                                                   "smallest, per_doubling, largest, alignment, "
                                                   "slab, segment, large_rounding, large_shelf, "
                                                   "expandable_segments, mapping, stream_homes, "
                                                   "max_reserved, "
                                                   "unfenced, unfenced_us, idle_ms, "
                                                   "fence_every_free, cross_stream_wait, "
                                                   "stream_checks, stats_granule, nvtx_memory, "
                                                   "trace_file)",
                                                   key));
    }
  }
  if (std::string why = o.validate(); !why.empty()) {
    throw Error(Errc::invalid_value, "STREAMPOOL_CONF: " + why);
  }
  return o;
}

PoolOptions PoolOptions::from_environment(const PoolOptions& base) {
  const char* conf = std::getenv("STREAMPOOL_CONF");
  return conf == nullptr ? base : parse(conf, base);
}

std::string PoolOptions::to_conf() const {
  std::string conf = fmt::format(
      "smallest={},per_doubling={},largest={},alignment={},slab={},segment={},"
      "large_rounding={},large_shelf={},expandable_segments={},mapping={},stream_homes={},"
      "max_reserved={},"
      "unfenced={},"
      "unfenced_us={},idle_ms={},"
      "fence_every_free={},cross_stream_wait={},"
      "stream_checks={},stats_granule={},nvtx_memory={}",
      size_text(size_classes.smallest), size_classes.per_doubling, size_text(size_classes.largest),
      size_text(size_classes.alignment), size_text(slab_bytes), size_text(segment_bytes),
      size_text(large_rounding), large_shelf, expandable_segments, size_text(mapping_bytes),
      stream_homes,
      size_text(max_reserved_bytes),
      size_text(unfenced_bytes),
      unfenced_us, idle_ms, fence_every_free,
      cross_stream_wait, checks_text(stream_checks), size_text(stats_granule), nvtx_memory);
  if (!trace_file.empty()) {
    if (trace_file.find(',') != std::string::npos || trim(trace_file) != trace_file) {
      throw Error(Errc::invalid_value,
                  fmt::format("to_conf: trace_file '{}' has no conf form (a comma, or spaces at "
                              "either end); set PoolOptions::trace_file in code",
                              trace_file));
    }
    conf += ",trace_file=" + trace_file;
  }
  return conf;
}

std::string PoolOptions::validate() const {
  if (std::string why = streampool::validate(size_classes); !why.empty()) return why;
  const auto power_of_two = [](std::size_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!power_of_two(large_rounding) || large_rounding < size_classes.alignment) {
    return fmt::format("large_rounding ({}) must be a power of two of at least the alignment ({})",
                       large_rounding, size_classes.alignment);
  }
  // Bounds that keep the pool's sums exact: a slab's block count and its rounded size, a
  // segment's size and the limit checks on it, twice the stats granule as a signed count. Larger
  // values passed here before and then overflowed (slab=SIZE_MAX carved empty slabs: allocations
  // returned an empty buffer and no error). A slab's blocks are host records too: a 1 GiB slab of
  // 512-byte blocks is two million of them.
  constexpr std::size_t GiB = std::size_t{1} << 30;
  constexpr std::size_t TiB = std::size_t{1} << 40;
  if (large_rounding > TiB) {
    return fmt::format("large_rounding ({} bytes) must be at most 1 TiB", large_rounding);
  }
  if (slab_bytes == 0 || slab_bytes > GiB) {
    return fmt::format("slab ({} bytes) must be positive and at most 1 GiB", slab_bytes);
  }
  if (segment_bytes == 0 || segment_bytes > TiB) {
    return fmt::format("segment ({} bytes) must be positive and at most 1 TiB", segment_bytes);
  }
  if (mapping_bytes > TiB) {
    return fmt::format("mapping ({} bytes) must be at most 1 TiB", mapping_bytes);
  }
  if (stats_granule > TiB) {
    return fmt::format("stats_granule ({} bytes) must be at most 1 TiB", stats_granule);
  }
  if (large_shelf > max_large_shelf) {
    return fmt::format("large_shelf ({}) must be at most {}", large_shelf, max_large_shelf);
  }
  if (stream_homes > max_stream_homes) {
    return fmt::format("stream_homes ({}) must be at most {}", stream_homes, max_stream_homes);
  }
  if (trace_file.find('\0') != std::string::npos) {
    return "trace_file must not contain a NUL character (a path cannot)";
  }
  return {};
}

}  // namespace streampool
