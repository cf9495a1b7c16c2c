// docs/guide.md, "thrust and cuda::mr": a thrust container and a thrust algorithm's temporaries
// from the pool, on one stream. Needs a GPU: exits with 77 (CTest: Skipped) without one, with 1
// when the result or the pool's statistics are not what the guide says.
#include <streampool/cuda_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/thrust_allocator.hpp>

#include <thrust/device_vector.h>
#include <thrust/functional.h>
#include <thrust/host_vector.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <cstdio>
#include <memory>

int main() {
  if (streampool::CudaDevice::count() == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  streampool::MemoryPool pool(std::make_shared<streampool::CudaDevice>(0));
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const int n = 1 << 20;
  bool right = true;
  {
    // guide-begin thrust
    using Vector = thrust::device_vector<int, streampool::ThrustAllocator<int>>;
    streampool::ThrustAllocator<int> alloc(pool, stream);  // allocates and drops on `stream`
    Vector v(n, alloc);                                     // its own kernels run there too
    thrust::sequence(thrust::cuda::par.on(stream), v.begin(), v.end());

    streampool::ThrustAllocator<char> temporaries(pool, stream);  // the same stream
    thrust::sort(thrust::cuda::par_nosync(temporaries).on(stream), v.begin(), v.end(),
                 thrust::greater<int>());
    // guide-end
    cudaStreamSynchronize(stream);
    thrust::host_vector<int> host(v);
    for (int i = 0; i < n; ++i) right = right && host[static_cast<std::size_t>(i)] == n - 1 - i;
    const auto stats = pool.stats();
    // The vector and at least one block of the sort's temporaries.
    right = right && stats.live_allocations.total >= 2 && stats.live_allocations.current == 1;
  }
  cudaStreamSynchronize(stream);
  pool.release_stream(stream);
  cudaStreamDestroy(stream);
  std::printf("thrust on the pool: %s\n", right ? "sorted" : "WRONG");
  return right ? 0 : 1;
}
