// Debug-only invariant checks, in two tiers (as mimalloc does):
//
//   STREAMPOOL_ASSERT(cond)            cheap: a field or two; on when STREAMPOOL_DEBUG_CHECKS >= 1
//   STREAMPOOL_EXPENSIVE_ASSERT(cond)  walks lists or segments; on when STREAMPOOL_DEBUG_CHECKS >= 2
//
// The build sets STREAMPOOL_DEBUG_CHECKS (CMake option of the same name; the test build uses 2).
// A failed check prints where and what, and aborts: an allocator that broke an invariant must not
// hand out another block.
#pragma once

#ifndef STREAMPOOL_DEBUG_CHECKS
#define STREAMPOOL_DEBUG_CHECKS 0
#endif

#include <string>

namespace streampool::detail {
[[noreturn]] void check_failed(const char* condition, const char* file, int line) noexcept;
// A caller broke the API's contract in a way the pool can see (a raw deallocate of a pointer it
// does not hold, or with another size): debug builds print `what` and abort, as a failed check.
[[noreturn]] void misuse(const std::string& what) noexcept;
}  // namespace streampool::detail

#if STREAMPOOL_DEBUG_CHECKS >= 1
#define STREAMPOOL_ASSERT(cond) \
  ((cond) ? (void)0 : ::streampool::detail::check_failed(#cond, __FILE__, __LINE__))
#else
#define STREAMPOOL_ASSERT(cond) ((void)sizeof(!(cond)))  // not evaluated
#endif

#if STREAMPOOL_DEBUG_CHECKS >= 2
#define STREAMPOOL_EXPENSIVE_ASSERT(cond) STREAMPOOL_ASSERT(cond)
#else
#define STREAMPOOL_EXPENSIVE_ASSERT(cond) ((void)sizeof(!(cond)))
#endif
