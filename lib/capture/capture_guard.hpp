// Captures begun through the library, counted so that no thread makes a call that a capture under
// way would refuse (and be invalidated by): in global mode every thread is restricted, in
// thread-local mode the thread that began it; some calls are refused in every mode (gate.hpp,
// Restricted). This is where the pool's calls_allowed() is defined.
#pragma once

#include <streampool/device.hpp>

#include <cstdint>
#include <memory>
#include <thread>

namespace streampool::detail {

// Called before cudaStreamBeginCapture (so that no thread sees the capture under way without
// knowing of it) and after the capture is over, whatever its outcome.
void note_capture_begin(CaptureMode mode, std::thread::id thread);
void note_capture_end(CaptureMode mode, std::thread::id thread) noexcept;

// Left captures. A capture of cudaStreamPerThread that the library can no longer end (its
// CapturePool went on another thread: capture_pool.hpp) is still under way, so it stays counted
// as one (calls_allowed() keeps refusing what it would refuse) until the thread whose stream
// captures is seen not capturing, at one of its own safe points (settle_left_captures), or exits.
// The capturing thread calls watch_capturing_thread() when it begins a capture; `token` is its
// this_thread_token(). A capture left by a thread that has exited is counted over at once.
void watch_capturing_thread();
void note_capture_left(CaptureMode mode, std::thread::id thread, std::uint64_t token,
                       std::shared_ptr<Device> device) noexcept;
// On the calling thread: counts over each capture left to it whose stream captures no more.
void settle_left_captures() noexcept;

}  // namespace streampool::detail
