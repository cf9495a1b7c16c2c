// Captures begun through the library, counted so that no thread makes a call that a capture
// under way would refuse (and be invalidated by).
#pragma once

#include <atomic>

namespace streampool::detail {

// Global-mode captures under way anywhere: they restrict every thread.
inline std::atomic<int> global_mode_captures{0};
// Thread-local-mode captures begun by this thread: they restrict only it.
inline thread_local int thread_local_mode_captures = 0;

inline bool unsafe_calls_allowed_here() noexcept {
  return global_mode_captures.load(std::memory_order_acquire) == 0 &&
         thread_local_mode_captures == 0;
}

}  // namespace streampool::detail
