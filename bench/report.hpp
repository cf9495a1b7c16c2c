// Rendering the bench's results: text tables, JSON (documented keys), progress on a terminal.
#pragma once

#include "compare.hpp"
#include "json.hpp"
#include "replay.hpp"
#include "tune.hpp"

#include <functional>
#include <string>
#include <vector>

namespace streampool::bench {

// Keys (docs/bench.md): trace, target, config, events, allocations, peak_requested_bytes,
// peak_reserved_bytes, ratio, waste_at_peak_bytes, cache_hits, cache_misses, hit_rate,
// device_allocations, device_frees, fences, events_recorded, cross_stream_reuses,
// blocking_fallbacks, oom_retries, failed_allocations, seconds, timed, ns_per_event.
void write_json(Json& json, const ReplayReport& report);
Table replay_table(const std::vector<ReplayReport>& reports);
Table tune_table(const std::vector<TuneRow>& rows, std::size_t top);

// A progress callback drawing a bar on stderr when stderr is a terminal; a no-op otherwise.
std::function<void(double)> progress_bar(const std::string& label);

std::string human_bytes(std::uint64_t bytes);

}  // namespace streampool::bench
