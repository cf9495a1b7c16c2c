// LiveRanges: the address ranges of the buffers alive now, checked at each allocation, for the
// tests whose worker threads cannot use Catch's assertions (pool_stress.cpp, the model check's
// concurrent variant): threads record what they saw here, the test asserts it afterwards.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

class LiveRanges {
 public:
  void add(const void* ptr, std::size_t bytes) {
    const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    const std::uintptr_t end = begin + bytes;
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = ranges_.lower_bound(begin);
    if (next != ranges_.end() && next->first < end) overlap(begin, end, *next);
    if (next != ranges_.begin()) {
      auto previous = std::prev(next);
      if (previous->second > begin) overlap(begin, end, *previous);
    }
    ranges_[begin] = end;
  }
  void remove(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  int overlaps() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return overlaps_;
  }
  std::string first_overlap() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_overlap_;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ranges_.size();
  }

 private:
  void overlap(std::uintptr_t begin, std::uintptr_t end,
               const std::pair<const std::uintptr_t, std::uintptr_t>& live) {
    if (overlaps_++ == 0) {
      first_overlap_ = fmt::format("[{:#x}, {:#x}) handed out while [{:#x}, {:#x}) is live", begin,
                                   end, live.first, live.second);
    }
  }

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::uintptr_t> ranges_;  // begin -> end
  int overlaps_ = 0;
  std::string first_overlap_;
};
