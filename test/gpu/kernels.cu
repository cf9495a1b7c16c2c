#include "kernels.hpp"

namespace gpu_test {
namespace {

__device__ std::uint64_t global_time_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin(const volatile int* flag, int ticket) {
  const std::uint64_t deadline = global_time_ns() + 10'000'000'000ull;
  while (*flag < ticket && global_time_ns() < deadline) __nanosleep(1000);
}

__global__ void noop() {}

__global__ void sleep_for(std::uint64_t nanoseconds) {
  const std::uint64_t until = global_time_ns() + nanoseconds;
  while (global_time_ns() < until) __nanosleep(500);
}

__global__ void delayed_fill(std::uint32_t* data, std::size_t n, std::uint32_t value,
                             std::uint64_t nanoseconds) {
  const std::uint64_t until = global_time_ns() + nanoseconds;
  while (global_time_ns() < until) __nanosleep(500);
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    data[i] = value;
  }
}

__global__ void count_mismatches(const std::uint32_t* data, std::size_t n, std::uint32_t value,
                                 unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    local += data[i] != value;
  }
  if (local != 0) atomicAdd(mismatches, local);
}

unsigned blocks_for(std::size_t n) {
  const std::size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1024 ? (blocks == 0 ? 1 : blocks) : 1024);
}

}  // namespace

// cudaGetLastError also reports the last error any runtime call returned in this thread (an
// expected refusal in a capture test, say): clear it before launching, so what is returned after
// is the launch's own.
cudaError_t launch_spin(cudaStream_t stream, const volatile int* flag, int ticket) {
  cudaGetLastError();
  spin<<<1, 1, 0, stream>>>(flag, ticket);
  return cudaGetLastError();
}

cudaError_t launch_noop(cudaStream_t stream) {
  cudaGetLastError();
  noop<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t launch_sleep(cudaStream_t stream, std::uint64_t nanoseconds) {
  cudaGetLastError();
  sleep_for<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

cudaError_t launch_delayed_fill(cudaStream_t stream, std::uint32_t* data, std::size_t n,
                                std::uint32_t value, std::uint64_t nanoseconds) {
  cudaGetLastError();
  delayed_fill<<<blocks_for(n), 256, 0, stream>>>(data, n, value, nanoseconds);
  return cudaGetLastError();
}

cudaError_t launch_count_mismatches(cudaStream_t stream, const std::uint32_t* data, std::size_t n,
                                    std::uint32_t value, unsigned long long* mismatches) {
  cudaGetLastError();
  count_mismatches<<<blocks_for(n), 256, 0, stream>>>(data, n, value, mismatches);
  return cudaGetLastError();
}

}  // namespace gpu_test
