// The trace recorder: every allocation and free of a MemoryPool, written to a file that
// `streampool-bench replay FILE` (and `tune`, `compare`) reads, so that the pool can be tuned on
// the application's own trace.
//
// Switched on without a rebuild by STREAMPOOL_CONF=trace_file=PATH, in code by
// PoolOptions::trace_file (both from the pool's construction on), or for a window of the run by
// start_trace / stop_trace below. Off (the default), it costs the pool's calls one load of a
// pointer and a branch, outside the pool core (7 instructions an allocate + drop pair); on, one
// mutex and a line of text per call, about 0.5 µs (bench/results/trace-recorder.md).
//
// The file is the bench's CSV (docs/bench.md, "Traces"; RMM's logging-adaptor columns and
// vocabulary):
//
//     Thread,Time,Action,Pointer,Size,Stream
//     0,0,allocate,0x7f0000000000,4096,0
//     0,12,free,0x7f0000000000,4096,0
//
//   Thread   small ids, 0, 1, ... in order of each thread's first call while recording;
//   Time     microseconds since the recording started (steady clock); lines are in the order the
//            calls happened, and their times never decrease down the file;
//   Action   allocate, free;
//   Pointer  the device address, 0x...;
//   Size     the bytes asked for, on the free too (the allocation's, whatever deallocate says);
//   Stream   small ids, 0, 1, ... per stream handle in order of first use. A handle given to
//            release_stream gets a new id at its next use (it may name a new stream by then);
//            cudaStreamPerThread gets one id per thread. A free is written on the stream it is
//            ordered on: the buffer's own, the one deallocate names, or, for a buffer that
//            record_stream named another stream for, the last stream named (the replay then
//            calls record_stream with it before the drop; the format has room for one).
//
// Every allocation goes in: PooledBuffer's, the raw allocate's, and those a CapturePool serves
// during a capture. A free of memory allocated before the recording started is not written (it
// is counted: TraceStatus::unseen_frees). Failed allocations are not written.
//
// Threads: the calls of all threads are written under one mutex, so the file's order is the
// order in which the calls took it. An allocation is written before the caller gets its pointer,
// a free before its memory can be handed out again, so a pointer is never allocated twice in the
// file without a free between.
//
// The file: created (or truncated) when the recording starts; written in blocks of 64 KiB, and
// in full at flush_trace, stop_trace, the MemoryPool's destruction and a normal exit of the
// process (std::exit, or a return from main: a pool that lives until then, as the registry's of
// device_pools.hpp, loses no line). Buffers that outlive the pool are still recorded when
// dropped, each line written at once; the file is closed when the last of them goes. A write that
// fails stops the recording: the message goes to standard error once and to
// TraceStatus::error_message; the pool itself goes on. Two pools of one process given the same
// file (however its path is spelled: "dir/./trace.csv", relative or absolute): the first gets it,
// the next PATH with ".2" before its extension (trace.2.csv), and so on.
#pragma once

#include <streampool/export.hpp>
#include <streampool/memory_pool.hpp>

#include <cstdint>
#include <string>

namespace streampool {

struct TraceStatus {
  bool recording = false;
  std::string path;                // the file of the recording under way, or of the last one
  std::uint64_t allocations = 0;   // lines written (or buffered) since the recording started
  std::uint64_t frees = 0;
  std::uint64_t unseen_frees = 0;  // frees of memory allocated before it started: not written
  std::uint64_t streams = 0;       // stream ids given out
  std::uint64_t threads = 0;       // thread ids given out
  std::string error_message;       // why the recording stopped early; empty if it did not
};

// Starts recording `pool` into `path` (created, or truncated). Throws Error(Errc::invalid_value)
// naming the path when it cannot be opened (and why), or when the pool is recording already.
STREAMPOOL_API void start_trace(MemoryPool& pool, const std::string& path);
// Writes what is buffered, closes the file and returns the recording's status. A pool that is
// not recording is left alone (its last status is returned).
STREAMPOOL_API TraceStatus stop_trace(MemoryPool& pool) noexcept;
// Writes what is buffered to the file now.
STREAMPOOL_API void flush_trace(MemoryPool& pool) noexcept;
STREAMPOOL_API TraceStatus trace_status(const MemoryPool& pool);

}  // namespace streampool
