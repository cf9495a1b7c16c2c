// CudaDevice: the Device seam on the CUDA runtime, for one GPU.
#pragma once

#include <streampool/device.hpp>
#include <streampool/export.hpp>
#include <streampool/stream_ops.hpp>

#include <memory>
#include <string_view>

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
  // No: the notifications are no-ops here, and a pool over a CudaDevice makes none (a pool with
  // PoolOptions::nvtx_memory puts a layer in between that wants them).
  bool wants_notifications() const noexcept override { return false; }
#define STREAMPOOL_DEVICE_CALL(name, params, args) cudaError_t name params noexcept override;
#define STREAMPOOL_DEVICE_NOTE(name, params, args) \
  void name params noexcept override { ignore_notification args; }
#include <streampool/device_calls.def>

 private:
  int ordinal_;
  // cuStreamGetId, cuStreamGetCaptureInfo and cuStreamIsCapturing, fetched through
  // cudaGetDriverEntryPointByVersion: on the H200 they cost 20, 27 and 20 ns against 79-91 ns
  // for the runtime's own (which also serialize threads; bench/results/h200.md); capture_info
  // without an id asks cuStreamIsCapturing. Null where the driver does not offer them; the runtime is used then.
  void* driver_stream_id_ = nullptr;
  void* driver_capture_info_ = nullptr;
  void* driver_is_capturing_ = nullptr;
  // The driver offers the cuMem* calls and the device supports them; else each vm_ call says
  // cudaErrorNotSupported without a device call.
  bool vm_supported_ = false;
};

// StreamOps (stream_ops.hpp) on the CUDA runtime: streams are non-blocking, the launch is called
// with this device current and its error checked (cudaGetLastError), the accesses and the host
// body are not looked at, and names and labels are dropped.
class STREAMPOOL_API CudaStreamOps final : public StreamOps {
 public:
  // Requires a non-null device.
  explicit CudaStreamOps(std::shared_ptr<CudaDevice> device);

  cudaStream_t create_stream(std::string_view name = {}) override;
  void destroy_stream(cudaStream_t stream) override;
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind, cudaStream_t stream,
            std::string_view label = {}) override;
  void set(void* dst, int value, std::size_t bytes, cudaStream_t stream,
           std::string_view label = {}) override;

 private:
  void enqueue_work(cudaStream_t stream, std::string_view label,
                    std::span<const MemoryAccess> accesses, LaunchRef launch,
                    std::function<void()> host_body) override;

  int ordinal_;
};

}  // namespace streampool
