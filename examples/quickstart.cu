// The README's quick start, compiled and run (on a GPU) so that it cannot drift from the code.
#include <streampool/streampool.hpp>

#include <cstdio>

__global__ void fill(float* data, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = value;
  }
}

int main() {
  if (streampool::CudaDevice::count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  auto device = std::make_shared<streampool::CudaDevice>(0);  // or a FakeDevice in tests
  streampool::MemoryPool pool(device);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const std::size_t n = 1 << 20;
  float first = 0;
  {
    auto buffer = streampool::PooledBuffer<float>::alloc_async(pool, n, stream);
    fill<<<256, 256, 0, stream>>>(buffer.data(), n, 42.0f);
    cudaMemcpyAsync(&first, buffer.data(), sizeof first, cudaMemcpyDeviceToHost, stream);
    // dropped at the end of scope: reusable on `stream` at once, on other streams after a fence
  }
  cudaStreamSynchronize(stream);
  pool.release_stream(stream);
  cudaStreamDestroy(stream);
  std::printf("first element %.1f; pool: %zu cache hits, %zu misses\n", first,
              std::size_t(pool.stats().cache_hits), std::size_t(pool.stats().cache_misses));
  return first == 42.0f ? 0 : 1;
}
