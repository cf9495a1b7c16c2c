// Allocation traces: what the bench replays.
//
// On disk, a trace is CSV with the columns of RMM's logging adaptor,
//
//     Thread,Time,Action,Pointer,Size,Stream
//     0,34874,alloc,0x7fd465400000,3072,0x0
//
// plain or gzip'd (detected by content, not by name). The header line is required and names all
// six columns, in any order (extra columns are ignored). Actions as RMM writes them (`allocate`,
// `free`) and as PyTorch's memory snapshots name them (`alloc`, `free_requested`,
// `free_completed`; tools/torch_snapshot_to_csv.py writes them); one trace uses one vocabulary.
// Time is in microseconds, or RMM's clock `HH:MM:SS.ffffff` (read as microseconds since
// midnight); Pointer, Stream and Thread are hexadecimal (0x...) or decimal; Size is the requested
// byte count, in decimal, and a free's Size must be its allocation's. A malformed line is an error
// naming its line number, and so is an allocation of a pointer that is live (allocated and not
// freed since), a second free of a pointer the trace allocated (a double free), and an allocation
// that would make the live allocations hold more than 2^63 - 1 bytes; nothing is guessed. RMM's
// `allocate failure` lines are not accepted either.
//
// In memory, a Trace is a list of events in file order with pointers replaced by allocation
// numbers: every free names the allocation it ends. A trace recorded mid-run frees blocks it never
// saw allocated: those frees are dropped and counted (`unmatched_frees`), as are requests of 0
// bytes and their frees (`empty_allocations`: no allocator hands out memory for them, CUDA's give
// each the null pointer, and they change no figure). For PyTorch's
// vocabulary the free is `free_requested` (when the program let go); `free_completed` (when the
// block went back to PyTorch's cache after other streams' use) is counted, not replayed.
//
// A free is replayed as the drop of a buffer allocated on the allocation's stream, so a free's
// `stream` is always its allocation's stream, and the stream use that the trace shows beyond it is
// in `used_on` (see TraceEvent). Streams and threads are listed in order of first use by an alloc
// or a replayed free; dropped lines add none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

namespace streampool::bench {

inline constexpr std::uint32_t no_stream = 0xffffffffu;

struct TraceEvent {
  enum class Kind : std::uint8_t { alloc, free };
  Kind kind;
  std::uint32_t thread;      // index into Trace::threads
  std::uint32_t stream;      // index into Trace::streams: where it is allocated (on a free too)
  // Frees only: another stream the block was used on (the replay calls record_stream with it
  // before the drop; replay --raw and compare free the block on it), or no_stream. Set when a free names another stream than its allocation
  // (RMM: deallocate on another stream; that stream goes here, `stream` stays the allocation's),
  // and, in a trace of exactly two streams, to the other stream when PyTorch completed the free
  // only after other events (or never, with events after it, in a trace that has
  // free_completed lines): the block was still in use there (record_stream). With more streams
  // the delay cannot be attributed and used_on stays no_stream.
  std::uint32_t used_on;
  std::uint64_t allocation;  // allocation number: the alloc's index among allocs
  std::uint64_t size;        // bytes (the alloc's size, repeated on its free)
  std::uint64_t time_us;
};

struct Trace {
  std::string name;
  std::vector<TraceEvent> events;
  std::vector<std::uint64_t> streams;  // stream handles as recorded, in order of first use
  std::vector<std::uint64_t> threads;  // thread ids as recorded, in order of first use
  std::uint64_t allocations = 0;       // number of alloc events
  std::uint64_t unmatched_frees = 0;   // frees of allocations made before recording began
  std::uint64_t empty_allocations = 0;  // requests of 0 bytes (left out, their frees too)
  std::uint64_t completed_frees = 0;   // free_completed events (counted, not replayed)
  std::uint64_t left_live = 0;         // allocations never freed in the trace

  // The largest sum of live requested bytes at any point of the trace. Only what the trace shows
  // counts: blocks allocated before recording began are not included, and a PyTorch free counts
  // at free_requested, not free_completed.
  std::uint64_t peak_requested() const;
};

class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses a trace from CSV text. Throws TraceError("name:LINE: what is wrong").
Trace parse_trace(std::istream& csv, const std::string& name);
// Reads a file, plain or gzip'd (by its first two bytes, 1f 8b). The trace's name is the file
// name without its directory and its .gz and .csv suffixes; errors name the path:
// TraceError("path:LINE: what is wrong"), or "path: ..." when the file cannot be read.
Trace read_trace(const std::string& path);
// Writes a trace as CSV (RMM's vocabulary), so that generated workloads can be saved and read back:
// parse_trace gives back the same events, streams and threads (provided the streams are listed in
// order of first use, a free's used_on counting as a use: generated traces are). Pointers are
// synthetic, unique addresses; a free with used_on is written on that stream (an RMM free on
// another stream).
void write_trace(std::ostream& out, const Trace& trace);

}  // namespace streampool::bench
