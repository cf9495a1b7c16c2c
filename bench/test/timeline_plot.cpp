// The timeline and its plot keep every peak: the replay records each stretch's lowest and
// highest bytes, and the plot draws each pixel column's lowest and highest points; the axes
// start at zero and read in the tables' units; the plot names the configuration.
#include "cli_helpers.hpp"
#include "replay.hpp"
#include "svg.hpp"
#include "temp_dir.hpp"
#include "trace_helpers.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

using namespace streampool::bench;
using namespace streampool::bench::testing;
using Catch::Matchers::Contains;

namespace {

// 10,000 small allocate/free pairs with one 1 GiB allocation freed right away in the middle.
std::string spike_csv() {
  std::string csv = "Thread,Time,Action,Pointer,Size,Stream\n";
  for (int i = 0; i < 5000; ++i) {
    if (i == 2501) {
      csv += "0,1,allocate,0x900000,1073741824,0x0\n0,1,free,0x900000,1073741824,0x0\n";
    }
    csv += "0,1,allocate,0x1000,4096,0x0\n0,1,free,0x1000,4096,0x0\n";
  }
  return csv;
}

// The screen y of every point of every polyline in an SVG.
std::vector<std::vector<double>> polyline_ys(const std::string& svg) {
  std::vector<std::vector<double>> lines;
  const std::regex polyline("points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), polyline); it != std::sregex_iterator();
       ++it) {
    std::vector<double> ys;
    std::istringstream points((*it)[1].str());
    std::string point;
    while (points >> point) ys.push_back(std::stod(point.substr(point.find(',') + 1)));
    lines.push_back(ys);
  }
  return lines;
}

}  // namespace

TEST_CASE("a replay's timeline keeps the highest bytes of every stretch", "[timeline]") {
  const Trace trace = parse(spike_csv(), "spike");
  ReplayOptions options;
  options.timeline_points = 100;  // 100 events a stretch: the spike lasts two
  const ReplayReport report = replay(trace, fake_target(), options);
  REQUIRE(report.timeline.size() == 100);
  std::uint64_t requested = 0, reserved = 0;
  for (const TimelinePoint& p : report.timeline) {
    requested = std::max(requested, p.requested_max);
    reserved = std::max(reserved, p.reserved_max);
    CHECK(p.requested_min <= p.requested_max);
    CHECK(p.reserved_min <= p.reserved_max);
  }
  CHECK(requested == trace.peak_requested());
  CHECK(reserved >= std::uint64_t{1} << 30);
  CHECK(report.timeline.front().requested_min == 0);  // after the first free
}

TEST_CASE("a line plot draws each pixel column's lowest and highest points", "[timeline][svg]") {
  Series s{"bytes", "#000", {}, {}};
  for (int i = 0; i < 100000; ++i) {
    s.x.push_back(i);
    s.y.push_back(i == 54321 ? 1e9 : 1e6);  // one point in 100,000 is high
  }
  PlotOptions plot;
  plot.y_unit = Unit::bytes;
  const std::string svg = svg_plot({s}, plot);
  const auto lines = polyline_ys(svg);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].size() < 2000);  // reduced to pixel columns
  const auto [low, high] = std::minmax_element(lines[0].begin(), lines[0].end());
  // The high point is drawn (screen y grows down): nearly the plot's height above the rest.
  CHECK(*high - *low > 300);
}

TEST_CASE("plot axes start at zero and are labelled in the tables' units", "[timeline][svg]") {
  SECTION("byte ticks in binary units, as human_bytes writes them") {
    const auto ticks = axis_ticks(0, 1.9 * (1 << 30), Unit::bytes);
    REQUIRE(ticks.front() == 0);
    CHECK(ticks.back() == 2.0 * (1 << 30));
    CHECK(tick_label(ticks[1], ticks[1] - ticks[0], ticks.back(), Unit::bytes) == "0.5 GiB");
    CHECK(tick_label(ticks[0], ticks[1] - ticks[0], ticks.back(), Unit::bytes) == "0");
    constexpr double MiB = 1 << 20;
    CHECK(tick_label(384 * MiB, 128 * MiB, 512 * MiB, Unit::bytes) == "384 MiB");
    CHECK(tick_label(20000, 5000, 40000, Unit::count) == "20000");
    CHECK(tick_label(1.05, 0.05, 1.2, Unit::ratio) == "1.05");
  }
  SECTION("data far from zero still start at zero") {
    Series s{"bytes", "#000", {1000, 2000}, {3e9, 3.1e9}};
    PlotOptions plot;
    plot.y_unit = Unit::bytes;
    const std::string svg = svg_plot({s}, plot);
    CHECK_THAT(svg, Contains("class=\"y-tick\">0<"));
    CHECK_THAT(svg, Contains("class=\"x-tick\">0<"));
    CHECK_THAT(svg, Contains(" GiB<"));
  }
}

TEST_CASE("replay --timeline plots every peak and names the configuration", "[timeline][cli]") {
  const TempDir dir;
  write_text(dir.file("spike.csv"), spike_csv());
  const std::string svg_path = dir.file("timeline.svg");
  const BenchRun run = run_bench(
      {"replay", "--fake", dir.file("spike.csv"), "--config", "segment=64M", "--timeline", svg_path});
  REQUIRE(run.status == 0);
  std::stringstream svg;
  svg << std::ifstream(svg_path).rdbuf();
  CHECK_THAT(svg.str(), Contains("configuration: segment=64M"));
  CHECK_THAT(svg.str(), Contains("class=\"y-tick\">0<"));
  CHECK_THAT(svg.str(), Contains(" GiB<"));
  const auto lines = polyline_ys(svg.str());
  REQUIRE(lines.size() == 2);  // reserved, requested
  for (const auto& ys : lines) {
    const auto [low, high] = std::minmax_element(ys.begin(), ys.end());
    CHECK(*high - *low > 200);  // the 1 GiB spike reaches near the top
  }
}
