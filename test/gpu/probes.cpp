// Probes: what CUDA does in corners the fake device must copy. Hidden tests ([.probe]) that print
// what they see rather than assert it; tools/gpu-check.sh runs them and keeps the output, and each
// answer, once seen, becomes an assertion of the device contract.
#include "kernels.hpp"

#include <cuda.h>

#include <catch2/catch.hpp>

#include <cstdio>
#include <thread>

namespace {

const char* status_name(cudaStreamCaptureStatus status) {
  switch (status) {
    case cudaStreamCaptureStatusNone: return "none";
    case cudaStreamCaptureStatusActive: return "active";
    case cudaStreamCaptureStatusInvalidated: return "invalidated";
  }
  return "?";
}

void report(const char* what, cudaError_t status, cudaStream_t capturing = nullptr) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (capturing != nullptr) cudaStreamIsCapturing(capturing, &capture);
  std::printf("probe: %-64s -> %s%s%s\n", what, cudaGetErrorName(status),
              capturing != nullptr ? ", capture " : "",
              capturing != nullptr ? status_name(capture) : "");
  cudaGetLastError();
}

cudaError_t end(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  return status;
}

}  // namespace

TEST_CASE("probe what CUDA refuses and allows around capture", "[.probe]") {
  cudaStream_t s = nullptr;
  cudaStream_t other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t outside = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventRecord(outside, other) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);

  const struct {
    cudaStreamCaptureMode mode;
    const char* name;
  } modes[] = {{cudaStreamCaptureModeGlobal, "global"},
               {cudaStreamCaptureModeThreadLocal, "thread-local"},
               {cudaStreamCaptureModeRelaxed, "relaxed"}};
  char what[160];
  for (const auto& m : modes) {
    cudaStreamBeginCapture(s, m.mode);
    std::snprintf(what, sizeof what, "[%s] cudaStreamWaitEvent(capturing, outside event)", m.name);
    report(what, cudaStreamWaitEvent(s, outside, 0), s);
    report("  end capture", end(s));

    cudaStreamBeginCapture(s, m.mode);
    std::snprintf(what, sizeof what, "[%s] cudaDeviceSynchronize", m.name);
    report(what, cudaDeviceSynchronize(), s);
    report("  end capture", end(s));

    cudaStreamBeginCapture(s, m.mode);
    std::snprintf(what, sizeof what, "[%s] cudaStreamSynchronize(other stream)", m.name);
    report(what, cudaStreamSynchronize(other), s);
    report("  end capture", end(s));

    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, 4096) == cudaSuccess);
    cudaStreamBeginCapture(s, m.mode);
    std::snprintf(what, sizeof what, "[%s] cudaFree", m.name);
    const cudaError_t freed = cudaFree(p);
    report(what, freed, s);
    report("  end capture", end(s));
    if (freed != cudaSuccess) cudaFree(p);

    cudaStreamBeginCapture(s, m.mode);
    std::snprintf(what, sizeof what, "[%s] cudaEventSynchronize(outside event)", m.name);
    report(what, cudaEventSynchronize(outside), s);
    report("  end capture", end(s));

    cudaStreamBeginCapture(s, m.mode);
    std::snprintf(what, sizeof what, "[%s] cudaEventRecord(outside event, other stream)", m.name);
    report(what, cudaEventRecord(outside, other), s);
    report("  end capture", end(s));
    cudaStreamSynchronize(other);

    cudaStreamBeginCapture(s, m.mode);
    size_t free_bytes = 0, total_bytes = 0;
    std::snprintf(what, sizeof what, "[%s] cudaMemGetInfo", m.name);
    report(what, cudaMemGetInfo(&free_bytes, &total_bytes), s);
    report("  end capture", end(s));

    cudaStreamBeginCapture(s, m.mode);
    cudaEvent_t fresh = nullptr;
    std::snprintf(what, sizeof what, "[%s] cudaEventCreate + Destroy", m.name);
    cudaError_t created = cudaEventCreateWithFlags(&fresh, cudaEventDisableTiming);
    report(what, created == cudaSuccess ? cudaEventDestroy(fresh) : created, s);
    report("  end capture", end(s));

    cudaStreamBeginCapture(s, m.mode);
    cudaError_t from_thread = cudaErrorUnknown;
    std::thread([&] { from_thread = end(s); }).join();
    std::snprintf(what, sizeof what, "[%s] cudaStreamEndCapture from another thread", m.name);
    report(what, from_thread, s);
    report("  end capture on the capturing thread", end(s));
  }

  report("cudaStreamBeginCapture(legacy stream)",
         cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal));
  report("cudaStreamBeginCapture(0)", cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal));
  report("cudaStreamEndCapture(not capturing)", end(s));
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  report("cudaStreamBeginCapture(already capturing)",
         cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), s);
  report("  end capture", end(s));

  void* zero = reinterpret_cast<void*>(1);
  report("cudaMalloc(0)", cudaMalloc(&zero, 0));
  std::printf("probe: %-64s -> %p\n", "  pointer from cudaMalloc(0)", zero);
  int local = 0;
  report("cudaFree(host pointer)", cudaFree(&local));

  // Not probed: cudaStreamGetId on a destroyed stream's handle crashed the process (seen on the
  // H200, CUDA 13.0), which is why the seam requires a live stream.

  REQUIRE(cudaEventDestroy(outside) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
  SUCCEED("printed");
}

TEST_CASE("probe stream ids and capture queries during capture", "[.probe]") {
  using GetId = CUresult (*)(CUstream, unsigned long long*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  REQUIRE(cudaGetDriverEntryPointByVersion("cuStreamGetId", &fn, 12000, cudaEnableDefault,
                                           &found) == cudaSuccess);
  const auto cu_get_id = reinterpret_cast<GetId>(fn);
  cudaStream_t s = nullptr;
  cudaStream_t other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  const struct {
    cudaStreamCaptureMode mode;
    const char* name;
  } modes[] = {{cudaStreamCaptureModeGlobal, "global"},
               {cudaStreamCaptureModeThreadLocal, "thread-local"},
               {cudaStreamCaptureModeRelaxed, "relaxed"}};
  char what[160];
  unsigned long long id = 0;
  for (const auto& m : modes) {
    const auto each = [&](const char* call, auto&& fn_call) {
      cudaStreamBeginCapture(s, m.mode);
      std::snprintf(what, sizeof what, "[%s] %s", m.name, call);
      report(what, fn_call(), s);
      report("  end capture", end(s));
    };
    each("cuStreamGetId(capturing)", [&] {
      return static_cast<cudaError_t>(cu_get_id(reinterpret_cast<CUstream>(s), &id));
    });
    each("cudaStreamGetId(capturing)", [&] { return cudaStreamGetId(s, &id); });
    each("cuStreamGetId(other stream)", [&] {
      return static_cast<cudaError_t>(cu_get_id(reinterpret_cast<CUstream>(other), &id));
    });
    each("cudaStreamGetId(other stream)", [&] { return cudaStreamGetId(other, &id); });
    each("cudaStreamGetId(other stream, other thread)", [&] {
      cudaError_t r = cudaErrorUnknown;
      std::thread([&] { r = cudaStreamGetId(other, &id); }).join();
      return r;
    });
    each("cudaStreamGetId(per-thread default stream)",
         [&] { return cudaStreamGetId(cudaStreamPerThread, &id); });
    each("cudaGetDevice", [&] {
      int device = -1;
      return cudaGetDevice(&device);
    });
  }
  cudaStreamDestroy(s);
  cudaStreamDestroy(other);
  SUCCEED("printed");
}
