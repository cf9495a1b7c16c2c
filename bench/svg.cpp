#include "svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace streampool::bench {
namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

std::string tick(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e3) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

}  // namespace

std::string svg_plot(const std::vector<Series>& series, const PlotOptions& options) {
  constexpr double width = 720, height = 440, left = 80, right = 180, top = 40, bottom = 60;
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
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad;
  y1 += pad;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const auto px = [&](double x) { return left + (fx(x) - x0) / (x1 - x0) * plot_w; };
  const auto py = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * plot_h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"{}\" y=\"24\" font-size=\"15\">{}</text>\n",
      width, height, left, escape(options.title));
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                     "stroke=\"#444\"/>\n",
                     left, top, plot_w, plot_h);
  for (int i = 0; i <= 5; ++i) {
    const double fy = y0 + (y1 - y0) * i / 5;
    const double fxv = x0 + (x1 - x0) * i / 5;
    const double xv = options.log_x ? std::pow(10.0, fxv) : fxv;
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                       left, py(fy), left + plot_w, py(fy), left - 6, py(fy) + 4, tick(fy));
    const double sx = left + plot_w * i / 5;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", sx,
                       top + plot_h + 18, tick(xv));
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
      std::string points;
      for (std::size_t i = 0; i < n; ++i) points += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
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
