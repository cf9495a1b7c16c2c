// streampool-bench: replay allocation traces, tune size classes, compare with every peer, stress
// the pool with real multi-stream work.
//
//   streampool-bench                      the main job: replays the embedded workloads
//   streampool-bench replay  [TRACE...] [--workload NAME]... [--config CONF] [--fake]
//                            [--timeline FILE.svg]
//   streampool-bench tune    [TRACE...] [--workload NAME]... [--top N] [--threads N] [--out DIR]
//   streampool-bench compare [TRACE...] [--workload NAME]... [--torch-summary FILE] [--out DIR]
//                            [--quick]
//   streampool-bench workloads --write DIR
//   streampool-bench stress  [--seconds S] [--threads T] [--churn N] [--config CONF]... [--fake]
//                            [--out DIR] [--interval I] [--max-growth X] [--seed N]
//                            (its own options: stress.hpp; `stress --help`)
//
// Common: --json (reports as JSON on stdout), --seed N (embedded workloads), --help.
#include "compare.hpp"
#include "report.hpp"
#include "stress.hpp"
#include "svg.hpp"
#include "trace.hpp"
#include "tune.hpp"
#include "workloads.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace sb = streampool::bench;
using streampool::PoolOptions;

namespace {

const char* usage =
    "usage: streampool-bench [replay|tune|compare|workloads|stress] [TRACE...] [options]\n"
    "\n"
    "  (no command)  replay the embedded workloads (the main job)\n"
    "  replay        replay traces through the pool, on the GPU if there is one\n"
    "  tune          search pool configurations on the traces, print the best as STREAMPOOL_CONF\n"
    "  compare       measure streampool against cudaMalloc, cudaMallocAsync, CUB and PyTorch\n"
    "  workloads     --write DIR: save the embedded workloads as CSV traces\n"
    "  stress        threads allocate, write, check and drop buffers on two streams each; fails\n"
    "                on corruption, races, growth or wrong stats (`stress --help`: its options)\n"
    "\n"
    "options:\n"
    "  --workload NAME    add an embedded workload (random, transformer, pipeline, all)\n"
    "  --config CONF      pool options as STREAMPOOL_CONF (key=value,...)\n"
    "  --fake             replay on the fake device even where there is a GPU\n"
    "  --json             print reports as JSON\n"
    "  --seed N           seed of the embedded workloads (default 1)\n"
    "  --timeline FILE    replay: write the reserved/requested timeline as SVG\n"
    "  --top N            tune: rows to print (default 10)\n"
    "  --threads N        tune: replays at a time (default: every core)\n"
    "  --wide             tune: search about a thousand configurations, not a few dozen\n"
    "  --out DIR          tune, compare: write plots, Markdown and CSV there\n"
    "  --torch-summary F  compare: PyTorch's figures for the traces (torch_summary.json)\n"
    "  --quick            compare: fewer sizes, threads and repeats\n";

struct Args {
  std::string command;
  std::vector<std::string> traces;
  std::vector<std::string> workloads;
  std::string config;
  std::string timeline;
  std::string out;
  std::string torch_summary;
  std::string write_dir;
  bool fake = false;
  bool json = false;
  bool quick = false;
  bool wide = false;
  std::uint64_t seed = 1;
  std::size_t top = 10;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
};

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "streampool-bench: " << message << "\n";
  std::exit(2);
}

std::uint64_t number(const std::string& option, const std::string& text) {
  try {
    std::size_t end = 0;
    const auto value = std::stoull(text, &end);
    if (end != text.size()) throw std::invalid_argument(text);
    return value;
  } catch (const std::exception&) {
    fail(fmt::format("{} needs a whole number, not '{}'", option, text));
  }
}

Args parse(int argc, char** argv) {
  Args args;
  int i = 1;
  if (i < argc && argv[i][0] != '-') args.command = argv[i++];
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    } else if (a == "--workload") args.workloads.push_back(next());
    else if (a == "--config") args.config = next();
    else if (a == "--timeline") args.timeline = next();
    else if (a == "--out") args.out = next();
    else if (a == "--torch-summary") args.torch_summary = next();
    else if (a == "--write") args.write_dir = next();
    else if (a == "--fake") args.fake = true;
    else if (a == "--json") args.json = true;
    else if (a == "--quick") args.quick = true;
    else if (a == "--wide") args.wide = true;
    else if (a == "--seed") args.seed = number(a, next());
    else if (a == "--top") args.top = number(a, next());
    else if (a == "--threads") args.threads = static_cast<unsigned>(number(a, next()));
    else if (!a.empty() && a[0] == '-') fail("unknown option " + a + "\n\n" + usage);
    else args.traces.push_back(a);
  }
  if (!args.command.empty() && args.command != "replay" && args.command != "tune" &&
      args.command != "compare" && args.command != "workloads") {
    // A first argument that is no command is a trace of the default command.
    args.traces.insert(args.traces.begin(), args.command);
    args.command = "replay";
  }
  return args;
}

std::vector<sb::Trace> load(const Args& args, bool default_workloads) {
  std::vector<sb::Trace> traces;
  for (const std::string& path : args.traces) traces.push_back(sb::read_trace(path));
  std::vector<std::string> names = args.workloads;
  if (names.empty() && traces.empty() && default_workloads) names = {"all"};
  for (const std::string& name : names) {
    if (name == "all") {
      for (const std::string& w : sb::workload_names()) traces.push_back(sb::make_workload(w, args.seed));
    } else {
      traces.push_back(sb::make_workload(name, args.seed));
    }
  }
  return traces;
}

PoolOptions options_of(const Args& args) {
  return args.config.empty() ? PoolOptions{} : PoolOptions::parse(args.config);
}

void write_file(const std::string& dir, const std::string& name, const std::string& content) {
  std::filesystem::create_directories(dir);
  std::ofstream(std::filesystem::path(dir) / name) << content;
}

int run_replay(const Args& args) {
  const std::vector<sb::Trace> traces = load(args, true);
  const sb::Target target = args.fake ? sb::fake_target() : sb::default_target();
  std::vector<sb::ReplayReport> reports;
  for (const sb::Trace& trace : traces) {
    sb::ReplayOptions options;
    options.pool = options_of(args);
    options.timeline_points = args.timeline.empty() ? 0 : 400;
    options.progress = sb::progress_bar("replay " + trace.name);
    reports.push_back(sb::replay(trace, target, options));
  }
  if (!args.timeline.empty() && !reports.empty()) {
    std::vector<sb::Series> series(2);
    series[0] = {"reserved", "#d62728", {}, {}};
    series[1] = {"requested", "#1f77b4", {}, {}};
    for (const auto& p : reports.front().timeline) {
      for (auto& s : series) s.x.push_back(double(p.event));
      series[0].y.push_back(double(p.reserved));
      series[1].y.push_back(double(p.requested));
    }
    std::ofstream(args.timeline) << sb::svg_plot(
        series, {"Reserved and requested bytes: " + reports.front().trace, "event", "bytes"});
  }
  if (args.json) {
    sb::Json json;
    json.begin_array();
    for (const auto& r : reports) sb::write_json(json, r);
    json.end_array();
    std::cout << json.str() << "\n";
  } else {
    std::cout << "target: " << target.description
              << (target.real ? "" : " (no GPU: memory figures only, no timings)") << "\n";
    std::cout << "config: " << options_of(args).to_conf() << "\n\n";
    std::cout << sb::replay_table(reports).markdown();
  }
  return 0;
}

int run_tune(const Args& args) {
  const std::vector<sb::Trace> traces = load(args, true);
  const auto grid = sb::tune_grid(options_of(args), args.wide);
  const auto rows = sb::tune(traces, grid, args.threads, sb::progress_bar("tune"));
  if (!args.out.empty()) {
    sb::Series all{"configurations", "#1f77b4", {}, {}};
    for (const auto& row : rows) {
      all.x.push_back(double(row.device_allocations));
      all.y.push_back(row.mean_ratio);
    }
    sb::PlotOptions scatter{"Trade-off: device allocations vs mean peak reserved / requested",
                            "device allocations (summed over traces)", "mean reserved / requested",
                            false, false, 0};
    write_file(args.out, "tune-tradeoff.svg", sb::svg_plot({all}, scatter));
    // The chosen configuration's timeline on the first trace.
    sb::ReplayOptions options;
    options.pool = rows.front().options;
    options.timeline_points = 400;
    const auto report = sb::replay(traces.front(), sb::fake_target(), options);
    std::vector<sb::Series> series{{"reserved", "#d62728", {}, {}}, {"requested", "#1f77b4", {}, {}}};
    for (const auto& p : report.timeline) {
      for (auto& s : series) s.x.push_back(double(p.event));
      series[0].y.push_back(double(p.reserved));
      series[1].y.push_back(double(p.requested));
    }
    write_file(args.out, "tune-timeline.svg",
               sb::svg_plot(series, {"Chosen configuration on " + report.trace, "event", "bytes"}));
    write_file(args.out, "tune.md", sb::tune_table(rows, rows.size()).markdown());
    write_file(args.out, "tune.csv", sb::tune_table(rows, rows.size()).csv());
  }
  if (args.json) {
    sb::Json json;
    json.begin_array();
    for (const auto& row : rows) {
      json.begin_object()
          .field("config", row.options.to_conf())
          .field("mean_ratio", row.mean_ratio)
          .field("device_allocations", row.device_allocations)
          .field("fences", row.fences)
          .field("failed_allocations", row.failed_allocations)
          .key("traces")
          .begin_array();
      for (const auto& r : row.reports) sb::write_json(json, r);
      json.end_array().end_object();
    }
    json.end_array();
    std::cout << json.str() << "\n";
  } else {
    std::cout << fmt::format("{} configurations x {} traces on the fake device\n\n", grid.size(),
                             traces.size());
    std::cout << sb::tune_table(rows, args.top).markdown() << "\n";
    std::cout << "recommended:\nSTREAMPOOL_CONF=" << rows.front().options.to_conf() << "\n";
  }
  return 0;
}

int run_compare(const Args& args) {
  const std::vector<sb::Trace> traces = load(args, false);
  std::vector<sb::Table> tables;
  const PoolOptions options = options_of(args);
  if (streampool::CudaDevice::count() == 0 || args.fake) {
    std::cout << "no GPU: comparing only what does not depend on one (memory on the fake "
                 "device)\n\n";
    std::vector<sb::Trace> memory_traces = traces;
    if (memory_traces.empty()) {
      for (const auto& w : sb::workload_names()) memory_traces.push_back(sb::make_workload(w, args.seed));
    }
    tables.push_back(sb::memory_table(memory_traces, options, args.torch_summary));
  } else {
    sb::CompareOptions compare;
    if (args.quick) {
      compare.sizes = {256, 65536, 16 << 20};
      compare.threads = {1, 4, 16};
      compare.repeats = 3;
      compare.seconds_per_point = 0.02;
    }
    auto peers = sb::all_peers();
    tables.push_back(sb::latency_table(peers, compare));
    tables.push_back(sb::scaling_table(peers, compare));
    tables.push_back(sb::handoff_table(peers, compare));
    if (!traces.empty()) {
      tables.push_back(sb::trace_table(peers, traces));
      tables.push_back(sb::memory_table(traces, options, args.torch_summary));
    }
  }
  for (std::size_t i = 0; i < tables.size(); ++i) {
    if (args.json) continue;
    std::cout << tables[i].markdown() << "\n";
    if (!args.out.empty()) write_file(args.out, fmt::format("compare-{}.csv", i + 1), tables[i].csv());
  }
  if (!args.out.empty()) {
    std::string md;
    for (const auto& t : tables) md += t.markdown() + "\n";
    write_file(args.out, "compare.md", md);
  }
  if (args.json) {
    sb::Json json;
    json.begin_array();
    for (const auto& t : tables) {
      json.begin_object().field("title", t.title).key("header").begin_array();
      for (const auto& h : t.header) json.value(h);
      json.end_array().key("rows").begin_array();
      for (const auto& row : t.rows) {
        json.begin_array();
        for (const auto& cell : row) json.value(cell);
        json.end_array();
      }
      json.end_array().end_object();
    }
    json.end_array();
    std::cout << json.str() << "\n";
  }
  return 0;
}

int run_workloads(const Args& args) {
  if (args.write_dir.empty()) fail("workloads needs --write DIR");
  std::filesystem::create_directories(args.write_dir);
  for (const std::string& name : sb::workload_names()) {
    const auto path = std::filesystem::path(args.write_dir) / (name + ".csv");
    std::ofstream out(path);
    sb::write_trace(out, sb::make_workload(name, args.seed));
    std::cout << path.string() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // stress has options of its own, parsed (and tested) in stress.cpp.
  if (argc > 1 && std::string(argv[1]) == "stress") {
    return sb::stress_command(std::vector<std::string>(argv + 2, argv + argc));
  }
  const Args args = parse(argc, argv);
  try {
    if (args.command == "tune") return run_tune(args);
    if (args.command == "compare") return run_compare(args);
    if (args.command == "workloads") return run_workloads(args);
    return run_replay(args);
  } catch (const sb::TraceError& e) {
    std::cerr << "streampool-bench: " << e.what() << "\n";
  } catch (const streampool::Error& e) {
    std::cerr << "streampool-bench: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "streampool-bench: " << e.what() << "\n";
  }
  return 1;
}
