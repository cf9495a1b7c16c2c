#include "compare.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <stdexcept>
#include <thread>
#include <utility>

namespace streampool::bench {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string bytes_label(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}

// ns per pair: pairs in batches that double until a batch takes `seconds`.
double time_pairs(Peer& peer, std::size_t bytes, cudaStream_t stream, double seconds) {
  for (int i = 0; i < 4; ++i) peer.pair(bytes, stream);  // warm: the cache holds a block
  for (std::size_t n = 16;; n *= 2) {
    const auto start = Clock::now();
    for (std::size_t i = 0; i < n; ++i) peer.pair(bytes, stream);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed >= seconds || n >= (std::size_t{1} << 26)) return elapsed * 1e9 / double(n);
  }
}

std::string format_ns(double ns) {
  return ns >= 10000 ? fmt::format("{:.0f}", ns) : fmt::format("{:.1f}", ns);
}

}  // namespace

std::string Table::markdown() const {
  // Appended piece by piece: GCC 12 warns (falsely, -Wrestrict) on `" " + s + " |"`.
  std::string out = fmt::format("### {}\n\n", title);
  if (!note.empty()) out.append(note).append("\n\n");
  const auto line = [&out](const std::vector<std::string>& cells) {
    out.append("|");
    for (const auto& cell : cells) out.append(" ").append(cell).append(" |");
    out.append("\n");
  };
  line(header);
  out.append("|");
  for (std::size_t i = 0; i < header.size(); ++i) out.append(i == 0 ? " --- |" : " ---: |");
  out.append("\n");
  for (const auto& row : rows) line(row);
  return out;
}

std::string Table::csv() const {
  std::string out;
  const auto line = [&out](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (i != 0) out.append(",");
      const std::string& s = cells[i];
      if (s.find_first_of(",\"") == std::string::npos) {
        out.append(s);
        continue;
      }
      out.append("\"");
      for (char c : s) out.append(c == '"' ? "\"\"" : std::string(1, c));
      out.append("\"");
    }
    out.append("\n");
  };
  line(header);
  for (const auto& row : rows) line(row);
  return out;
}

Table latency_table(std::vector<std::unique_ptr<Peer>>& peers, const CompareOptions& options) {
  Table table;
  table.title = "Allocate + free pair, one stream (ns per pair, median)";
  table.note = fmt::format("Median of {} runs; each run times every allocator at every size in "
                           "turn, batches of pairs until one takes {} s (a slow spell of the "
                           "machine falls on all allocators and sizes alike). streampool pairs "
                           "are PooledBuffer lives.",
                           options.repeats, options.seconds_per_point);
  table.header.push_back("allocator");
  for (std::size_t bytes : options.sizes) table.header.push_back(bytes_label(bytes));
  cudaStream_t stream = new_stream();
  // runs[p][i]: allocator p's times at size i, one a run. The runs go round the allocators (a
  // slow spell of a host once fell on the first two rows alone: h100-c5a6381.md).
  std::vector<std::vector<std::vector<double>>> runs(
      peers.size(), std::vector<std::vector<double>>(options.sizes.size()));
  for (int r = 0; r < options.repeats; ++r) {
    for (std::size_t p = 0; p < peers.size(); ++p) {
      for (std::size_t i = 0; i < options.sizes.size(); ++i) {
        runs[p][i].push_back(
            time_pairs(*peers[p], options.sizes[i], stream, options.seconds_per_point));
      }
    }
  }
  for (std::size_t p = 0; p < peers.size(); ++p) {
    std::vector<std::string> row{peers[p]->name()};
    for (const auto& of_size : runs[p]) row.push_back(format_ns(median(of_size)));
    peers[p]->forget_stream(stream);
    peers[p]->release_cached();
    table.rows.push_back(std::move(row));
  }
  cudaStreamDestroy(stream);
  return table;
}

Table scaling_table(std::vector<std::unique_ptr<Peer>>& peers, const CompareOptions& options) {
  Table table;
  table.title = fmt::format("Threads, each on its own stream: {} pairs (million pairs per second "
                            "in total, median)",
                            bytes_label(options.thread_bytes));
  table.note = fmt::format("All threads start together and run for {} s; median of {} runs.",
                           options.seconds_per_point * 4, options.repeats);
  table.header.push_back("allocator");
  for (int t : options.threads) table.header.push_back(fmt::format("{} thread{}", t, t > 1 ? "s" : ""));
  for (auto& peer : peers) {
    std::vector<std::string> row{peer->name()};
    for (int threads : options.threads) {
      std::vector<cudaStream_t> streams;
      for (int t = 0; t < threads; ++t) streams.push_back(new_stream());
      std::vector<double> runs;
      for (int r = 0; r < options.repeats; ++r) {
        std::atomic<bool> stop{false};
        std::atomic<std::uint64_t> total{0};
        std::barrier start(threads + 1);
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
          workers.emplace_back([&, t] {
            peer->pair(options.thread_bytes, streams[t]);  // warm
            start.arrive_and_wait();
            std::uint64_t n = 0;
            while (!stop.load(std::memory_order_relaxed)) {
              for (int i = 0; i < 64; ++i) peer->pair(options.thread_bytes, streams[t]);
              n += 64;
            }
            total.fetch_add(n);
          });
        }
        start.arrive_and_wait();
        const auto begin = Clock::now();
        std::this_thread::sleep_for(std::chrono::duration<double>(options.seconds_per_point * 4));
        stop = true;
        for (auto& w : workers) w.join();
        const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
        runs.push_back(double(total.load()) / elapsed / 1e6);
      }
      row.push_back(fmt::format("{:.2f}", median(runs)));
      for (cudaStream_t s : streams) {
        peer->forget_stream(s);
        cudaStreamDestroy(s);
      }
    }
    peer->release_cached();
    table.rows.push_back(std::move(row));
  }
  return table;
}

Table handoff_table(std::vector<std::unique_ptr<Peer>>& peers, const CompareOptions& options) {
  Table table;
  table.title = "Cross-stream hand-off: free on stream A, allocate on stream B";
  table.note = "Each round allocates 64 KiB on A and frees it on A, then allocates 64 KiB on B "
               "and keeps it (B frees its oldest of 32 kept). Rounds run for 0.2 s, median of "
               "the runs; peak reserved is the device memory the allocator held (n/a: it cannot "
               "tell).";
  table.header = {"allocator", "ns per round", "peak reserved"};
  constexpr std::size_t bytes = 65536;
  for (auto& peer : peers) {
    cudaStream_t a = new_stream();
    cudaStream_t b = new_stream();
    peer->reset_peak();
    std::vector<double> runs;
    for (int r = 0; r < options.repeats; ++r) {
      std::deque<void*> kept;
      std::size_t rounds = 0;
      const auto start = Clock::now();
      double elapsed = 0;
      while (elapsed < options.seconds_per_point * 4) {
        for (int i = 0; i < 64; ++i) {
          peer->deallocate(peer->allocate(bytes, a), bytes, a);
          kept.push_back(peer->allocate(bytes, b));
          if (kept.size() > 32) {
            peer->deallocate(kept.front(), bytes, b);
            kept.pop_front();
          }
        }
        rounds += 64;
        elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      }
      for (void* p : kept) peer->deallocate(p, bytes, b);
      runs.push_back(elapsed * 1e9 / double(rounds));
    }
    const std::uint64_t peak = peer->peak_reserved();
    table.rows.push_back({peer->name(), format_ns(median(runs)),
                          peak == 0 ? std::string("n/a") : fmt::format("{}", peak)});
    peer->forget_stream(a);
    peer->forget_stream(b);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    peer->release_cached();
  }
  return table;
}

Table trace_table(std::vector<std::unique_ptr<Peer>>& peers, const std::vector<Trace>& traces) {
  Table table;
  table.title = "Trace replay: time per event and peak reserved memory";
  table.note = "Every event of the trace in order, on its streams, with no kernels in between; "
               "a free of a block another stream used is ordered after that use, as each "
               "allocator's users order it (Peer::deallocate_after_use: for PyTorch and CUB, "
               "an event recorded and waited on, counted in their time). "
               "Peak reserved over the trace's peak requested; n/a where the allocator cannot "
               "tell.";
  table.header = {"trace",         "allocator",           "ns per event", "failed allocations",
                  "peak reserved", "reserved / requested"};
  table.label_columns = 2;
  for (const Trace& trace : traces) {
    const std::uint64_t peak_requested = trace.peak_requested();
    for (auto& peer : peers) {
      std::vector<cudaStream_t> streams;
      for (std::size_t i = 0; i < trace.streams.size(); ++i) streams.push_back(new_stream());
      peer->release_cached();
      peer->reset_peak();
      std::vector<void*> live(trace.allocations, nullptr);
      // Each allocation's size and stream, for the free of those the trace leaves live.
      std::vector<std::pair<std::size_t, std::uint32_t>> made(trace.allocations);
      std::uint64_t failed = 0;
      const auto start = Clock::now();
      for (const TraceEvent& e : trace.events) {
        if (e.kind == TraceEvent::Kind::alloc) {
          live[e.allocation] = peer->allocate(e.size, streams[e.stream]);
          made[e.allocation] = {e.size, e.stream};
          failed += live[e.allocation] == nullptr;
        } else if (live[e.allocation] != nullptr) {
          if (e.used_on == no_stream) {
            peer->deallocate(live[e.allocation], e.size, streams[e.stream]);
          } else {
            peer->deallocate_after_use(live[e.allocation], e.size, streams[e.stream],
                                       streams[e.used_on]);
          }
          live[e.allocation] = nullptr;
        }
      }
      cudaDeviceSynchronize();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      for (std::size_t i = 0; i < live.size(); ++i) {
        if (live[i] == nullptr) continue;
        peer->deallocate(live[i], made[i].first, streams[made[i].second]);
      }
      const std::uint64_t peak = peer->peak_reserved();
      table.rows.push_back(
          {trace.name, peer->name(),
           trace.events.empty()
               ? std::string("n/a")
               : fmt::format("{:.0f}", seconds * 1e9 / double(trace.events.size())),
           fmt::format("{}", failed),
           peak == 0 ? std::string("n/a") : fmt::format("{}", peak),
           peak == 0 || peak_requested == 0 ? std::string("n/a")
                                            : fmt::format("{:.3f}", double(peak) / double(peak_requested))});
      for (cudaStream_t s : streams) {
        peer->forget_stream(s);
        cudaStreamDestroy(s);
      }
      peer->release_cached();
    }
  }
  return table;
}

namespace {

// PyTorch's figures for each trace from torch_summary.json: a list of objects
// {"name": ..., "reserved_bytes.all.peak": ..., "requested_bytes.all.peak": ...}.
struct TorchFigures {
  double reserved = 0;
  double requested = 0;
};
std::map<std::string, TorchFigures> read_torch_summary(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("--torch-summary {}: cannot be read", path));
  std::map<std::string, TorchFigures> figures;
  try {
    const nlohmann::json summary = nlohmann::json::parse(in);
    if (!summary.is_array()) throw std::runtime_error("expected a list of objects");
    for (const nlohmann::json& entry : summary) {
      figures[entry.at("name").get<std::string>()] = {
          entry.at("reserved_bytes.all.peak").get<double>(),
          entry.at("requested_bytes.all.peak").get<double>()};
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("--torch-summary {}: {}", path, e.what()));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("--torch-summary {}: {}", path, e.what()));
  }
  return figures;
}

}  // namespace

Table memory_table(const std::vector<Trace>& traces, const PoolOptions& options,
                   const std::string& torch_summary_path) {
  Table table;
  table.title = "Memory: peak reserved / peak requested (device-independent, on the fake device)";
  table.note = "streampool replayed on the fake device (memory figures do not depend on the GPU); "
               "PyTorch's figures as recorded with the trace, where a torch_summary.json gives them.";
  table.header = {"trace", "peak requested", "streampool peak reserved", "streampool ratio",
                  "PyTorch ratio"};
  const std::map<std::string, TorchFigures> torch =
      torch_summary_path.empty() ? std::map<std::string, TorchFigures>{}
                                 : read_torch_summary(torch_summary_path);
  for (const Trace& trace : traces) {
    ReplayOptions replay_options;
    replay_options.pool = options;
    const ReplayReport r = replay(trace, fake_target(), replay_options);
    std::string name = trace.name;
    for (const char* suffix : {".csv.gz", ".csv"}) {
      if (name.size() > std::strlen(suffix) &&
          name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0) {
        name.resize(name.size() - std::strlen(suffix));
      }
    }
    if (const auto slash = name.find_last_of('/'); slash != std::string::npos) name = name.substr(slash + 1);
    const auto found = torch.find(name);
    const bool have_torch = found != torch.end() && found->second.requested > 0;
    table.rows.push_back({trace.name, fmt::format("{}", r.peak_requested),
                          fmt::format("{}", r.peak_reserved), fmt::format("{:.3f}", r.ratio()),
                          have_torch ? fmt::format("{:.3f}", found->second.reserved /
                                                                 found->second.requested)
                                     : std::string("n/a")});
  }
  return table;
}

}  // namespace streampool::bench
