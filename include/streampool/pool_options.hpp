// PoolOptions: everything a MemoryPool can be configured with, in code or through the
// STREAMPOOL_CONF environment variable ("key=value,key=value", as PYTORCH_CUDA_ALLOC_CONF), so that
// a configuration found by `streampool-bench tune` applies without a rebuild.
#pragma once

#include <streampool/export.hpp>
#include <streampool/size_classes.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace streampool {

// What the pool asks CUDA on each allocation to learn which stream it is for. One driver call
// (cuStreamIsCapturing or cuStreamGetId, through CudaDevice) costs 15-20 ns on the H200, the
// runtime's own 79-91 ns where the driver lacks them (bench/results/h200.md), so this is the main
// price of safety on the fast path.
enum class StreamChecks {
  // No call: a stream handle is trusted to name the stream it named when the pool last saw it in
  // this thread. Call release_stream(s) before destroying s (or never destroy a stream the pool
  // has seen), and capture only through begin_capture_with_pool. The fastest setting.
  none,
  // One stream-id call (cuStreamGetId) per allocation: safe when CUDA hands a destroyed stream's handle to a new
  // stream. CUDA refuses the id of a capturing stream and invalidates the capture: an allocation
  // on a stream captured without a pool fails with Errc::capture_without_pool, but the capture is
  // lost. (While a capture with a pool is under way anywhere, the capture status is asked first.)
  identity,
  // The capture status, then (when not capturing) the stream's id, per allocation: also catches,
  // on every allocation and without harming it, a capture begun without a pool
  // (Errc::capture_without_pool). The default.
  full,
};

struct STREAMPOOL_API PoolOptions {
  // Size classes of the small tier: requests up to size_classes.largest are cached per stream in
  // blocks of their class.
  // (The defaults were chosen on 2026-11-30 from `streampool-bench tune` on the GPT-2, ResNet-50
  // and two-stream traces recorded on the H200 with the embedded workloads:
  // bench/results/h200.md. With the slab and rounding defaults of 2026-12-04, `tune --wide`
  // ranks per_doubling=2,largest=128K slightly ahead, mean 1.0706 against 1.0748:
  // bench/results/h200-compare-defaults-slab256k.md.)
  SizeClassConfig size_classes{};  // 512 B, 4 per doubling, up to 256 KiB, 256 B aligned
  // Small blocks are carved from slabs of about this size (at least one block; at most 1 GiB).
  // (256 KiB and, below, large_rounding 32 KiB since 2026-12-04: with expandable segments they
  // hold the least memory on the traces and workloads, the transformer workload aside;
  // bench/results/h200-compare-defaults-slab256k.md.)
  std::size_t slab_bytes = std::size_t{256} << 10;
  // The large tier reserves device memory in segments of at least this size (at most 1 TiB) and
  // serves larger requests best-fit from them, splitting and coalescing ranges.
  std::size_t segment_bytes = std::size_t{20} << 20;
  // Large requests round up to a multiple of this (a power of two, at least the alignment, at
  // most 1 TiB).
  std::size_t large_rounding = std::size_t{32} << 10;
  // Each stream keeps up to this many large ranges it dropped on a shelf of its own (0: none), and
  // a request on it of one's size (rounded to large_rounding) takes it back under the stream's
  // lock alone: no arena mutex, no search. Shelves go back to the arena before it grows,
  // in the out-of-memory ladder, at trim and when their stream is released (docs/design.md).
  std::uint32_t large_shelf = 2;
  static constexpr std::uint32_t max_large_shelf = 64;
  // The large tier's segments are reservations of addresses that grow in place, physical memory
  // mapped into them as needed and unmapped by trim and the out-of-memory ladder (the driver's
  // virtual memory management). Where the device lacks it, or with false, segments are
  // cudaMalloc allocations of segment_bytes or more (so too with nvtx_memory, whose layer knows
  // cudaMalloc's segments only). Each growth maps what it lacks as one
  // physical allocation of up to 1 GiB (or segment_bytes, if larger); trim unmaps whole ones.
  bool expandable_segments = true;
  // With expandable segments: the bytes of one physical allocation (rounded up to the device's
  // granularity, 2 MiB on the H200; at most 1 TiB), or 0 for one per growth as above. Memory goes
  // back to the device, and moves between places of the arena, only as whole mappings: smaller
  // ones let more of it move when streams interleave (before stream homes, the two-stream trace
  // held 1.77 reserved per requested byte with 0, 1.10 with 8M, 1.05 with 2M; with them it holds
  // 1.017 with each), and every mapping costs its own driver calls, about 60 us on the H200, so
  // growth is that much slower: 15, 44 and 141 device allocations there (docs/design.md).
  std::size_t mapping_bytes = 0;
  // With expandable segments: up to this many live streams (0: none) each get a reservation of
  // their own, which their large growths map into, and their large requests take no clean range
  // from another live stream's while that stream asks for large memory (its last large request
  // at most 64 of the pool's ago): the streams' memory stays apart, as in a pool per stream, so
  // that one stream's buffers do not split the ranges another frees for itself. Memory moves between
  // them as whole mappings (a growth gives back free mappings elsewhere before it maps), and a
  // request that cannot grow takes what is free anywhere. A retired stream's reservation is open
  // to all; a stream that needs a home claims it (a retired stream's state recycled for a new
  // stream keeps its home). Streams past the limit, and slabs, grow outside the homes where a
  // reservation has room, else anywhere. Homes are set aside while more streams than this ask
  // for large memory, and for a while when they keep moving memory between them
  // (docs/design.md, "A reservation per stream for large growths").
  std::uint32_t stream_homes = 4;
  static constexpr std::uint32_t max_stream_homes = 64;
  // Reserved device memory never exceeds this (0: no limit). Past it, the pool reclaims and then
  // fails with Errc::out_of_memory, as when the device itself refuses.
  std::size_t max_reserved_bytes = 0;
  // Bounded unfenced memory: once the pool has seen a second stream (or a stream retire), a drop
  // records a fence on its stream when the bytes dropped there since its last fence reach
  // unfenced_bytes, or when the oldest of them was dropped more than unfenced_us microseconds ago
  // (0: no such bound). A stream destroyed without release_stream strands at most about that much
  // until a device synchronize. Other streams also ask for a fence when they want a stream's blocks.
  std::size_t unfenced_bytes = std::size_t{256} << 10;
  std::uint32_t unfenced_us = 10000;
  // A stream that neither allocates nor drops anything for one to two periods of idle_ms
  // milliseconds, and holds no live buffer, is forgotten (0: never): CUDA may destroy a stream and
  // never hand its handle to another, and the pool cannot tell. Its cached blocks go to other
  // streams once its last fence (or a device synchronize) covers them; if it is used again, it is
  // seen afresh.
  std::uint32_t idle_ms = 100;
  // One fence per drop, recorded at the drop: the simplest safe design, and the reference the
  // default is measured against.
  bool fence_every_free = false;
  // A stream that wants a block whose fence is recorded but not complete may wait on the fence
  // (cudaStreamWaitEvent) and take the block at once, instead of leaving it and growing.
  bool cross_stream_wait = false;
  StreamChecks stream_checks = StreamChecks::full;
  // Pool-wide peaks of requested bytes are exact while the pool has seen one stream, and to within
  // 2 x stats_granule per stream with several (0: exact, at the price of one shared atomic update
  // per allocation and drop; at most 1 TiB).
  std::size_t stats_granule = std::size_t{1} << 20;
  // Record every allocation and free of the pool to this file, as a trace that
  // `streampool-bench replay` reads (empty: no recording, the default). The file is created (or
  // truncated) when the pool is constructed, which throws Error(Errc::invalid_value) naming the
  // path when it cannot be opened. The recorder is a layer over the pool
  // (<streampool/trace_recorder.hpp> says what it writes, and how to start and stop it in code).
  // Through STREAMPOOL_CONF the path cannot contain a comma (the items' separator).
  std::string trace_file;
  // Tell compute-sanitizer which parts of the pool's segments are in use (NVTX's memory API: each
  // segment a sub-allocator heap, each live block a region), so that memcheck reports an access
  // past a block or after its drop, which it cannot see in a segment that is one valid
  // cudaMalloc. Off: no layer and no notification, nothing on the fast paths. On: a layer over
  // the device (lib/device/nvtx_memory.cpp) that takes a mutex per allocation and drop; without
  // a tool attached each NVTX call is a no-op. Run memcheck with `--nvtx yes` (the default since
  // CUDA 12.0).
  bool nvtx_memory = false;
  // Apply STREAMPOOL_CONF on top of these options when the pool is constructed. The options given
  // must be usable on their own (validate() is asked first, and its answer not blamed on the
  // environment).
  bool read_environment = true;

  // Parses "key=value,..." on top of `base`. Keys: smallest, per_doubling, largest, alignment,
  // slab, segment, large_rounding, large_shelf, expandable_segments, mapping, stream_homes,
  // max_reserved, unfenced,
  // unfenced_us, idle_ms, fence_every_free, cross_stream_wait, stream_checks
  // (none|identity|full), stats_granule, nvtx_memory, trace_file (a path, taken as written).
  // Sizes take a K, M or G suffix (binary); counts and times (per_doubling, large_shelf,
  // stream_homes, unfenced_us, idle_ms) are digits alone. Spaces, tabs and line ends around items,
  // keys and values, and empty items, are ignored; a key given twice takes its later value (each
  // value must be valid).
  // Throws Error(Errc::invalid_value) naming the bad key or value: an unknown or empty key, an
  // item without '=', a value that is empty, negative, not a number, too large for its field,
  // or, through validate(), options the pool cannot use (the key and its limit named).
  static PoolOptions parse(std::string_view conf, const PoolOptions& base);
  static PoolOptions parse(std::string_view conf);
  // `base` with STREAMPOOL_CONF applied, if it is set.
  static PoolOptions from_environment(const PoolOptions& base);
  // The conf line that parse() turns back into these options (trace_file only when set).
  // Throws Error(Errc::invalid_value) for a trace_file that a conf line cannot carry: one with a
  // comma, or with spaces at either end.
  std::string to_conf() const;
  // Why these options are unusable, or an empty string: the size classes (size_classes.hpp),
  // large_rounding a power of two from the alignment to 1 TiB, slab from 1 byte to 1 GiB,
  // segment from 1 byte to 1 TiB, mapping and stats_granule at most 1 TiB, trace_file without a NUL
  // character.
  std::string validate() const;

  friend bool operator==(const PoolOptions&, const PoolOptions&) = default;
};

}  // namespace streampool
