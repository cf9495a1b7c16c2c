#include "report.hpp"

#include <fmt/format.h>

#include "settings.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <stdexcept>
#include <cstdio>
#include <unistd.h>

namespace streampool::bench {

std::string human_bytes(std::uint64_t bytes) {
  if (bytes >= (std::uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", double(bytes) / double(1 << 30));
  if (bytes >= (std::uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", double(bytes) / 1024.0);
  return fmt::format("{} B", bytes);
}

nlohmann::json replay_json(const ReplayReport& r) {
  nlohmann::json json = {{"trace", r.trace},
          {"target", r.target},
          {"config", r.config},
          {"raw", r.raw},
          {"events", r.events},
          {"allocations", r.allocations},
          {"peak_requested_bytes", r.peak_requested},
          {"replayed_peak_requested_bytes", r.replayed_peak_requested},
          {"peak_reserved_bytes", r.peak_reserved},
          {"ratio", r.ratio()},
          {"waste_at_peak_bytes", r.waste_at_peak},
          {"cache_hits", r.cache_hits},
          {"cache_misses", r.cache_misses},
          {"hit_rate", r.hit_rate()},
          {"device_allocations", r.device_allocations},
          {"device_frees", r.device_frees},
          {"fences", r.fences},
          {"events_recorded", r.events_recorded},
          {"cross_stream_reuses", r.cross_stream_reuses},
          {"blocking_fallbacks", r.blocking_fallbacks},
          {"oom_retries", r.oom_retries},
          {"growth_waits", r.growth_waits},
          {"failed_allocations", r.failed_allocations},
          {"unmatched_frees", r.unmatched_frees},
          {"empty_allocations", r.empty_allocations},
          {"left_live", r.left_live},
          {"seconds", r.seconds},
          {"timed", r.timed},
          {"ns_per_event", r.ns_per_event()}};
  if (r.calls_counted) {
    nlohmann::json calls = nlohmann::json::array();
    for (const DeviceCallCount& c : r.device_calls) {
      calls.push_back({{"call", c.call}, {"calls", c.calls}, {"ns", c.ns}});
    }
    json["device_calls"] = std::move(calls);
  }
  return json;
}

nlohmann::json table_json(const Table& table) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : table.rows) {
    nlohmann::json cells = nlohmann::json::array();
    for (std::size_t i = 0; i < row.size(); ++i) {
      const std::string& cell = row[i];
      double number = 0;
      const char* end = cell.data() + cell.size();
      const auto [stop, error] = std::from_chars(cell.data(), end, number);
      if (i < table.label_columns) cells.push_back(cell);
      else if (cell == "n/a") cells.push_back(nullptr);
      else if (!cell.empty() && error == std::errc() && stop == end) cells.push_back(number);
      else cells.push_back(cell);
    }
    rows.push_back(std::move(cells));
  }
  return {{"title", table.title}, {"header", table.header}, {"rows", std::move(rows)}};
}

std::string json_text(const nlohmann::json& json) {
  return json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

Table replay_table(const std::vector<ReplayReport>& reports) {
  Table table;
  table.title = "Replay";
  table.header = {"trace", "target", "events", "failed allocations", "peak requested",
                  "peak reserved", "ratio", "waste at peak", "hit rate", "device allocs", "fences",
                  "cross-stream", "ns / event"};
  for (const ReplayReport& r : reports) {
    table.rows.push_back(
        {r.trace, r.target, fmt::format("{}", r.events), fmt::format("{}", r.failed_allocations),
         human_bytes(r.peak_requested),
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

Table device_calls_table(const std::vector<ReplayReport>& reports) {
  Table table;
  table.title = "Device calls";
  table.note = "The pool's calls through its device seam (include/streampool/device_calls.def), "
               "from its construction to its destruction, and the CPU time spent in them.";
  table.header = {"trace", "call", "calls", "us in all", "us a call"};
  table.label_columns = 2;
  for (const ReplayReport& r : reports) {
    if (!r.calls_counted) continue;
    for (const DeviceCallCount& c : r.device_calls) {
      const double us = double(c.ns) / 1e3;
      table.rows.push_back(
          {r.trace, c.call, fmt::format("{}", c.calls),
           r.timed ? fmt::format("{:.1f}", us) : std::string("n/a (fake)"),
           r.timed ? fmt::format("{:.2f}", us / double(c.calls)) : std::string("n/a (fake)")});
    }
  }
  return table;
}

const TuneRow& tune_baseline(const std::vector<TuneRow>& rows) {
  const auto it = std::find_if(rows.begin(), rows.end(), [](const TuneRow& r) { return r.baseline; });
  return it != rows.end() ? *it : rows.front();
}

std::string tune_changes(const std::vector<TuneRow>& rows, const TuneRow& row) {
  return conf_line(changed_items(tune_baseline(rows).options, row.options));
}

Table tune_table(const std::vector<TuneRow>& rows, std::size_t top) {
  Table table;
  table.title = "Configurations, best first";
  table.note = "Ranked by failed allocations, then mean peak reserved / peak requested over the "
               "traces, then device allocations, then fences (summed over the traces). The "
               "baseline is the configuration in use (the defaults, then STREAMPOOL_CONF, then "
               "--config); each row names the keys it changes from it.";
  table.header = {"rank", "mean ratio"};
  if (!rows.empty()) {
    for (const ReplayReport& r : rows.front().reports) table.header.push_back(r.trace);
  }
  for (const char* h : {"failed allocations", "device allocs", "fences", "changes from the baseline"}) {
    table.header.push_back(h);
  }
  const auto line = [&](std::size_t i, std::string rank) {
    const TuneRow& row = rows[i];
    std::vector<std::string> cells{std::move(rank), fmt::format("{:.4f}", row.mean_ratio)};
    for (const ReplayReport& r : row.reports) cells.push_back(fmt::format("{:.3f}", r.ratio()));
    cells.push_back(fmt::format("{}", row.failed_allocations));
    cells.push_back(fmt::format("{}", row.device_allocations));
    cells.push_back(fmt::format("{}", row.fences));
    cells.push_back(row.baseline ? std::string("(baseline)") : tune_changes(rows, row));
    table.rows.push_back(std::move(cells));
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].baseline) line(i, fmt::format("baseline ({})", i + 1));
  }
  for (std::size_t i = 0; i < rows.size() && i < top; ++i) {
    line(i, rows[i].baseline ? fmt::format("{} (baseline)", i + 1) : fmt::format("{}", i + 1));
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

void write_file(const std::filesystem::path& path, const std::string& content) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream file(path);
  file << content;
  file.close();
  if (!file) throw std::runtime_error(fmt::format("cannot write {}", path.string()));
}

}  // namespace streampool::bench
