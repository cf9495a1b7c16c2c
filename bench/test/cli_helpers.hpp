// Running streampool-bench's command line in the test process, and what the tests feed it.
#pragma once

#include "cli.hpp"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace streampool::bench::testing {

struct BenchRun {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline BenchRun run_bench(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  BenchRun run;
  run.status = bench_main(args, out, err);
  run.out = out.str();
  run.err = err.str();
  return run;
}

// STREAMPOOL_CONF set to a value (or unset) for a scope, the old value back afterwards.
class ScopedConf {
 public:
  explicit ScopedConf(const std::optional<std::string>& value) {
    if (const char* old = std::getenv("STREAMPOOL_CONF"); old != nullptr) old_ = old;
    if (value) setenv("STREAMPOOL_CONF", value->c_str(), 1);
    else unsetenv("STREAMPOOL_CONF");
  }
  ~ScopedConf() {
    if (old_) setenv("STREAMPOOL_CONF", old_->c_str(), 1);
    else unsetenv("STREAMPOOL_CONF");
  }
  ScopedConf(const ScopedConf&) = delete;
  ScopedConf& operator=(const ScopedConf&) = delete;

 private:
  std::optional<std::string> old_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The last line of a text that ends with a newline.
inline std::string last_line(const std::string& text) {
  const std::size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return {};
  const std::size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace streampool::bench::testing
