// The CapturePool usage example of include/streampool/capture_pool.hpp, compiled and run (on a
// GPU) so that it cannot drift from the code.
#include <streampool/streampool.hpp>

#include <cstdio>
#include <vector>

__global__ void my_kernel(float* a, float* b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 1024) {
    a[i] += 1.0f;
    b[i] = 2.0f * a[i];
  }
}

int main() {
  if (streampool::CudaDevice::count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  streampool::MemoryPool memory_pool(std::make_shared<streampool::CudaDevice>(0));
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const dim3 grid(4), block(256);

  auto pool = std::make_shared<streampool::CapturePool>(memory_pool);
  auto a = streampool::PooledBuffer<float>::alloc_async(memory_pool, 1024, stream);
  auto b = streampool::PooledBuffer<float>::alloc_async(memory_pool, 1024, stream);
  float* pa = a.data();
  float* pb = b.data();
  cudaMemsetAsync(pa, 0, 1024 * sizeof(float), stream);
  pool->record_buffer(std::move(a));  // the pool now keeps both alive
  pool->record_buffer(std::move(b));
  pool->seal();
  streampool::begin_capture_with_pool(pool, stream);
  my_kernel<<<grid, block, 0, stream>>>(pa, pb);  // captured, not run
  auto graph = streampool::end_capture_with_pool(stream, pool);
  pool.reset();  // safe: the graph holds its own reference
  graph.launch(stream);

  // Three replays in all: a[i] == 3, b[i] == 6.
  graph.launch(stream);
  graph.launch(stream);
  std::vector<float> host(1024);
  cudaMemcpyAsync(host.data(), pb, host.size() * sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  bool right = true;
  for (float v : host) right = right && v == 6.0f;
  std::printf("3 replays: b[0] = %.1f (%s)\n", host[0], right ? "right" : "WRONG");
  graph = streampool::CapturedGraph();
  cudaStreamDestroy(stream);
  return right ? 0 : 1;
}
