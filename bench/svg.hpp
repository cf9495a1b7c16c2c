// Plots written directly as SVG: no plotting library needed to read the bench's results.
#pragma once

#include <string>
#include <vector>

namespace streampool::bench {

struct Series {
  std::string label;
  std::string colour;  // CSS colour
  std::vector<double> x;
  std::vector<double> y;
};

// How an axis labels its ticks: as the bench's tables write the figure.
enum class Unit {
  count,  // plain numbers: events, device allocations
  bytes,  // B, KiB, MiB, GiB (binary, as human_bytes in report.hpp)
  ratio,  // plain numbers, not necessarily whole
};

struct PlotOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool lines = true;       // join the points (timelines) or not (scatter)
  bool log_x = false;
  int highlight = -1;      // scatter: index of a point of the first series to ring
  Unit x_unit = Unit::count;
  Unit y_unit = Unit::count;
  // Axes start at zero (a linear axis whose data are all positive); off, they start at the data.
  bool x_from_zero = true;
  bool y_from_zero = true;
  std::vector<std::string> notes;  // lines under the title: the configuration plotted, ...
};

// Lines keep every extreme: where more points than pixel columns fall in a column, the line
// spans the lowest and the highest of them there (min/max per column, never one sample in N).
std::string svg_plot(const std::vector<Series>& series, const PlotOptions& options);

// The ticks of an axis from `low` to `high` in `unit`: 0 (or `low`) and round steps up to the
// first one at or past `high`, the last being the axis's end. Exposed for tests.
std::vector<double> axis_ticks(double low, double high, Unit unit);
// A tick's label, in the unit's terms ("1.5 GiB", "20000", "1.05"): every tick of an axis in the
// unit of its end, `axis_end`, with the decimals its `step` needs.
std::string tick_label(double value, double step, double axis_end, Unit unit);

}  // namespace streampool::bench
