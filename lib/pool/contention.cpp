// The process-wide counts of lock waits (contention.hpp).
#include "contention.hpp"

#include <streampool/pool_stats.hpp>

#include <atomic>
#include <chrono>

namespace streampool::detail::contention {
namespace {

struct alignas(64) Waits {
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::uint64_t> ns{0};
};
Waits waits[kinds];

LockWaits read(Kind kind) noexcept {
  return {waits[kind].count.load(std::memory_order_relaxed),
          waits[kind].ns.load(std::memory_order_relaxed)};
}

}  // namespace

std::int64_t clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void waited(Kind kind, std::int64_t since) noexcept {
  const std::int64_t ns = clock_ns() - since;
  waits[kind].count.fetch_add(1, std::memory_order_relaxed);
  waits[kind].ns.fetch_add(ns > 0 ? static_cast<std::uint64_t>(ns) : 0, std::memory_order_relaxed);
}

}  // namespace streampool::detail::contention

namespace streampool {

LockContention lock_contention() noexcept {
  using namespace detail::contention;
  return {read(stream), read(revocation), read(arena), read(growth), read(events)};
}

}  // namespace streampool
