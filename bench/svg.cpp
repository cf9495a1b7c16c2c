#include "svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace streampool::bench {
namespace {

constexpr double width = 720, height = 440, left = 90, right = 180, bottom = 60;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// The binary unit a byte axis reaching `high` is labelled in.
double byte_unit(double high, const char** name) {
  static constexpr const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double unit = 1;
  int i = 0;
  while (i < 4 && high >= unit * 1024) {
    unit *= 1024;
    ++i;
  }
  *name = names[i];
  return unit;
}

// A round step (1, 2, 2.5 or 5 times a power of ten, in `unit`) giving about five ticks.
double round_step(double span, double unit) {
  const double raw = span / unit / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * power >= raw) return m * power * unit;
  }
  return 10 * power * unit;
}

// Points reduced to pixel columns: in each column the line runs from the extreme nearer the
// previous column's end to the other, so every peak and trough stays visible.
std::vector<std::pair<double, double>> per_column(std::vector<std::pair<double, double>> points) {
  std::vector<std::pair<double, double>> out;
  std::size_t i = 0;
  while (i < points.size()) {
    const double column = std::floor(points[i].first);
    double low = points[i].second, high = low;
    std::size_t j = i;
    for (; j < points.size() && std::floor(points[j].first) == column; ++j) {
      low = std::min(low, points[j].second);
      high = std::max(high, points[j].second);
    }
    const double x = column + 0.5;
    if (low == high) {
      out.push_back({x, low});
    } else {
      // Screen y grows downwards: `low` and `high` are pixel rows here.
      const bool down_first = !out.empty() && std::fabs(out.back().second - low) <
                                                  std::fabs(out.back().second - high);
      out.push_back({x, down_first ? low : high});
      out.push_back({x, down_first ? high : low});
    }
    i = j;
  }
  return out;
}

}  // namespace

std::vector<double> axis_ticks(double low, double high, Unit unit) {
  if (!(high > low)) high = low + 1;
  const char* name = nullptr;
  const double scale = unit == Unit::bytes ? byte_unit(high - low, &name) : 1.0;
  double step = round_step(high - low, scale);
  if (unit != Unit::ratio) step = std::max(step, 1.0);  // whole bytes and counts
  std::vector<double> ticks;
  const double first = std::floor(low / step) * step;
  for (double t = first;; t += step) {
    ticks.push_back(t);
    if (t >= high - step * 1e-9 || ticks.size() > 50) break;
  }
  return ticks;
}

std::string tick_label(double value, double step, double axis_end, Unit unit) {
  // Enough decimals to tell the ticks apart, no more.
  const auto decimals = [](double s) {
    int d = 0;
    while (d < 6 && std::fabs(s * std::pow(10.0, d) - std::round(s * std::pow(10.0, d))) > 1e-6) ++d;
    return d;
  };
  if (unit == Unit::bytes) {
    const char* name = nullptr;
    const double scale = byte_unit(std::fabs(axis_end), &name);
    if (value == 0) return "0";
    return fmt::format("{:.{}f} {}", value / scale, decimals(step / scale), name);
  }
  return fmt::format("{:.{}f}", value, decimals(step));
}

std::string svg_plot(const std::vector<Series>& series, const PlotOptions& options) {
  const double top = 40 + 16 * double(options.notes.size());
  double x0 = std::numeric_limits<double>::max(), x1 = std::numeric_limits<double>::lowest();
  double y0 = x0, y1 = x1;
  const auto fx = [&](double x) { return options.log_x ? std::log10(std::max(x, 1e-12)) : x; };
  for (const Series& s : series) {
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      x0 = std::min(x0, fx(s.x[i]));
      x1 = std::max(x1, fx(s.x[i]));
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  }
  if (x0 > x1) x0 = 0, x1 = 1;
  if (y0 > y1) y0 = 0, y1 = 1;
  if (options.x_from_zero && !options.log_x) x0 = std::min(x0, 0.0);
  if (options.y_from_zero) y0 = std::min(y0, 0.0);
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  // The axes end at round ticks at or past the data.
  const std::vector<double> y_ticks = axis_ticks(y0, y1, options.y_unit);
  y0 = y_ticks.front();
  y1 = y_ticks.back();
  std::vector<double> x_ticks;
  if (options.log_x) {
    for (int i = 0; i <= 5; ++i) x_ticks.push_back(x0 + (x1 - x0) * i / 5);
  } else {
    x_ticks = axis_ticks(x0, x1, options.x_unit);
    x0 = x_ticks.front();
    x1 = x_ticks.back();
  }
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const auto px = [&](double x) { return left + (fx(x) - x0) / (x1 - x0) * plot_w; };
  const auto py = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * plot_h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"{}\" y=\"24\" font-size=\"15\">{}</text>\n",
      width, height, left, escape(options.title));
  for (std::size_t i = 0; i < options.notes.size(); ++i) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" class=\"note\">{}</text>\n", left,
                       40 + 16 * double(i), escape(options.notes[i]));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                     "stroke=\"#444\"/>\n",
                     left, top, plot_w, plot_h);
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : 1;
  for (double t : y_ticks) {
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"y-tick\">{}</text>\n",
                       left, py(t), left + plot_w, py(t), left - 6, py(t) + 4,
                       tick_label(t, y_step, y1, options.y_unit));
  }
  const double x_step = x_ticks.size() > 1 ? x_ticks[1] - x_ticks[0] : 1;
  for (double t : x_ticks) {
    const double sx = left + (t - x0) / (x1 - x0) * plot_w;
    const std::string label = options.log_x
                                  ? tick_label(std::pow(10.0, t), std::pow(10.0, t) / 100,
                                               std::pow(10.0, t), options.x_unit)
                                  : tick_label(t, x_step, x1, options.x_unit);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" class=\"x-tick\">{}</text>\n",
                       sx, top + plot_h + 18, label);
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     left + plot_w / 2, height - 16, escape(options.x_label));
  svg += fmt::format("<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">"
                     "{}</text>\n",
                     top + plot_h / 2, escape(options.y_label));
  for (std::size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    const std::size_t n = std::min(s.x.size(), s.y.size());
    if (options.lines && n > 1) {
      std::vector<std::pair<double, double>> screen;
      for (std::size_t i = 0; i < n; ++i) screen.push_back({px(s.x[i]), py(s.y[i])});
      std::string points;
      for (const auto& [x, y] : per_column(std::move(screen))) points += fmt::format("{:.1f},{:.1f} ", x, y);
      svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
                         "points=\"{}\"/>\n",
                         s.colour, points);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\" "
                           "fill-opacity=\"0.7\"/>\n",
                           px(s.x[i]), py(s.y[i]), s.colour);
      }
      if (k == 0 && options.highlight >= 0 && std::size_t(options.highlight) < n) {
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"8\" fill=\"none\" "
                           "stroke=\"black\" stroke-width=\"2\"/>\n",
                           px(s.x[options.highlight]), py(s.y[options.highlight]));
      }
    }
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{}\" y=\"{}\">{}</text>\n",
                       width - right + 14, top + 8 + 20 * double(k), s.colour, width - right + 32,
                       top + 18 + 20 * double(k), escape(s.label));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace streampool::bench
