// Helpers shared by the bench's trace tests.
#pragma once

#include "trace.hpp"

#include <sstream>
#include <string>

namespace streampool::bench::testing {

inline Trace parse(const std::string& csv, const std::string& name = "t") {
  std::istringstream in(csv);
  return parse_trace(in, name);
}

inline std::string write(const Trace& trace) {
  std::ostringstream out;
  write_trace(out, trace);
  return out.str();
}

inline bool same_events(const Trace& a, const Trace& b) {
  if (a.events.size() != b.events.size()) return false;
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const TraceEvent& x = a.events[i];
    const TraceEvent& y = b.events[i];
    if (x.kind != y.kind || x.thread != y.thread || x.stream != y.stream ||
        x.used_on != y.used_on || x.allocation != y.allocation || x.size != y.size ||
        x.time_us != y.time_us) {
      return false;
    }
  }
  return true;
}

}  // namespace streampool::bench::testing
