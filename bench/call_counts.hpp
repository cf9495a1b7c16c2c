// CallCounts: a device decorator that counts every seam call and the CPU time spent in it, so
// that a run can say what the pool asked of the device per buffer (and which calls blocked).
#pragma once

#include <streampool/device.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace streampool::bench {

// The calls of one kind: the seam's name for it, how many, and the CPU time spent in them.
struct DeviceCallCount {
  std::string call;
  std::uint64_t calls = 0;
  std::uint64_t ns = 0;
};

class CallCounts : public ForwardingDevice {
 public:
  enum class Kind {
#define STREAMPOOL_DEVICE_CALL(name, params, args) name,
#include <streampool/device_calls.def>
  };
  static constexpr std::size_t kinds = 0
#define STREAMPOOL_DEVICE_CALL(name, params, args) +1
#include <streampool/device_calls.def>
      ;

  using ForwardingDevice::ForwardingDevice;

#define STREAMPOOL_DEVICE_CALL(name, params, args)              \
  cudaError_t name params noexcept override {                   \
    const auto started_ = std::chrono::steady_clock::now();     \
    const cudaError_t result_ = ForwardingDevice::name args;    \
    note(Kind::name, std::chrono::steady_clock::now() - started_); \
    return result_;                                             \
  }
#include <streampool/device_calls.def>

  // The calls made so far, by kind, those never made left out.
  std::vector<DeviceCallCount> counts() const {
    static const char* const names[] = {
#define STREAMPOOL_DEVICE_CALL(name, params, args) #name,
#include <streampool/device_calls.def>
    };
    std::vector<DeviceCallCount> out;
    for (std::size_t k = 0; k < kinds; ++k) {
      const std::uint64_t n = calls_[k].load(std::memory_order_relaxed);
      if (n != 0) out.push_back({names[k], n, ns_[k].load(std::memory_order_relaxed)});
    }
    return out;
  }

 private:
  void note(Kind kind, std::chrono::steady_clock::duration took) noexcept {
    const auto k = static_cast<std::size_t>(kind);
    calls_[k].fetch_add(1, std::memory_order_relaxed);
    ns_[k].fetch_add(static_cast<std::uint64_t>(
                         std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()),
                     std::memory_order_relaxed);
  }

  std::array<std::atomic<std::uint64_t>, kinds> calls_{};
  std::array<std::atomic<std::uint64_t>, kinds> ns_{};
};

}  // namespace streampool::bench
