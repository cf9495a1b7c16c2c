// Errors of streampool: one code enum, one category, one exception type.
//
// The throwing API throws `streampool::Error` (a `std::system_error`) whose code belongs to
// `streampool::category()`; the non-throwing variants report the same `std::error_code` through an
// out-parameter. An error a device call caused names that call and keeps CUDA's own name and
// message in the error's text, and its numeric value in `Error::cuda_error()`, so nothing CUDA
// said is lost on the way up.
#pragma once

#include <streampool/export.hpp>

#include <cuda_runtime_api.h>

#include <string>
#include <system_error>

namespace streampool {

enum class Errc {
  success = 0,
  invalid_value,         // a bad argument: zero or overflowing size, unknown option, bad config
  out_of_memory,         // the device (or max_reserved_bytes) refused, after every reclaim step
  capture_pool_sealed,   // allocation during capture from a sealed CapturePool
  capture_pool_exhausted,// allocation during capture past the CapturePool's memory, not growable now
  capture_without_pool,  // allocation on a stream captured without begin_capture_with_pool
  capture_invalidated,   // the capture was invalidated (a forbidden call, or CUDA's own reasons)
  capture_mismatch,      // end_capture_with_pool on a stream/pool the capture did not begin with
  capture_forbids_call,  // the allocation needs a device call a capture under way forbids
  no_device,             // no usable GPU (no driver, no device, ordinal out of range)
  device_error,          // any other CUDA error; the message carries CUDA's own
};

STREAMPOOL_API const std::error_category& category() noexcept;

inline std::error_code make_error_code(Errc e) noexcept {
  return {static_cast<int>(e), category()};
}

// Maps a CUDA error to the library's code (cudaSuccess to Errc::success).
STREAMPOOL_API Errc errc_from_cuda(cudaError_t status) noexcept;

class STREAMPOOL_API Error : public std::system_error {
 public:
  Error(Errc code, const std::string& what);
  // `what` is prefixed to CUDA's own name and message, e.g.
  // "cudaMalloc of 1024 bytes: cudaErrorMemoryAllocation: out of memory".
  Error(cudaError_t status, const std::string& what);
  // The same with the library's own code for what failed (out_of_memory after every reclaim
  // step, capture_pool_exhausted when a capture could not grow, ...), which need not be
  // the code CUDA's error maps to. With cudaSuccess, as Error(code, what).
  Error(Errc code, cudaError_t status, const std::string& what);

  Errc errc() const noexcept { return static_cast<Errc>(code().value()); }
  // The CUDA error this one came from (the call named in what()), or cudaSuccess when no device
  // call caused it.
  cudaError_t cuda_error() const noexcept { return cuda_; }

 private:
  cudaError_t cuda_ = cudaSuccess;
};

// "cudaErrorMemoryAllocation: out of memory": CUDA's own name and message (the runtime's tables
// need no driver, so this works on a machine without a GPU too).
STREAMPOOL_API std::string describe_cuda_error(cudaError_t status);

// Throws Error(status, what) unless status is cudaSuccess.
STREAMPOOL_API void throw_on_cuda_error(cudaError_t status, const std::string& what);

}  // namespace streampool

template <>
struct std::is_error_code_enum<streampool::Errc> : std::true_type {};
