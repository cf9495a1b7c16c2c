// The seam the tests of streampool_torch use (test/torch/): where each device's pool gets its
// Device. Not installed, not for users.
#pragma once

#include <streampool/device.hpp>
#include <streampool/pool_options.hpp>

#include <functional>
#include <memory>

namespace streampool::torch_layer {

using DeviceFactory = std::function<std::shared_ptr<Device>(int ordinal)>;
// The stream a device's pool keeps for the segments route 2 allocates during a capture (on a GPU:
// a non-blocking stream of that device, made at the first such segment).
using StreamFactory = std::function<cudaStream_t(int ordinal)>;

// Destroys every pool made so far (nothing they handed out may be live) and makes later pools
// with `factory`, `options` and `streams`. An empty factory restores CudaDevice, an empty
// `streams` cudaStreamCreateWithFlags. Not thread-safe: call it while nothing else uses the entry
// points.
STREAMPOOL_API void reset_for_tests(DeviceFactory factory, const PoolOptions& options = {},
                                    StreamFactory streams = {});

}  // namespace streampool::torch_layer
