// The Device seam: every CUDA call streampool makes, and nothing else.
//
// The pool and the capture layer reach the GPU only through this interface. It has two
// implementations: CudaDevice (cuda_device.hpp), on the CUDA runtime, and FakeDevice
// (fake_device.hpp), a simulation that runs without a GPU and lets tests inject faults, count
// calls and catch stream races. Keeping the seam this narrow is what makes every fence rule of the
// pool testable on a machine without a GPU.
//
// The calls are listed once, in device_calls.def, each with what the caller must ensure; the
// interface, the forwarding base below, both implementations and FakeDevice::Call are made from
// that list.
//
// The device: each call runs on this Device's GPU whatever device is current in the calling
// thread, and leaves the caller's current device as it found it.
//
// A Device of the caller's own (a ForwardingDevice that wraps another) must not call a pool or
// the capture layer from inside its calls: the library may hold its locks while it makes them
// (a capture-status query made while a settle of left captures holds its lock, for one, would
// wait for itself in a release_stream called from there).
#pragma once

#include <streampool/export.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace streampool {

// A stream's identity for the whole life of the program (cudaStreamGetId). Unlike a
// cudaStream_t it is never reused: CUDA hands a destroyed stream's handle to the next stream it
// creates, and cudaStreamPerThread is one handle naming a different stream in every thread.
using StreamId = unsigned long long;
// A capture sequence's identity, unique for the life of the program (cudaStreamGetCaptureInfo).
using CaptureId = unsigned long long;
// Physical memory of the driver's virtual memory management (CUmemGenericAllocationHandle).
using VmHandle = unsigned long long;

// The three stream-capture modes of cudaStreamBeginCapture. In `global` mode, while the capture
// lasts, no thread may make a call CUDA considers unsafe (cudaMalloc, cudaEventQuery on an event
// recorded outside the capture, synchronizing calls); in `thread_local_` mode only the capturing
// thread is restricted; in `relaxed` mode nobody is, except for calls that conflict with capture
// by their nature (synchronizing the capturing stream, querying an event recorded inside it).
enum class CaptureMode { global, thread_local_, relaxed };

enum class CaptureStatus { none, active, invalidated };

// For a device that ignores the notifications: names their arguments once.
template <class... Args>
constexpr void ignore_notification(const Args&...) noexcept {}

class STREAMPOOL_API Device {
 public:
  virtual ~Device() = default;

  // This device's ordinal (cudaGetDevice numbering).
  virtual int ordinal() const noexcept = 0;
  // This device alone, as vm_set_access's mask of devices (none for an ordinal a mask cannot
  // name: CUDA's are below 64).
  std::uint64_t own_access() const noexcept {
    const int d = ordinal();
    return d >= 0 && d < 64 ? std::uint64_t{1} << d : 0;
  }

  // Whether the device wants the pool's notifications (device_calls.def, the last section). A
  // pool asks once, when it is constructed, and makes none when the answer is no, so that a
  // device which ignores them costs the pool's fast paths nothing.
  virtual bool wants_notifications() const noexcept = 0;

  // The calls, each with what the caller must ensure, and the notifications: device_calls.def.
#define STREAMPOOL_DEVICE_CALL(name, params, args) virtual cudaError_t name params noexcept = 0;
#define STREAMPOOL_DEVICE_NOTE(name, params, args) virtual void name params noexcept = 0;
#include <streampool/device_calls.def>
};

// A Device that passes every call on to another one. It is the base of the decorators that wrap
// a device (the pool's reserved-memory limit) and of test hooks, which override only the calls
// they change and call the base for the rest.
class STREAMPOOL_API ForwardingDevice : public Device {
 public:
  // Requires a non-null `inner`.
  explicit ForwardingDevice(std::shared_ptr<Device> inner) noexcept : inner_(std::move(inner)) {}

  Device& inner() const noexcept { return *inner_; }

  int ordinal() const noexcept override { return inner_->ordinal(); }
  bool wants_notifications() const noexcept override { return inner_->wants_notifications(); }
#define STREAMPOOL_DEVICE_CALL(name, params, args) \
  cudaError_t name params noexcept override { return inner_->name args; }
#define STREAMPOOL_DEVICE_NOTE(name, params, args) \
  void name params noexcept override { inner_->name args; }
#include <streampool/device_calls.def>

 private:
  std::shared_ptr<Device> inner_;
};

}  // namespace streampool
