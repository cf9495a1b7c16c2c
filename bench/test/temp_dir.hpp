// A directory of its own under the system's temporary directory, removed afterwards.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>

namespace streampool::bench::testing {

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("streampool_bench_tests." + std::to_string(::getpid()) + "." + std::to_string(++counter));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace streampool::bench::testing
