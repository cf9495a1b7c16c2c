// CudaDevice: each seam call on the CUDA runtime, run with this device current.
//
// Switching devices costs a cudaGetDevice (~34 ns on the H200) and, only when the caller's device
// differs, two cudaSetDevice calls. Every call here is on a slow path of the pool (a device
// allocation, a fence, a capture), never on the same-stream fast path.
#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

namespace streampool {
namespace {

// Makes `ordinal` current for its scope and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      status_ = cudaSetDevice(ordinal);
      previous_ = -1;
      return;
    }
    if (previous_ != ordinal) status_ = cudaSetDevice(ordinal);
    else previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  cudaError_t status() const noexcept { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

template <class F>
cudaError_t on_device(int ordinal, F&& call) noexcept {
  DeviceScope scope(ordinal);
  if (scope.status() != cudaSuccess) return scope.status();
  return call();
}

using DriverStreamId = CUresult (*)(CUstream, unsigned long long*);
using DriverCaptureInfo = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                       const CUgraphNode**, const CUgraphEdgeData**, size_t*);
using DriverIsCapturing = CUresult (*)(CUstream, CUstreamCaptureStatus*);

void* driver_entry(const char* symbol, unsigned version) noexcept {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}

// The driver's virtual memory calls, fetched once per process. `supported` is filled per device.
struct DriverVm {
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 unreserve = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;

  bool complete() const noexcept {
    return ctx_get_current && device_get && device_get_attribute && granularity && reserve &&
           unreserve && create && release && map && unmap && set_access;
  }
};

const DriverVm& driver_vm() noexcept {
  static const DriverVm vm = [] {
    DriverVm d;
    const auto get = [](auto& fn, const char* symbol, unsigned version) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(driver_entry(symbol, version));
    };
    get(d.ctx_get_current, "cuCtxGetCurrent", 4000);
    get(d.device_get, "cuDeviceGet", 2000);
    get(d.device_get_attribute, "cuDeviceGetAttribute", 2000);
    get(d.granularity, "cuMemGetAllocationGranularity", 10020);
    get(d.reserve, "cuMemAddressReserve", 10020);
    get(d.unreserve, "cuMemAddressFree", 10020);
    get(d.create, "cuMemCreate", 10020);
    get(d.release, "cuMemRelease", 10020);
    get(d.map, "cuMemMap", 10020);
    get(d.unmap, "cuMemUnmap", 10020);
    get(d.set_access, "cuMemSetAccess", 10020);
    return d;
  }();
  return vm;
}

// The runtime's codes equal the driver's for every code these calls return (invalid value 1,
// out of memory 2, invalid context 201, not permitted 800, not supported 801, capture
// unsupported 900, capture implicit 906).
cudaError_t from_driver(CUresult result) noexcept { return static_cast<cudaError_t>(result); }

CUmemAllocationProp pinned_on(int ordinal) noexcept {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  return prop;
}

// Runs a driver virtual memory call with this device's primary context current (the runtime
// makes it current at cudaSetDevice; a thread that never made a runtime call may have none).
template <class F>
cudaError_t on_device_vm(int ordinal, bool supported, F&& call) noexcept {
  if (!supported) return cudaErrorNotSupported;
  return on_device(ordinal, [&] {
    CUcontext context = nullptr;
    if (driver_vm().ctx_get_current(&context) != CUDA_SUCCESS || context == nullptr) {
      if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) return e;
    }
    return from_driver(call());
  });
}

// The legacy and per-thread default streams are resolved against the current device; an
// explicit stream carries its own context.
bool explicit_stream(cudaStream_t stream) noexcept {
  return stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread;
}

cudaStreamCaptureMode to_cuda(CaptureMode mode) noexcept {
  switch (mode) {
    case CaptureMode::global: return cudaStreamCaptureModeGlobal;
    case CaptureMode::thread_local_: return cudaStreamCaptureModeThreadLocal;
    case CaptureMode::relaxed: return cudaStreamCaptureModeRelaxed;
  }
  return cudaStreamCaptureModeGlobal;
}

}  // namespace

int CudaDevice::count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not a sticky error, but clear it anyway
    return 0;
  }
  return n;
}

int CudaDevice::current() {
  int ordinal = 0;
  const cudaError_t status = cudaGetDevice(&ordinal);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(Errc::no_device, status, "CudaDevice::current: cudaGetDevice");
  }
  return ordinal;
}

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(Errc::no_device, status,
                "CudaDevice(" + std::to_string(ordinal) + "): cudaGetDeviceCount");
  }
  if (ordinal < 0 || ordinal >= n) {
    throw Error(Errc::no_device, "CudaDevice(" + std::to_string(ordinal) + "): CUDA sees " +
                                     std::to_string(n) + " device(s)");
  }
  driver_stream_id_ = driver_entry("cuStreamGetId", 12000);
  driver_capture_info_ = driver_entry("cuStreamGetCaptureInfo", 12030);
  driver_is_capturing_ = driver_entry("cuStreamIsCapturing", 10000);
  const DriverVm& vm = driver_vm();
  CUdevice device = 0;
  int supported = 0;
  vm_supported_ = vm.complete() && vm.device_get(&device, ordinal) == CUDA_SUCCESS &&
                  vm.device_get_attribute(
                      &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                      device) == CUDA_SUCCESS &&
                  supported != 0;
}

cudaError_t CudaDevice::malloc(void** ptr, std::size_t bytes) noexcept {
  return on_device(ordinal_, [&] { return cudaMalloc(ptr, bytes); });
}

cudaError_t CudaDevice::free(void* ptr) noexcept {
  return on_device(ordinal_, [&] { return cudaFree(ptr); });
}

cudaError_t CudaDevice::enable_peer_access(int peer) noexcept {
  if (peer == ordinal_) return cudaErrorInvalidDevice;
  return on_device(peer, [&] {
    const cudaError_t status = cudaDeviceEnablePeerAccess(ordinal_, 0);
    if (status != cudaErrorPeerAccessAlreadyEnabled) return status;
    cudaGetLastError();  // the runtime keeps that answer as the thread's last error: not one here
    return cudaSuccess;
  });
}

cudaError_t CudaDevice::mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept {
  return on_device(ordinal_, [&] { return cudaMemGetInfo(free_bytes, total_bytes); });
}

cudaError_t CudaDevice::vm_granularity(std::size_t* bytes) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] {
    const CUmemAllocationProp prop = pinned_on(ordinal_);
    return driver_vm().granularity(bytes, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  });
}

cudaError_t CudaDevice::vm_reserve(void** ptr, std::size_t bytes) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] {
    CUdeviceptr address = 0;
    const CUresult result = driver_vm().reserve(&address, bytes, 0, 0, 0);
    if (result == CUDA_SUCCESS) *ptr = reinterpret_cast<void*>(address);
    return result;
  });
}

cudaError_t CudaDevice::vm_unreserve(void* ptr, std::size_t bytes) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] {
    return driver_vm().unreserve(reinterpret_cast<CUdeviceptr>(ptr), bytes);
  });
}

cudaError_t CudaDevice::vm_create(VmHandle* handle, std::size_t bytes) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] {
    const CUmemAllocationProp prop = pinned_on(ordinal_);
    CUmemGenericAllocationHandle created = 0;
    const CUresult result = driver_vm().create(&created, bytes, &prop, 0);
    if (result == CUDA_SUCCESS) *handle = created;
    return result;
  });
}

cudaError_t CudaDevice::vm_release(VmHandle handle) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] { return driver_vm().release(handle); });
}

cudaError_t CudaDevice::vm_map(void* ptr, std::size_t bytes, VmHandle handle) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] {
    return driver_vm().map(reinterpret_cast<CUdeviceptr>(ptr), bytes, 0, handle, 0);
  });
}

cudaError_t CudaDevice::vm_set_access(void* ptr, std::size_t bytes,
                                      std::uint64_t devices) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] {
    std::array<CUmemAccessDesc, 64> access{};
    std::size_t count = 0;
    for (int d = 0; d < 64; ++d) {
      if (((devices >> d) & 1u) == 0) continue;
      access[count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access[count].location.id = d;
      access[count].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      ++count;
    }
    return driver_vm().set_access(reinterpret_cast<CUdeviceptr>(ptr), bytes, access.data(),
                                  count);
  });
}

cudaError_t CudaDevice::vm_unmap(void* ptr, std::size_t bytes) noexcept {
  return on_device_vm(ordinal_, vm_supported_, [&] {
    return driver_vm().unmap(reinterpret_cast<CUdeviceptr>(ptr), bytes);
  });
}

cudaError_t CudaDevice::event_create(cudaEvent_t* event) noexcept {
  return on_device(ordinal_,
                   [&] { return cudaEventCreateWithFlags(event, cudaEventDisableTiming); });
}

cudaError_t CudaDevice::event_destroy(cudaEvent_t event) noexcept {
  return on_device(ordinal_, [&] { return cudaEventDestroy(event); });
}

cudaError_t CudaDevice::event_record(cudaEvent_t event, cudaStream_t stream) noexcept {
  return on_device(ordinal_, [&] { return cudaEventRecord(event, stream); });
}

// Queries and waits on an event or a stream need no current device: CUDA resolves the handle's
// own context. Skipping the switch keeps fence polling at one runtime call.
cudaError_t CudaDevice::event_query(cudaEvent_t event) noexcept { return cudaEventQuery(event); }

cudaError_t CudaDevice::event_synchronize(cudaEvent_t event) noexcept {
  return cudaEventSynchronize(event);
}

cudaError_t CudaDevice::stream_wait_event(cudaStream_t stream, cudaEvent_t event) noexcept {
  return on_device(ordinal_, [&] { return cudaStreamWaitEvent(stream, event, 0); });
}

cudaError_t CudaDevice::stream_synchronize(cudaStream_t stream) noexcept {
  return on_device(ordinal_, [&] { return cudaStreamSynchronize(stream); });
}

cudaError_t CudaDevice::device_synchronize() noexcept {
  return on_device(ordinal_, [&] { return cudaDeviceSynchronize(); });
}

cudaError_t CudaDevice::stream_id(cudaStream_t stream, StreamId* id) noexcept {
  if (driver_stream_id_ != nullptr && explicit_stream(stream) &&
      reinterpret_cast<DriverStreamId>(driver_stream_id_)(reinterpret_cast<CUstream>(stream),
                                                          id) == CUDA_SUCCESS) {
    return cudaSuccess;
  }
  // The runtime's call, for the default streams and for the runtime's own error code.
  return on_device(ordinal_, [&] { return cudaStreamGetId(stream, id); });
}

cudaError_t CudaDevice::capture_info(cudaStream_t stream, CaptureStatus* status,
                                     CaptureId* id) noexcept {
  if (driver_capture_info_ != nullptr && explicit_stream(stream)) {
    CUstreamCaptureStatus driver_status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t capture = 0;
    const CUresult result =
        id == nullptr && driver_is_capturing_ != nullptr
            ? reinterpret_cast<DriverIsCapturing>(driver_is_capturing_)(
                  reinterpret_cast<CUstream>(stream), &driver_status)
            : reinterpret_cast<DriverCaptureInfo>(driver_capture_info_)(
                  reinterpret_cast<CUstream>(stream), &driver_status, &capture, nullptr, nullptr,
                  nullptr, nullptr);
    if (result == CUDA_SUCCESS) {
      switch (driver_status) {
        case CU_STREAM_CAPTURE_STATUS_NONE: *status = CaptureStatus::none; break;
        case CU_STREAM_CAPTURE_STATUS_ACTIVE: *status = CaptureStatus::active; break;
        case CU_STREAM_CAPTURE_STATUS_INVALIDATED: *status = CaptureStatus::invalidated; break;
      }
      if (id != nullptr) *id = driver_status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? capture : 0;
      return cudaSuccess;
    }
  }
  return on_device(ordinal_, [&] {
    cudaStreamCaptureStatus cuda_status = cudaStreamCaptureStatusNone;
    unsigned long long capture = 0;
    const cudaError_t result = cudaStreamGetCaptureInfo(stream, &cuda_status, &capture);
    if (result != cudaSuccess) return result;
    switch (cuda_status) {
      case cudaStreamCaptureStatusNone: *status = CaptureStatus::none; break;
      case cudaStreamCaptureStatusActive: *status = CaptureStatus::active; break;
      case cudaStreamCaptureStatusInvalidated: *status = CaptureStatus::invalidated; break;
    }
    if (id != nullptr) *id = cuda_status == cudaStreamCaptureStatusActive ? capture : 0;
    return cudaSuccess;
  });
}

cudaError_t CudaDevice::begin_capture(cudaStream_t stream, CaptureMode mode) noexcept {
  return on_device(ordinal_, [&] { return cudaStreamBeginCapture(stream, to_cuda(mode)); });
}

cudaError_t CudaDevice::end_capture(cudaStream_t stream, cudaGraph_t* graph) noexcept {
  return on_device(ordinal_, [&] { return cudaStreamEndCapture(stream, graph); });
}

cudaError_t CudaDevice::graph_instantiate(cudaGraphExec_t* exec, cudaGraph_t graph) noexcept {
  return on_device(ordinal_, [&] { return cudaGraphInstantiate(exec, graph, 0); });
}

cudaError_t CudaDevice::graph_launch(cudaGraphExec_t exec, cudaStream_t stream) noexcept {
  return on_device(ordinal_, [&] { return cudaGraphLaunch(exec, stream); });
}

cudaError_t CudaDevice::graph_upload(cudaGraphExec_t exec, cudaStream_t stream) noexcept {
  return on_device(ordinal_, [&] { return cudaGraphUpload(exec, stream); });
}

cudaError_t CudaDevice::graph_exec_destroy(cudaGraphExec_t exec) noexcept {
  return on_device(ordinal_, [&] { return cudaGraphExecDestroy(exec); });
}

cudaError_t CudaDevice::graph_destroy(cudaGraph_t graph) noexcept {
  return on_device(ordinal_, [&] { return cudaGraphDestroy(graph); });
}

cudaError_t CudaDevice::user_object_create(cudaUserObject_t* object, void* ptr,
                                           cudaHostFn_t destroy) noexcept {
  return on_device(ordinal_, [&] {
    return cudaUserObjectCreate(object, ptr, destroy, 1, cudaUserObjectNoDestructorSync);
  });
}

cudaError_t CudaDevice::graph_retain_user_object(cudaGraph_t graph,
                                                 cudaUserObject_t object) noexcept {
  return on_device(ordinal_,
                   [&] { return cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove); });
}

cudaError_t CudaDevice::user_object_release(cudaUserObject_t object) noexcept {
  return on_device(ordinal_, [&] { return cudaUserObjectRelease(object, 1); });
}

// --- CudaStreamOps ------------------------------------------------------------------------------

CudaStreamOps::CudaStreamOps(std::shared_ptr<CudaDevice> device)
    : StreamOps(device), ordinal_(device->ordinal()) {}

cudaStream_t CudaStreamOps::create_stream(std::string_view) {
  cudaStream_t stream = nullptr;
  throw_on_cuda_error(on_device(ordinal_,
                                [&] {
                                  return cudaStreamCreateWithFlags(&stream,
                                                                   cudaStreamNonBlocking);
                                }),
                      "cudaStreamCreateWithFlags");
  return stream;
}

void CudaStreamOps::destroy_stream(cudaStream_t stream) {
  throw_on_cuda_error(on_device(ordinal_, [&] { return cudaStreamDestroy(stream); }),
                      "cudaStreamDestroy");
}

void CudaStreamOps::copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                         cudaStream_t stream, std::string_view) {
  const cudaMemcpyKind cuda_kind = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                                   : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                                      : cudaMemcpyDeviceToDevice;
  throw_on_cuda_error(
      on_device(ordinal_, [&] { return cudaMemcpyAsync(dst, src, bytes, cuda_kind, stream); }),
      "cudaMemcpyAsync");
}

void CudaStreamOps::set(void* dst, int value, std::size_t bytes, cudaStream_t stream,
                        std::string_view) {
  throw_on_cuda_error(
      on_device(ordinal_, [&] { return cudaMemsetAsync(dst, value, bytes, stream); }),
      "cudaMemsetAsync");
}

void CudaStreamOps::enqueue_work(cudaStream_t stream, std::string_view label,
                                 std::span<const MemoryAccess>, LaunchRef launch,
                                 std::function<void()>) {
  DeviceScope scope(ordinal_);
  throw_on_cuda_error(scope.status(), "cudaSetDevice");
  launch(stream);
  // A launch reports a bad configuration through the last error, which this clears.
  throw_on_cuda_error(cudaGetLastError(), "launch of " + std::string(label));
}

}  // namespace streampool
