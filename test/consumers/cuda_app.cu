// A consumer's CUDA source: nvcc compiles the headers (C++20 through the target) and a kernel
// that writes a PooledBuffer. Its main runs on the fake device, and launches the kernel only
// where there is a GPU. The CCCL resource and the thrust allocator, headers that only a CUDA
// source can take whole, are used here too.
#include <streampool/memory_resource.hpp>
#include <streampool/streampool.hpp>
#include <streampool/thrust_allocator.hpp>

#include <cstdio>

__global__ void fill(float* data, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = value;
  }
}

int main() {
  static_assert(__cplusplus >= 202002L, "the streampool target asks nvcc for C++20");
  auto fake = std::make_shared<streampool::FakeDevice>();
  {
    streampool::MemoryPool pool(fake);
    const cudaStream_t stream = fake->create_stream();
    {
      auto buffer = streampool::PooledBuffer<float>::alloc_async(pool, 256, stream);
      if (buffer.byte_size() != 256 * sizeof(float)) return 1;
    }
    streampool::PoolResource resource(pool);
    void* raw = resource.allocate(cuda::stream_ref(stream), 4096, 256);
    streampool::ThrustAllocator<char> scratch(pool, stream);
    auto chars = scratch.allocate(1000);
    if (raw == nullptr || chars.get() == nullptr || pool.stats().live_allocations.current != 2) {
      return 1;
    }
    resource.deallocate(cuda::stream_ref(stream), raw, 4096, 256);
    scratch.deallocate(chars, 1000);
    pool.release_stream(stream);
    fake->destroy_stream(stream);
  }
  if (streampool::CudaDevice::count() == 0) {
    std::puts("compiled by nvcc, ran on the fake device; no CUDA device for the kernel");
    return 0;
  }
  streampool::MemoryPool pool(std::make_shared<streampool::CudaDevice>(0));
  float first = 0;
  {
    auto buffer = streampool::PooledBuffer<float>::alloc_async(pool, 1 << 16, cudaStreamPerThread);
    fill<<<64, 256, 0, cudaStreamPerThread>>>(buffer.data(), buffer.len(), 7.0f);
    cudaMemcpyAsync(&first, buffer.data(), sizeof first, cudaMemcpyDeviceToHost,
                    cudaStreamPerThread);
    cudaStreamSynchronize(cudaStreamPerThread);
  }
  std::printf("kernel wrote %.1f\n", first);
  return first == 7.0f ? 0 : 1;
}
