// The Device seam: every CUDA call streampool makes, and nothing else.
//
// The pool and the capture layer reach the GPU only through this interface. It has two
// implementations: CudaDevice (cuda_device.hpp), on the CUDA runtime, and FakeDevice
// (fake_device.hpp), a simulation that runs without a GPU and lets tests inject faults, count
// calls and catch stream races. Keeping the seam this narrow is what makes every fence rule of the
// pool testable on a machine without a GPU.
//
// Every call returns CUDA's status code and never throws. Each one lists, in its comment, what the
// caller must ensure; what happens when that is broken is what CUDA does (an error code at best).
// Calls that take a stream accept the legacy default stream (0 or cudaStreamLegacy) and the
// per-thread default stream (cudaStreamPerThread) as CUDA does.
//
// The device: each call runs on this Device's GPU whatever device is current in the calling
// thread, and leaves the caller's current device as it found it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace streampool {

// A stream's identity for the whole life of the program (cudaStreamGetId). Unlike a
// cudaStream_t it is never reused: CUDA hands a destroyed stream's handle to the next stream it
// creates, and cudaStreamPerThread is one handle naming a different stream in every thread.
using StreamId = unsigned long long;
// A capture sequence's identity, unique for the life of the program (cudaStreamGetCaptureInfo).
using CaptureId = unsigned long long;

// The three stream-capture modes of cudaStreamBeginCapture. In `global` mode, while the capture
// lasts, no thread may make a call CUDA considers unsafe (cudaMalloc, cudaEventQuery on an event
// recorded outside the capture, synchronizing calls); in `thread_local_` mode only the capturing
// thread is restricted; in `relaxed` mode nobody is, except for calls that conflict with capture
// by their nature (synchronizing the capturing stream, querying an event recorded inside it).
enum class CaptureMode { global, thread_local_, relaxed };

enum class CaptureStatus { none, active, invalidated };

class Device {
 public:
  virtual ~Device() = default;

  // This device's ordinal (cudaGetDevice numbering).
  virtual int ordinal() const noexcept = 0;

  // --- memory -----------------------------------------------------------------------------

  // cudaMalloc. Requires bytes > 0. The address is at least 256-byte aligned. Refused during a
  // global or thread-local capture that restricts this thread (cudaErrorStreamCaptureUnsupported,
  // which also invalidates that capture).
  virtual cudaError_t malloc(void** ptr, std::size_t bytes) noexcept = 0;
  // cudaFree. Requires ptr to come from malloc of this device and no pending work to use it:
  // cudaFree waits for the device, but the pool never relies on that. Refused like malloc.
  virtual cudaError_t free(void* ptr) noexcept = 0;
  // cudaMemGetInfo: free and total bytes of the device. Used in out-of-memory messages.
  virtual cudaError_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept = 0;

  // --- events -----------------------------------------------------------------------------

  // cudaEventCreateWithFlags(cudaEventDisableTiming): fences need no timestamps, and
  // disable-timing events are the cheapest to record and query.
  virtual cudaError_t event_create(cudaEvent_t* event) noexcept = 0;
  // cudaEventDestroy. The event may still be pending; CUDA releases it when it completes.
  virtual cudaError_t event_destroy(cudaEvent_t event) noexcept = 0;
  // cudaEventRecord: the event completes when the work enqueued on `stream` so far has. On a
  // capturing stream it records into the capture instead (the event is then "captured").
  virtual cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) noexcept = 0;
  // cudaEventQuery: cudaSuccess when complete (or never recorded), cudaErrorNotReady when not.
  // Refused like malloc when the event was recorded outside a restricting capture;
  // cudaErrorCapturedEvent when it was last recorded inside a capture.
  virtual cudaError_t event_query(cudaEvent_t event) noexcept = 0;
  // cudaEventSynchronize: blocks until the event completes. Refused like event_query.
  virtual cudaError_t event_synchronize(cudaEvent_t event) noexcept = 0;

  // --- streams ----------------------------------------------------------------------------

  // cudaStreamWaitEvent: work enqueued on `stream` from now on waits for the event, without
  // blocking the CPU. On a capturing stream, an event recorded outside any capture is refused
  // (cudaErrorStreamCaptureIsolation) and the capture invalidated, in every mode.
  virtual cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event) noexcept = 0;
  // cudaStreamSynchronize: blocks until the stream's work completes. Refused on a capturing
  // stream in every mode, and on any stream by a restricting capture.
  virtual cudaError_t stream_synchronize(cudaStream_t stream) noexcept = 0;
  // cudaDeviceSynchronize: blocks until all work of the device completes. Refused while any
  // capture is under way.
  virtual cudaError_t device_synchronize() noexcept = 0;
  // cudaStreamGetId. Refused on a capturing stream (cudaErrorStreamCaptureUnsupported, and the
  // capture is invalidated, in every mode: seen on the H200); allowed on other streams during
  // capture. Requires a live stream: a destroyed stream's handle
  // names whatever stream CUDA gave it to next, or nothing (asking about it crashed the process
  // on the H200).
  virtual cudaError_t stream_id(cudaStream_t stream, StreamId* id) noexcept = 0;
  // cudaStreamGetCaptureInfo: the stream's capture status and, when active, the capture's id.
  // Allowed during capture, in every mode.
  virtual cudaError_t capture_info(cudaStream_t stream, CaptureStatus* status,
                                   CaptureId* id) noexcept = 0;

  // --- capture and graphs -----------------------------------------------------------------

  // cudaStreamBeginCapture. Requires a stream that is not capturing (cudaErrorIllegalState) and
  // is not the legacy default stream (cudaErrorStreamCaptureUnsupported).
  virtual cudaError_t begin_capture(cudaStream_t stream, CaptureMode mode) noexcept = 0;
  // cudaStreamEndCapture. Requires the stream that began the capture, in the thread that began
  // it when the mode is not relaxed (from another thread: cudaErrorStreamCaptureWrongThread, and
  // the capture is over). Returns cudaErrorStreamCaptureInvalidated (and no graph) when the
  // capture was invalidated; the stream leaves capture mode either way.
  virtual cudaError_t end_capture(cudaStream_t stream, cudaGraph_t* graph) noexcept = 0;
  // cudaGraphInstantiate(flags 0). The executable graph holds its own references to the user
  // objects the graph retains.
  virtual cudaError_t graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) noexcept = 0;
  // cudaGraphLaunch: enqueues one replay of the graph on `stream`.
  virtual cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t stream) noexcept = 0;
  // cudaGraphUpload: prepares the graph for launch on `stream` ahead of time.
  virtual cudaError_t graph_upload(cudaGraphExec_t exec, cudaStream_t stream) noexcept = 0;
  // cudaGraphExecDestroy. Launches still in flight complete; the user objects the executable
  // graph retains are released after they do.
  virtual cudaError_t graph_exec_destroy(cudaGraphExec_t exec) noexcept = 0;
  // cudaGraphDestroy.
  virtual cudaError_t graph_destroy(cudaGraph_t graph) noexcept = 0;
  // cudaUserObjectCreate(initial reference count 1, cudaUserObjectNoDestructorSync). `destroy`
  // runs once the last reference goes, on a thread of CUDA's, and must not call CUDA.
  virtual cudaError_t user_object_create(cudaUserObject_t* object, void* ptr,
                                         cudaHostFn_t destroy) noexcept = 0;
  // cudaGraphRetainUserObject(count 1, cudaGraphUserObjectMove): moves the caller's reference to
  // the graph, which keeps the object alive until the graph and every executable graph
  // instantiated from it are gone.
  virtual cudaError_t graph_retain_user_object(cudaGraph_t graph,
                                               cudaUserObject_t object) noexcept = 0;
  // cudaUserObjectRelease(count 1): drops a reference the caller owns.
  virtual cudaError_t user_object_release(cudaUserObject_t object) noexcept = 0;
};

}  // namespace streampool
