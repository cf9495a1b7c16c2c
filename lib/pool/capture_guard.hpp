// Captures begun through the library, counted so that no thread makes a call that a capture
// under way would refuse (and be invalidated by): in global mode every thread is restricted, in
// thread-local mode the thread that began it.
#pragma once

#include <streampool/device.hpp>

#include <atomic>
#include <thread>

namespace streampool::detail {

// Captures begun with begin_capture_with_pool under way in the program. While there is one, every
// allocation asks a stream's capture status before its id: CUDA refuses cudaStreamGetId on a
// capturing stream and invalidates the capture (seen on the H200). Inline: the allocation fast
// path reads it (one load of a line written only when a capture begins or ends).
extern std::atomic<int> pooled_captures;
inline bool pooled_captures_active() noexcept {
  return pooled_captures.load(std::memory_order_acquire) != 0;
}

void note_capture_begin(CaptureMode mode, std::thread::id thread);
void note_capture_end(CaptureMode mode, std::thread::id thread) noexcept;
// Calls CUDA refuses during a restricting capture (malloc, event queries, synchronizes) may be
// made from this thread now. One atomic load when no capture restricts anyone.
bool unsafe_calls_allowed_here() noexcept;

}  // namespace streampool::detail
