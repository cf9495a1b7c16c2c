// The device-contract harness over FakeDevice (see device_contract.hpp).
#pragma once

#include <streampool/fake_device.hpp>

#include <chrono>
#include <functional>
#include <thread>

struct FakeHarness {
  static constexpr const char* name = "fake";

  streampool::FakeDevice fake;

  streampool::Device& device() { return fake; }
  cudaStream_t create_stream() { return fake.create_stream(); }
  void destroy_stream(cudaStream_t stream) { fake.destroy_stream(stream); }
  // Fake work stays pending until something completes it, so blocked and short work differ only
  // in who completes them: release() for the first, any synchronize for the second.
  void launch_blocked(cudaStream_t stream) { fake.launch(stream); }
  void launch_short(cudaStream_t stream) { fake.launch(stream); }
  void release() { fake.complete_all(); }
  std::size_t refused_size() { return std::size_t{81} << 30; }  // capacity is 80 GiB by default
  bool wait_until(const std::function<bool()>& done) {
    for (int i = 0; i < 100; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
};
