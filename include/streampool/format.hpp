// fmt formatters for streampool's values: `fmt::print("{}", pool.stats())`. Not included by
// <streampool/streampool.hpp> when compiling with nvcc: fmt 9's headers do not compile under nvcc 13.
#pragma once

#include <streampool/pool_stats.hpp>

#include <fmt/format.h>

template <>
struct fmt::formatter<streampool::PoolStats> : fmt::formatter<std::string> {
  template <class Context>
  auto format(const streampool::PoolStats& stats, Context& ctx) const {
    return fmt::formatter<std::string>::format(streampool::to_string(stats), ctx);
  }
};

template <>
struct fmt::formatter<streampool::PoolBreakdown> : fmt::formatter<std::string> {
  template <class Context>
  auto format(const streampool::PoolBreakdown& breakdown, Context& ctx) const {
    return fmt::formatter<std::string>::format(streampool::to_string(breakdown), ctx);
  }
};
