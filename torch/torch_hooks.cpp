// libstreampool_torch_hooks: streampool as PyTorch's current CUDA allocator, with the hooks that
// only C++ can set on a CUDAPluggableAllocator (torch/csrc/cuda/CUDAPluggableAllocator.h):
// record-stream, the graph-capture trio, reset (empty_cache) and the memory fraction. Built only
// where PyTorch's C++ headers are found; everything it does is a call into streampool_torch.h,
// whose C entry points are tested on the fake device (test/torch/).
//
// The Python module (tools/streampool_torch.py) loads this library with ctypes after `import
// torch` (so that the libtorch this links to is the one already loaded) and calls
// streampool_torch_install() before CUDA is first used.
#include "streampool_torch.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace {

namespace pluggable = torch::cuda::CUDAPluggableAllocator;

thread_local std::string install_error;

// PyTorch uses what its allocator returns unchecked: a failure must be an exception, and out of
// memory the one torch.cuda.OutOfMemoryError is made from (PyTorch's own allocator throws it).
void* alloc(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  void* ptr = streampool_torch_alloc(static_cast<ssize_t>(size), device, stream);
  if (ptr == nullptr) {
    const bool out_of_memory = streampool_torch_last_error_was_out_of_memory() != 0;
    const std::string why = streampool_torch_last_error();
    TORCH_CHECK_WITH(OutOfMemoryError, !out_of_memory, why);
    TORCH_CHECK(false, why);
  }
  return ptr;
}

void free_fn(void* ptr, size_t size, int device, cudaStream_t stream) {
  streampool_torch_free(ptr, static_cast<ssize_t>(size), device, stream);
}

void check(int status, const char* what) {
  TORCH_CHECK(status == 0, "streampool ", what, ": ", streampool_torch_last_error());
}

}  // namespace

extern "C" {

// Makes streampool PyTorch's current CUDA allocator, with every hook set. Must run before the
// first CUDA allocation (PyTorch refuses to swap an initialized allocator). 0 on success; -1 and
// the reason in streampool_torch_install_error() otherwise.
STREAMPOOL_TORCH_API int streampool_torch_install(void) {
  try {
    std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator =
        pluggable::createCustomAllocator(alloc, free_fn);
    // createCustomAllocator makes a CUDAPluggableAllocator (and returns it as its base); a
    // static cast needs no type information from libtorch_cuda.
    auto* hooks = static_cast<pluggable::CUDAPluggableAllocator*>(allocator.get());

    // Tensor.record_stream(stream): without this hook it does nothing at all.
    hooks->set_record_stream_fn([](void* ptr, cudaStream_t stream) {
      check(streampool_torch_record_stream(ptr, stream), "record_stream");
    });
    // CUDAGraph::capture_begin calls this just before cudaStreamBeginCapture on the current
    // stream of the capturing device; the filter picks the allocations of that capture (by
    // capture id), which is what streampool's CapturePool binds, so it is not needed here.
    hooks->set_begin_allocate_to_pool(
        [](int device, c10::cuda::MempoolId_t id, std::function<bool(cudaStream_t)> /*filter*/) {
          const cudaStream_t stream =
              c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
          check(streampool_torch_begin_allocate_to_pool(device, id.first, id.second, stream),
                "begin_allocate_to_pool");
        });
    // CUDAGraph::capture_end calls this after cudaStreamEndCapture.
    hooks->set_end_allocate_to_pool_fn([](int device, c10::cuda::MempoolId_t id) {
      check(streampool_torch_end_allocate_to_pool(device, id.first, id.second),
            "end_allocate_to_pool");
    });
    // CUDAGraph::reset (and so its destructor) calls this; it must not throw there.
    hooks->set_release_pool([](int device, c10::cuda::MempoolId_t id) {
      if (streampool_torch_release_pool(device, id.first, id.second) != 0) {
        TORCH_WARN("streampool release_pool: ", streampool_torch_last_error());
      }
    });
    // torch.cuda.empty_cache.
    hooks->set_reset_fn([] {
      if (streampool_torch_trim(-1) != 0) {
        TORCH_WARN("streampool empty_cache: ", streampool_torch_last_error());
      }
    });
    // torch.cuda.set_per_process_memory_fraction.
    hooks->set_memory_fraction_fn([](double fraction, int device) {
      check(streampool_torch_set_memory_fraction(fraction, device), "set_memory_fraction");
    });
    pluggable::changeCurrentAllocator(allocator);
    return 0;
  } catch (const std::exception& e) {
    install_error = e.what();
  } catch (...) {
    install_error = "unknown exception";
  }
  return -1;
}

STREAMPOOL_TORCH_API const char* streampool_torch_install_error(void) {
  return install_error.c_str();
}

}  // extern "C"
