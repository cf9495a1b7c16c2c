// The seam the tests of streampool_torch use (test/torch/): where each device's pool gets its
// Device. Not installed, not for users.
#pragma once

#include <streampool/device.hpp>
#include <streampool/pool_options.hpp>

#include <functional>
#include <memory>

namespace streampool::torch_layer {

using DeviceFactory = std::function<std::shared_ptr<Device>(int ordinal)>;

// Destroys every pool made so far (nothing they handed out may be live) and makes later pools
// with `factory` and `options`. An empty factory restores CudaDevice. Not thread-safe: call it
// while nothing else uses the entry points.
STREAMPOOL_API void reset_for_tests(DeviceFactory factory, const PoolOptions& options = {});

}  // namespace streampool::torch_layer
