// Failure: why an operation of the pool or the layer above it failed, as it travels up to the
// public API. The library's code, and, when a device call caused it, which call and what CUDA
// answered: the throwing API builds its Error from all three (Error::cuda_error() keeps CUDA's
// value, the message names the call), the non-throwing API reports the code alone, in the one
// category of error.hpp.
#pragma once

#include <streampool/error.hpp>

#include <string>
#include <system_error>

namespace streampool::detail {

struct Failure {
  Errc code = Errc::success;
  cudaError_t cuda = cudaSuccess;  // cudaSuccess: no device call failed
  const char* call = nullptr;      // the CUDA call that failed ("cudaMalloc"), or null

  Failure() noexcept = default;
  // A failure no device call caused.
  Failure(Errc c) noexcept : code(c) {}  // NOLINT(google-explicit-constructor): a code is one
  // `call` answered `status` (not cudaSuccess): the code CUDA's error maps to.
  static Failure of(cudaError_t status, const char* call) noexcept {
    const Errc mapped = errc_from_cuda(status);
    return with(mapped == Errc::success ? Errc::device_error : mapped, status, call);
  }
  // Another code, for a reason a device call gave.
  static Failure with(Errc code, cudaError_t status, const char* call) noexcept {
    Failure f(code);
    f.cuda = status;
    f.call = call;
    return f;
  }

  explicit operator bool() const noexcept { return code != Errc::success; }
  void clear() noexcept { *this = Failure{}; }
  std::error_code error_code() const noexcept { return make_error_code(code); }
  friend bool operator==(const Failure& f, Errc c) noexcept { return f.code == c; }
};

// The Error the throwing API throws: "`what`: `call`: CUDA's name and message" when a device
// call failed, `what` alone otherwise.
inline Error error_of(const Failure& failure, const std::string& what) {
  if (failure.cuda == cudaSuccess) return Error(failure.code, what);
  return Error(failure.code, failure.cuda,
               failure.call != nullptr ? what + ": " + failure.call : what);
}

}  // namespace streampool::detail
