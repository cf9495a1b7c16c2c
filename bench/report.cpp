#include "report.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <unistd.h>

namespace streampool::bench {

std::string human_bytes(std::uint64_t bytes) {
  if (bytes >= (std::uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", double(bytes) / double(1 << 30));
  if (bytes >= (std::uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", double(bytes) / 1024.0);
  return fmt::format("{} B", bytes);
}

void write_json(Json& json, const ReplayReport& r) {
  json.begin_object()
      .field("trace", r.trace)
      .field("target", r.target)
      .field("config", r.config)
      .field("events", r.events)
      .field("allocations", r.allocations)
      .field("peak_requested_bytes", r.peak_requested)
      .field("peak_reserved_bytes", r.peak_reserved)
      .field("ratio", r.ratio())
      .field("waste_at_peak_bytes", r.waste_at_peak)
      .field("cache_hits", r.cache_hits)
      .field("cache_misses", r.cache_misses)
      .field("hit_rate", r.hit_rate())
      .field("device_allocations", r.device_allocations)
      .field("device_frees", r.device_frees)
      .field("fences", r.fences)
      .field("events_recorded", r.events_recorded)
      .field("cross_stream_reuses", r.cross_stream_reuses)
      .field("blocking_fallbacks", r.blocking_fallbacks)
      .field("oom_retries", r.oom_retries)
      .field("failed_allocations", r.failed_allocations)
      .field("seconds", r.seconds)
      .field("timed", r.timed)
      .field("ns_per_event", r.ns_per_event())
      .end_object();
}

Table replay_table(const std::vector<ReplayReport>& reports) {
  Table table;
  table.title = "Replay";
  table.header = {"trace", "target", "events", "peak requested", "peak reserved", "ratio",
                  "waste at peak", "hit rate", "device allocs", "fences", "cross-stream",
                  "ns / event"};
  for (const ReplayReport& r : reports) {
    table.rows.push_back(
        {r.trace, r.target, fmt::format("{}", r.events), human_bytes(r.peak_requested),
         human_bytes(r.peak_reserved), fmt::format("{:.3f}", r.ratio()),
         fmt::format("{:.1f}%", r.peak_requested ? 100.0 * double(r.waste_at_peak) /
                                                       double(r.peak_requested)
                                                 : 0.0),
         fmt::format("{:.1f}%", 100.0 * r.hit_rate()), fmt::format("{}", r.device_allocations),
         fmt::format("{}", r.fences), fmt::format("{}", r.cross_stream_reuses),
         r.timed ? fmt::format("{:.0f}", r.ns_per_event()) : std::string("n/a (fake)")});
  }
  return table;
}

Table tune_table(const std::vector<TuneRow>& rows, std::size_t top) {
  Table table;
  table.title = "Configurations, best first";
  table.note = "Ranked by failed allocations, then mean peak reserved / peak requested over the "
               "traces, then device allocations, then fences (summed over the traces).";
  table.header = {"rank", "mean ratio"};
  if (!rows.empty()) {
    for (const ReplayReport& r : rows.front().reports) table.header.push_back(r.trace);
  }
  for (const char* h : {"device allocs", "fences", "STREAMPOOL_CONF"}) table.header.push_back(h);
  for (std::size_t i = 0; i < rows.size() && i < top; ++i) {
    std::vector<std::string> row{fmt::format("{}", i + 1), fmt::format("{:.4f}", rows[i].mean_ratio)};
    for (const ReplayReport& r : rows[i].reports) row.push_back(fmt::format("{:.3f}", r.ratio()));
    row.push_back(fmt::format("{}", rows[i].device_allocations));
    row.push_back(fmt::format("{}", rows[i].fences));
    row.push_back(rows[i].options.to_conf());
    table.rows.push_back(std::move(row));
  }
  return table;
}

std::function<void(double)> progress_bar(const std::string& label) {
  if (isatty(STDERR_FILENO) == 0) return {};
  return [label, last = -1](double fraction) mutable {
    const int percent = static_cast<int>(fraction * 100.0);
    if (percent == last) return;
    last = percent;
    const int filled = percent * 30 / 100;
    std::fprintf(stderr, "\r%s [%-30s] %3d%%", label.c_str(), std::string(filled, '#').c_str(),
                 percent);
    if (percent >= 100) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

}  // namespace streampool::bench
