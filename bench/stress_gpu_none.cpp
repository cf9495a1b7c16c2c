// The stress command's GPU side in a build without a CUDA compiler: there are no kernels to run.
#include "stress_target.hpp"

namespace streampool::bench {

std::unique_ptr<StressTarget> make_gpu_stress_target() {
  throw StressError(
      "the GPU mode of stress is unavailable: this streampool-bench was built without a CUDA "
      "compiler, so it has no kernels (configure where CMake finds nvcc, or use --fake)");
}

bool gpu_stress_built() noexcept { return false; }

}  // namespace streampool::bench
