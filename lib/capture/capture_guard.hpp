// Captures begun through the library, counted so that no thread makes a call that a capture under
// way would refuse (and be invalidated by): in global mode every thread is restricted, in
// thread-local mode the thread that began it; some calls are refused in every mode (gate.hpp,
// Restricted). This is where the pool's calls_allowed() is defined.
#pragma once

#include <streampool/device.hpp>

#include <thread>

namespace streampool::detail {

// Called before cudaStreamBeginCapture (so that no thread sees the capture under way without
// knowing of it) and after the capture is over, whatever its outcome.
void note_capture_begin(CaptureMode mode, std::thread::id thread);
void note_capture_end(CaptureMode mode, std::thread::id thread) noexcept;

}  // namespace streampool::detail
