// Captures begun through the library, counted so that no thread makes a call that a capture under
// way would refuse (and be invalidated by): in global mode every thread is restricted, in
// thread-local mode the thread that began it; some calls are refused in every mode (gate.hpp,
// Restricted). This is where the pool's calls_allowed() is defined.
#pragma once

#include "../pool/gate.hpp"

#include <streampool/device.hpp>

#include <cstdint>
#include <memory>
#include <thread>

namespace streampool::detail {

// Called before cudaStreamBeginCapture (so that no thread sees the capture under way without
// knowing of it) and after the capture is over, whatever its outcome. The begin may throw (out
// of host memory): it takes the room of the capture's note, should it be left (below). It waits
// for the calls other threads decided on before it (gate.hpp, CallPermit); on a thread inside
// such a call (a Device method) it throws capture_forbids_call, having counted nothing.
// A capture of cudaStreamPerThread is noted with its thread's this_thread_token(): the begin
// returns the note's number, which its end (or its note_capture_left) passes back. CUDA ends
// the capture when that thread exits, and the exit counts it over, whoever holds it then (found
// in review, 2026-12-07: one still bound to its CapturePool stayed counted until someone dropped
// the CapturePool); the holder's later note only forgets it. Other captures: 0.
std::uint64_t note_capture_begin(CaptureMode mode, std::thread::id thread,
                                 std::uint64_t per_thread_token = 0);
void note_capture_end(CaptureMode mode, std::thread::id thread, std::uint64_t note = 0) noexcept;

// Left captures: captures that may be under way (CUDA says so, or cannot tell) which the library
// no longer binds nor ends, so they stay counted (calls_allowed() keeps refusing what they would
// refuse) until CUDA says they are over.
// - Of cudaStreamPerThread, when its CapturePool went on another thread (capture_pool.hpp), or
//   was detached or given up on its own thread before the caller's end: only the thread whose
//   stream captures can ask, at one of its own safe points (settle_left_captures); counted over
//   at its exit (after CUDA's own cleanup of the thread, capture_guard.cpp). The capturing
//   thread calls watch_capturing_thread() when it begins a capture; `token` is its
//   this_thread_token(). One left by a thread that has exited is counted over at once.
// - Of an explicit stream, detached or given up before the caller's own end, or whose every end
//   CUDA refused as its CapturePool went: any thread asks, at its safe points and at the first
//   call the capture would refuse. `id` is the capture's as CUDA gave it (0 where CUDA could
//   not tell, or gave none, for a capture attached already invalidated: then any active
//   capture of the stream counts as it).
// A note needs no host memory (its room was taken as the capture began), and neither does a
// settle: a left capture is never counted over for want of host memory.
void watch_capturing_thread();
void note_capture_left(CaptureMode mode, std::thread::id thread, std::uint64_t token,
                       std::shared_ptr<Device> device, cudaStream_t stream = cudaStreamPerThread,
                       CaptureId id = 0, std::uint64_t note = 0) noexcept;
// The capture status of `stream` (an explicit stream, or this thread's per-thread one) and the id
// of a capture under way, in one query: the one reading for every caller that lets a capture go
// or counts a left one over (GateStatus::active, restricting, ordinary say what it means).
GateStatus capture_now(Device& device, cudaStream_t stream) noexcept;
// Counts over each capture left to the calling thread that CUDA says is over (nothing captures
// on its stream), and each capture left on an explicit stream that can no longer refuse calls:
// nothing captures there, or another capture, active, does (an invalidated one not yet ended
// still refuses), or its context is destroyed. Where CUDA cannot tell, the capture stays
// counted. It asks each explicit stream's status: the caller must not destroy the stream before
// the capture is seen over (CUDA's query of a destroyed stream's handle crashed the process on
// an H100; capture_pool.hpp says how, and settled_here, gate.hpp, is release_stream's part).
void settle_left_captures() noexcept;

}  // namespace streampool::detail
