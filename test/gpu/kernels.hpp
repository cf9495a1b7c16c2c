// Kernels for the GPU tests, launched from plain C++ test files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gpu_test {

// One thread spins until *flag >= ticket (host-mapped memory), or 10 s pass so that a failed test
// cannot hang the machine.
cudaError_t launch_spin(cudaStream_t stream, const volatile int* flag, int ticket);
// An empty kernel.
cudaError_t launch_noop(cudaStream_t stream);
// Spins for about `nanoseconds` of GPU time, then writes `value` into every word of data[0, n).
cudaError_t launch_delayed_fill(cudaStream_t stream, std::uint32_t* data, std::size_t n,
                                std::uint32_t value, std::uint64_t nanoseconds);
// One thread sleeps for about `nanoseconds` of GPU time.
cudaError_t launch_sleep(cudaStream_t stream, std::uint64_t nanoseconds);
// Counts words of data[0, n) that differ from `value` into *mismatches (device memory).
cudaError_t launch_count_mismatches(cudaStream_t stream, const std::uint32_t* data, std::size_t n,
                                    std::uint32_t value, unsigned long long* mismatches);

}  // namespace gpu_test
