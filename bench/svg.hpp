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

struct PlotOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool lines = true;       // join the points (timelines) or not (scatter)
  bool log_x = false;
  int highlight = -1;      // scatter: index of a point of the first series to ring
};

std::string svg_plot(const std::vector<Series>& series, const PlotOptions& options);

}  // namespace streampool::bench
