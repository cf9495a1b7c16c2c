#include <streampool/error.hpp>

namespace streampool {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "streampool"; }

  std::string message(int value) const override {
    switch (static_cast<Errc>(value)) {
      case Errc::success: return "success";
      case Errc::invalid_value: return "invalid value";
      case Errc::out_of_memory: return "out of device memory";
      case Errc::capture_pool_sealed: return "allocation during capture from a sealed CapturePool";
      case Errc::capture_pool_exhausted:
        return "allocation during capture beyond the memory the CapturePool reserved";
      case Errc::capture_without_pool:
        return "allocation on a stream captured without begin_capture_with_pool";
      case Errc::capture_invalidated: return "stream capture was invalidated";
      case Errc::capture_mismatch: return "capture ended with another stream or pool than it began";
      case Errc::capture_forbids_call:
        return "the allocation needs a device call that a capture under way forbids";
      case Errc::no_device: return "no usable CUDA device";
      case Errc::device_error: return "CUDA device error";
    }
    return "unknown streampool error";
  }

  bool equivalent(int value, const std::error_condition& condition) const noexcept override {
    if (static_cast<Errc>(value) == Errc::out_of_memory) {
      return condition == std::errc::not_enough_memory;
    }
    if (static_cast<Errc>(value) == Errc::invalid_value) {
      return condition == std::errc::invalid_argument;
    }
    return std::error_category::equivalent(value, condition);
  }
};

}  // namespace

const std::error_category& category() noexcept {
  static const Category instance;
  return instance;
}

Errc errc_from_cuda(cudaError_t status) noexcept {
  switch (status) {
    case cudaSuccess: return Errc::success;
    case cudaErrorMemoryAllocation: return Errc::out_of_memory;
    case cudaErrorInvalidValue: return Errc::invalid_value;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return Errc::no_device;
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureUnsupported:
      return Errc::capture_invalidated;
    default: return Errc::device_error;
  }
}

std::string describe_cuda_error(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

Error::Error(Errc code, const std::string& what) : std::system_error(make_error_code(code), what) {}

Error::Error(cudaError_t status, const std::string& what)
    : std::system_error(make_error_code(errc_from_cuda(status)),
                        what + ": " + describe_cuda_error(status)),
      cuda_(status) {}

Error::Error(Errc code, cudaError_t status, const std::string& what)
    : std::system_error(make_error_code(code), status == cudaSuccess
                                                   ? what
                                                   : what + ": " + describe_cuda_error(status)),
      cuda_(status) {}

void throw_on_cuda_error(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw Error(status, what);
}

}  // namespace streampool
