#include "cli.hpp"

#include "compare.hpp"
#include "report.hpp"
#include "settings.hpp"
#include "stress.hpp"
#include "svg.hpp"
#include "trace.hpp"
#include "tune.hpp"
#include "workloads.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace streampool::bench {

CLI::Validator whole_number(std::uint64_t least, std::uint64_t most) {
  const std::string range = most == std::numeric_limits<std::uint64_t>::max()
                                ? fmt::format("{} or more", least)
                                : fmt::format("{} to {}", least, most);
  return CLI::Validator(
      [least, most, range](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (digits && error == std::errc() && stop == end && value >= least && value <= most) return {};
        return fmt::format("needs a whole number, {}, not '{}'", range, text);
      },
      range);
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (!text.empty() && error == std::errc() && stop == end && std::isfinite(value) && value > 0) {
          return {};
        }
        return fmt::format("needs a positive number, not '{}'", text);
      },
      "above 0");
}

namespace {

// Stretches of events in a --timeline: more than the plot's pixel columns, so that every column
// gets the lowest and highest values of its events (svg.hpp).
constexpr std::size_t timeline_stretches = 2000;

// What the trace-reading subcommands share.
struct Inputs {
  std::vector<std::string> traces;
  std::vector<std::string> workloads;
  std::string config;
  std::uint64_t seed = 1;
  bool json = false;
};

struct Args {
  Inputs in;
  bool fake = false;
  bool raw = false;   // replay: through MemoryPool::allocate and deallocate
  bool calls = false;  // replay: count the pool's device calls by kind
  std::string timeline;
  bool wide = false;
  std::size_t top = 10;
  std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  std::string out;
  std::string torch_summary;
  bool quick = false;
  std::string write_dir;
  StressOptions stress;
};

// A failure of the run, not of the command line: exit status 1.
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void add_inputs(CLI::App& app, Inputs& in, bool with_config) {
  app.add_option("traces", in.traces, "trace files (CSV, plain or gzip'd; docs/bench.md)");
  std::vector<std::string> names = workload_names();
  names.push_back("all");
  app.add_option("--workload", in.workloads,
                 "add an embedded workload (random, transformer, pipeline, all); repeatable")
      ->allow_extra_args(false)
      ->check(CLI::IsMember(names));
  app.add_option("--seed", in.seed, "seed of the embedded workloads")
      ->check(whole_number(0, std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();
  if (with_config) {
    app.add_option("--config", in.config,
                   "pool options as STREAMPOOL_CONF (key=value,...), applied on top of the "
                   "environment's STREAMPOOL_CONF");
  }
  app.add_flag("--json", in.json, "print the report as JSON on stdout (messages go to stderr)");
}

// A file to be written: its folder must exist (a typo in it should not cost a whole run).
CLI::Validator in_existing_folder() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        const std::filesystem::path folder = std::filesystem::path(path).parent_path();
        if (folder.empty() || std::filesystem::is_directory(folder)) return {};
        return fmt::format("the folder {} does not exist", folder.string());
      },
      "FILE");
}

std::vector<Trace> load(const Inputs& in, bool default_workloads) {
  std::vector<Trace> traces;
  for (const std::string& path : in.traces) traces.push_back(read_trace(path));
  std::vector<std::string> names = in.workloads;
  if (names.empty() && traces.empty() && default_workloads) names = {"all"};
  for (const std::string& name : names) {
    if (name == "all") {
      for (const std::string& w : workload_names()) traces.push_back(make_workload(w, in.seed));
    } else {
      traces.push_back(make_workload(name, in.seed));
    }
  }
  return traces;
}

// The plot's lines from a replay's timeline: each stretch's lowest and highest values.
std::vector<Series> timeline_series(const ReplayReport& report) {
  std::vector<Series> series{{"reserved", "#d62728", {}, {}}, {"requested", "#1f77b4", {}, {}}};
  for (const TimelinePoint& p : report.timeline) {
    for (Series& s : series) s.x.insert(s.x.end(), 2, double(p.event));
    series[0].y.push_back(double(p.reserved_min));
    series[0].y.push_back(double(p.reserved_max));
    series[1].y.push_back(double(p.requested_min));
    series[1].y.push_back(double(p.requested_max));
  }
  return series;
}

PlotOptions timeline_plot(std::string title, std::vector<std::string> notes) {
  PlotOptions plot;
  plot.title = std::move(title);
  plot.x_label = "event";
  plot.y_label = "bytes";
  plot.x_unit = Unit::count;
  plot.y_unit = Unit::bytes;
  plot.notes = std::move(notes);
  return plot;
}

// "key=value,..." of the options' keys that differ from the defaults, or "the defaults".
std::string differences_from_defaults(const PoolOptions& options) {
  const std::string line = conf_line(changed_items(PoolOptions{}, options));
  return line.empty() ? std::string("the defaults") : line;
}

int run_replay(const Args& args, std::ostream& out, std::ostream& err) {
  const Settings settings = user_settings(args.in.config);
  const std::vector<Trace> traces = load(args.in, true);
  const Target target = args.fake ? fake_target() : default_target();
  std::vector<ReplayReport> reports;
  for (const Trace& trace : traces) {
    ReplayOptions options;
    options.pool = settings.options;
    options.timeline_points = args.timeline.empty() ? 0 : timeline_stretches;
    options.raw = args.raw;
    options.count_calls = args.calls;
    options.progress = progress_bar("replay " + trace.name);
    reports.push_back(replay(trace, target, options));
  }
  if (!args.timeline.empty() && !reports.empty()) {
    const ReplayReport& first = reports.front();
    write_file(args.timeline,
               svg_plot(timeline_series(first),
                        timeline_plot("Reserved and requested bytes: " + first.trace,
                                      {"configuration: " + differences_from_defaults(settings.options),
                                       "settings from " + settings.origin() + "; " + first.target})));
  }
  if (args.in.json) {
    nlohmann::json json = nlohmann::json::array();
    for (const auto& r : reports) json.push_back(replay_json(r));
    out << json_text(json) << "\n";
  } else {
    out << "target: " << target.description
        << (target.real ? "" : " (no GPU: memory figures only, no timings)") << "\n";
    out << "settings: " << settings.origin() << "\n";
    out << "config: " << settings.options.to_conf() << "\n";
    out << "through: "
        << (args.raw ? "MemoryPool::allocate and deallocate (--raw)"
                     : "PooledBuffer, with record_stream for a block another stream used")
        << "\n\n";
    out << replay_table(reports).markdown();
    if (args.calls) out << "\n" << device_calls_table(reports).markdown();
  }
  for (const auto& r : reports) {
    const auto plural = [](std::uint64_t n, std::string_view one, std::string_view many) {
      return fmt::format("{} {}", n, n == 1 ? one : many);
    };
    std::vector<std::string> left_out;
    if (r.unmatched_frees != 0) {
      left_out.push_back(plural(r.unmatched_frees, "free of a pointer the trace never allocated",
                                "frees of pointers the trace never allocated"));
    }
    if (r.empty_allocations != 0) {
      left_out.push_back(plural(r.empty_allocations, "request of 0 bytes", "requests of 0 bytes"));
    }
    if (!left_out.empty()) {
      err << fmt::format("streampool-bench: replay: {}: left out {} (docs/bench.md, \"Traces\")\n",
                         r.trace, fmt::join(left_out, " and "));
    }
  }
  std::uint64_t failed = 0;
  for (const auto& r : reports) {
    if (r.failed_allocations == 0) continue;
    failed += r.failed_allocations;
    err << fmt::format("streampool-bench: replay: {} of {} allocations failed in {}\n",
                       r.failed_allocations, r.allocations, r.trace);
  }
  return failed == 0 ? 0 : 1;
}

int run_tune(const Args& args, std::ostream& out, std::ostream&) {
  const Settings settings = user_settings(args.in.config);
  const std::vector<Trace> traces = load(args.in, true);
  const auto grid = tune_grid(settings.options, args.wide);
  const auto rows = tune(traces, grid, static_cast<unsigned>(std::min<std::size_t>(
                                           args.threads, std::numeric_limits<unsigned>::max())),
                         progress_bar("tune"));
  const TuneRow& best = rows.front();
  const std::vector<ConfItem> changes = changed_items(settings.options, best.options);
  // The user's own items, the changed keys replacing theirs: never a key of theirs lost.
  const std::string recommended = conf_line(merge_items(settings.items, changes));
  const std::string chosen =
      best.baseline ? "the baseline (" + settings.origin() + ")"
                    : conf_line(changes) + " on top of " + settings.origin();

  if (!args.out.empty()) {
    const std::filesystem::path dir(args.out);
    Series all{"configurations", "#1f77b4", {}, {}};
    Series baseline{"baseline", "#d62728", {}, {}};
    for (const auto& row : rows) {
      Series& s = row.baseline ? baseline : all;
      s.x.push_back(double(row.device_allocations));
      s.y.push_back(row.mean_ratio);
    }
    PlotOptions scatter;
    scatter.title = "Trade-off: device allocations vs mean peak reserved / requested";
    scatter.x_label = "device allocations (summed over traces)";
    scatter.y_label = "mean reserved / requested";
    scatter.lines = false;
    scatter.y_unit = Unit::ratio;
    scatter.y_from_zero = false;  // ratios sit just above 1: from zero they would be one line
    scatter.highlight = best.baseline ? -1 : 0;
    scatter.notes = {best.baseline ? "recommended: the baseline, in red (" + settings.origin() + ")"
                                   : "ringed: the recommended configuration, " + chosen};
    std::vector<Series> points{all};
    if (!baseline.x.empty()) points.push_back(baseline);
    write_file(dir / "tune-tradeoff.svg", svg_plot(points, scatter));
    // The chosen configuration's timeline on the first trace.
    ReplayOptions options;
    options.pool = best.options;
    options.timeline_points = timeline_stretches;
    const auto report = replay(traces.front(), fake_target(), options);
    write_file(dir / "tune-timeline.svg",
               svg_plot(timeline_series(report),
                        timeline_plot("Chosen configuration on " + report.trace,
                                      {"chosen: " + chosen})));
    write_file(dir / "tune.md", tune_table(rows, rows.size()).markdown());
    write_file(dir / "tune.csv", tune_table(rows, rows.size()).csv());
  }
  if (args.in.json) {
    nlohmann::json configurations = nlohmann::json::array();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const TuneRow& row = rows[i];
      nlohmann::json traces_json = nlohmann::json::array();
      for (const auto& r : row.reports) traces_json.push_back(replay_json(r));
      configurations.push_back({{"rank", i + 1},
                                {"baseline", row.baseline},
                                {"config", row.options.to_conf()},
                                {"changes", tune_changes(rows, row)},
                                {"mean_ratio", row.mean_ratio},
                                {"device_allocations", row.device_allocations},
                                {"fences", row.fences},
                                {"failed_allocations", row.failed_allocations},
                                {"traces", std::move(traces_json)}});
    }
    out << json_text({{"settings", settings.line()},
                      {"recommended", recommended},
                      {"changes", conf_line(changes)},
                      {"configurations", std::move(configurations)}})
        << "\n";
  } else {
    out << fmt::format("{} configurations x {} traces on the fake device; baseline: {}\n\n",
                       grid.size(), traces.size(), settings.origin());
    out << tune_table(rows, args.top).markdown() << "\n";
    if (best.baseline) {
      out << "recommended: the baseline; no configuration searched ranks before it on these "
             "traces\n";
    } else {
      out << "recommended: " << conf_line(changes) << " (rank 1), on top of "
          << settings.origin() << "\n";
    }
    out << "STREAMPOOL_CONF=" << recommended << "\n";
  }
  return 0;
}

int run_compare(const Args& args, std::ostream& out, std::ostream& err) {
  const Settings settings = user_settings(args.in.config);
  const std::vector<Trace> traces = load(args.in, false);
  std::vector<Table> tables;
  if (args.fake || CudaDevice::count() == 0) {
    err << "streampool-bench: compare: no GPU" << (args.fake ? " (--fake)" : "")
        << ": comparing only what does not depend on one (memory on the fake device)\n";
    std::vector<Trace> memory_traces = traces;
    if (memory_traces.empty()) {
      for (const auto& w : workload_names()) memory_traces.push_back(make_workload(w, args.in.seed));
    }
    tables.push_back(memory_table(memory_traces, settings.options, args.torch_summary));
  } else {
    CompareOptions compare;
    if (args.quick) {
      compare.sizes = {256, 65536, 16 << 20};
      compare.threads = {1, 4, 16};
      compare.repeats = 3;
      compare.seconds_per_point = 0.02;
    }
    auto peers = all_peers(settings);
    tables.push_back(latency_table(peers, compare));
    tables.push_back(scaling_table(peers, compare));
    tables.push_back(handoff_table(peers, compare));
    if (!traces.empty()) {
      tables.push_back(trace_table(peers, traces));
      tables.push_back(memory_table(traces, settings.options, args.torch_summary));
    }
  }
  if (!args.out.empty()) {
    const std::filesystem::path dir(args.out);
    std::string md;
    for (std::size_t i = 0; i < tables.size(); ++i) {
      write_file(dir / fmt::format("compare-{}.csv", i + 1), tables[i].csv());
      md += tables[i].markdown() + "\n";
    }
    write_file(dir / "compare.md", md);
  }
  if (args.in.json) {
    nlohmann::json json = nlohmann::json::array();
    for (const auto& t : tables) json.push_back(table_json(t));
    out << json_text(json) << "\n";
  } else {
    for (const auto& t : tables) out << t.markdown() << "\n";
  }
  return 0;
}

int run_workloads(const Args& args, std::ostream& out) {
  for (const std::string& name : workload_names()) {
    const auto path = std::filesystem::path(args.write_dir) / (name + ".csv");
    std::ofstream file(path);
    write_trace(file, make_workload(name, args.in.seed));
    file.close();
    if (!file) throw RunError(fmt::format("cannot write {}", path.string()));
    out << path.string() << "\n";
  }
  return 0;
}

bool is_command(const std::string& word) {
  for (const char* name : {"replay", "tune", "compare", "workloads", "stress"}) {
    if (word == name) return true;
  }
  return word == "-h" || word == "--help";
}

}  // namespace

int bench_main(std::vector<std::string> args, std::ostream& out, std::ostream& err) {
  // A first argument that is no subcommand starts a replay command line (the main job: none).
  if (args.empty() || !is_command(args.front())) args.insert(args.begin(), "replay");

  Args a;
  CLI::App app{"Replays allocation traces through streampool, tunes its configuration, compares "
               "it with other allocators and stresses it with real multi-stream work. Without a "
               "subcommand, `replay` (with no arguments: the embedded workloads, the main job). "
               "Pool settings: the defaults, then STREAMPOOL_CONF, then --config.",
               "streampool-bench"};
  app.require_subcommand(1);
  app.fallthrough(false);

  CLI::App* replay_cmd = app.add_subcommand(
      "replay", "replay traces through the pool, on the GPU if there is one; exits with 1 when "
                "an allocation failed");
  add_inputs(*replay_cmd, a.in, true);
  replay_cmd->add_flag("--fake", a.fake, "replay on the fake device even where there is a GPU");
  replay_cmd->add_flag("--raw", a.raw,
                       "through MemoryPool::allocate and deallocate (a free of a block another "
                       "stream used is a deallocate on that stream, as with cudaFreeAsync), not "
                       "PooledBuffer and record_stream");
  replay_cmd->add_flag("--calls", a.calls,
                       "count the pool's device calls of each kind, and on a GPU the time in "
                       "them (each call then costs two clock reads more)");
  replay_cmd->add_option("--timeline", a.timeline,
                         "write the first trace's reserved and requested bytes over its events "
                         "as SVG (the folder must exist)")
      ->check(in_existing_folder());

  CLI::App* tune_cmd = app.add_subcommand(
      "tune", "search pool configurations on the fake device and recommend the best, as the "
              "keys it changes on top of your settings");
  add_inputs(*tune_cmd, a.in, true);
  tune_cmd->add_flag("--wide", a.wide, "search about two thousand configurations, not a few dozen");
  tune_cmd->add_option("--top", a.top, "rows to print besides the baseline")
      ->check(whole_number(1, std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();
  tune_cmd->add_option("--threads", a.threads, "replays at a time (default: every core)")
      ->check(whole_number(1, std::numeric_limits<unsigned>::max()));
  tune_cmd->add_option("--out", a.out,
                       "write tune-tradeoff.svg, tune-timeline.svg, tune.md and tune.csv there");

  CLI::App* compare_cmd = app.add_subcommand(
      "compare", "measure streampool against cudaMalloc, cudaMallocAsync, CUB and PyTorch (on a "
                 "GPU; without one, memory figures only)");
  add_inputs(*compare_cmd, a.in, true);
  compare_cmd->add_flag("--fake", a.fake, "compare only memory, on the fake device, even on a GPU");
  compare_cmd->add_option("--torch-summary", a.torch_summary,
                          "PyTorch's figures for the traces (torch_summary.json)")
      ->check(CLI::ExistingFile);
  compare_cmd->add_option("--out", a.out, "write compare.md and compare-N.csv there");
  compare_cmd->add_flag("--quick", a.quick, "fewer sizes, threads and repeats");

  CLI::App* workloads_cmd =
      app.add_subcommand("workloads", "save the embedded workloads as CSV traces");
  workloads_cmd->add_option("--write", a.write_dir, "the folder to write them in")
      ->required()
      ->check(CLI::ExistingDirectory);
  workloads_cmd->add_option("--seed", a.in.seed, "seed of the embedded workloads")
      ->check(whole_number(0, std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();

  CLI::App* stress_cmd = app.add_subcommand(
      "stress", "threads allocate, write, check and drop buffers on two streams each; fails on "
                "corruption, races, growth or wrong stats");
  stress_cmd->footer(stress_description);
  a.stress.configs.clear();
  add_stress_options(*stress_cmd, a.stress);

  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    err << "streampool-bench " << args.front() << ": " << e.what() << "\n"
        << "(streampool-bench " << args.front() << " --help lists its options)\n";
    return 2;
  }

  try {
    if (stress_cmd->parsed()) {
      check_stress_options(a.stress);
      return stress_command(a.stress, out, err);
    }
    if (tune_cmd->parsed()) return run_tune(a, out, err);
    if (compare_cmd->parsed()) return run_compare(a, out, err);
    if (workloads_cmd->parsed()) return run_workloads(a, out);
    return run_replay(a, out, err);
  } catch (const SettingsError& e) {
    err << "streampool-bench " << args.front() << ": " << e.what() << "\n";
    return 2;
  } catch (const StressUsageError& e) {
    err << "streampool-bench stress: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "streampool-bench " << args.front() << ": " << e.what() << "\n";
  }
  return 1;
}

}  // namespace streampool::bench
