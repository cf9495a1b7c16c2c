// Deliberate bugs in pool memory, for compute-sanitizer's memcheck (tools/gpu-check.sh, stage
// nvtx): a kernel that reads past a pool block and one that writes to a block after its drop.
// Both stay inside one of the pool's cudaMalloc segments, where memcheck sees nothing wrong
// unless the pool tells it where its blocks are (PoolOptions::nvtx_memory).
//
//   streampool_nvtx_memcheck read-past|write-after-drop [off]
//
// `off` runs the same bug with nvtx_memory off. Exits 77 where there is no GPU, 1 when the run
// itself failed, 0 otherwise: whether the bug is reported is memcheck's to say.
#include <streampool/cuda_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <cstdio>
#include <cstring>
#include <memory>

namespace {

__global__ void read_one(const float* data, std::size_t at, float* out) { *out = data[at]; }

__global__ void write_one(float* data, std::size_t at) { data[at] = 1.0f; }

constexpr std::size_t n = 100;  // 400 bytes, in a block of 512

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (std::strcmp(argv[1], "read-past") != 0 &&
                   std::strcmp(argv[1], "write-after-drop") != 0)) {
    std::fprintf(stderr, "usage: %s read-past|write-after-drop [off]\n", argv[0]);
    return 1;
  }
  if (streampool::CudaDevice::count() == 0) {
    std::puts("no GPU: skipped");
    return 77;
  }
  const bool nvtx = argc < 3 || std::strcmp(argv[2], "off") != 0;
  auto device = std::make_shared<streampool::CudaDevice>(0);
  streampool::PoolOptions options;
  options.nvtx_memory = nvtx;
  streampool::MemoryPool pool(device, options);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  {
    auto result = streampool::PooledBuffer<float>::alloc_async(pool, 1, stream);
    auto data = streampool::PooledBuffer<float>::alloc_async(pool, n, stream);
    if (std::strcmp(argv[1], "read-past") == 0) {
      // The element just past the 400 bytes asked for: inside the block's 512, and the segment.
      read_one<<<1, 1, 0, stream>>>(data.data(), n, result.data());
    } else {
      float* stale = data.data();
      data.reset();
      write_one<<<1, 1, 0, stream>>>(stale, 0);
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess) return 1;
  }
  std::printf("%s with nvtx_memory %s: done\n", argv[1], nvtx ? "on" : "off");
  cudaStreamDestroy(stream);
  return 0;
}
