// CudaDevice: the Device seam on the CUDA runtime, for one GPU.
#pragma once

#include <streampool/device.hpp>
#include <streampool/export.hpp>

namespace streampool {

class STREAMPOOL_API CudaDevice final : public Device {
 public:
  // Throws streampool::Error (Errc::no_device, with CUDA's own message) when there is no driver,
  // no GPU, or no GPU of this ordinal. Does not change the calling thread's current device.
  explicit CudaDevice(int ordinal = 0);

  // The number of GPUs CUDA sees, 0 where there is no driver or no GPU. Never throws.
  static int count() noexcept;
  // The calling thread's current device (cudaGetDevice): 0 until the thread sets another.
  // Throws Error(Errc::no_device) where there is no driver or no GPU.
  static int current();

  int ordinal() const noexcept override { return ordinal_; }
#define STREAMPOOL_DEVICE_CALL(name, params, args) cudaError_t name params noexcept override;
#include <streampool/device_calls.def>

 private:
  int ordinal_;
  // cuStreamGetId and cuStreamGetCaptureInfo, fetched through cudaGetDriverEntryPointByVersion:
  // on the H200 they cost 17-19 ns against 62-85 ns for the runtime's own (which also serialize
  // threads). Null where the driver does not offer them; the runtime is used then.
  void* driver_stream_id_ = nullptr;
  void* driver_capture_info_ = nullptr;
  // The driver offers the cuMem* calls and the device supports them; else each vm_ call says
  // cudaErrorNotSupported without a device call.
  bool vm_supported_ = false;
};

}  // namespace streampool
