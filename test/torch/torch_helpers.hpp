// The fake devices behind streampool_torch's entry points, for one test case: each test gets
// fresh pools (reset_for_tests), one FakeDevice per device ordinal, host-backed so that the
// tests can see what the memory holds.
#pragma once

#include "../pool_helpers.hpp"

#include <streampool/fake_device.hpp>
#include <streampool_torch.h>
#include <testing.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <memory>

struct TorchOnFakes {
  std::map<int, std::shared_ptr<streampool::FakeDevice>> devices;

  explicit TorchOnFakes(streampool::PoolOptions options = test_options()) {
    streampool::torch_layer::reset_for_tests(
        [this](int ordinal) -> std::shared_ptr<streampool::Device> {
          streampool::FakeDevice::Options o;
          o.ordinal = ordinal;
          o.capacity = std::size_t{1} << 30;
          o.peers = 0b11 & ~(std::uint64_t{1} << ordinal);  // devices 0 and 1 reach each other
          auto fake = std::make_shared<streampool::FakeDevice>(o);
          devices[ordinal] = fake;
          return fake;
        },
        options,
        [this](int ordinal) { return devices.at(ordinal)->create_stream("segments"); });
  }
  ~TorchOnFakes() { streampool::torch_layer::reset_for_tests({}); }
  TorchOnFakes(const TorchOnFakes&) = delete;
  TorchOnFakes& operator=(const TorchOnFakes&) = delete;

  // The fake of `ordinal`, made through the entry points' own factory if not yet made.
  streampool::FakeDevice& fake(int ordinal = 0) {
    if (devices.count(ordinal) == 0) {
      // Any entry point that names the device makes its pool; a fraction of 1 changes nothing.
      REQUIRE(streampool_torch_set_memory_fraction(1.0, ordinal) == 0);
    }
    return *devices.at(ordinal);
  }

  static streampool_torch_stats stats(int device = 0) {
    streampool_torch_stats s{};
    REQUIRE(streampool_torch_get_stats(device, &s) == 0);
    return s;
  }
};
