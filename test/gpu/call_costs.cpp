// Costs of single CUDA calls, runtime and driver entry points side by side: the numbers the pool's
// fast path is designed around. Run on the GPU machine by tools/gpu-check.sh.
#include <streampool/cuda_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

namespace {

template <class F>
double median_ns(F&& call, int iterations = 200000) {
  std::vector<double> runs;
  for (int r = 0; r < 7; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) call();
    const auto stop = std::chrono::steady_clock::now();
    runs.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / iterations);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

template <class Fn>
Fn entry(const char* symbol, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    std::printf("no driver entry point %s\n", symbol);
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

// The virtual-memory calls behind expandable segments, through the pool's seam: what one
// growth or give-back costs at each mapping size, and whether set access and unmap over many
// granule mappings at once cost less than one call each.
void vm_costs(streampool::CudaDevice& cuda) {
  std::size_t granule = 0;
  if (cuda.vm_granularity(&granule) != cudaSuccess || granule == 0) {
    std::puts("no virtual memory management");
    return;
  }
  void* base = nullptr;
  const std::size_t span = std::size_t{4} << 30;
  if (cuda.vm_reserve(&base, span) != cudaSuccess) {
    std::puts("vm_reserve failed");
    return;
  }
  auto* at = static_cast<std::byte*>(base);
  using clock = std::chrono::steady_clock;
  const auto us = [](clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  std::printf("%-52s %8s %8s %8s %8s %8s\n", "vm, mapping size (medians, us)", "create", "map",
              "access", "unmap", "release");
  for (std::size_t mib : {2, 8, 32, 128, 1024}) {
    const std::size_t bytes = mib << 20;
    std::vector<double> t[5];
    for (int r = 0; r < (mib >= 128 ? 5 : 15); ++r) {
      streampool::VmHandle h = 0;
      auto t0 = clock::now();
      if (cuda.vm_create(&h, bytes) != cudaSuccess) { std::puts("vm_create failed"); break; }
      auto t1 = clock::now();
      cuda.vm_map(at, bytes, h);
      auto t2 = clock::now();
      cuda.vm_set_access(at, bytes, cuda.own_access());
      auto t3 = clock::now();
      cuda.vm_unmap(at, bytes);
      auto t4 = clock::now();
      cuda.vm_release(h);
      auto t5 = clock::now();
      t[0].push_back(us(t1 - t0)); t[1].push_back(us(t2 - t1)); t[2].push_back(us(t3 - t2));
      t[3].push_back(us(t4 - t3)); t[4].push_back(us(t5 - t4));
    }
    const auto med = [](std::vector<double>& v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("vm %6zu MiB %39s %8.1f %8.1f %8.1f %8.1f %8.1f\n", mib, "", med(t[0]), med(t[1]),
                med(t[2]), med(t[3]), med(t[4]));
  }
  // k granule mappings side by side: one set access and one unmap over all of them, and moving
  // them (unmap, map elsewhere, set access) without releasing the handles.
  for (int k : {16, 64}) {
    std::vector<streampool::VmHandle> handles(k);
    auto t0 = clock::now();
    for (int i = 0; i < k; ++i) cuda.vm_create(&handles[i], granule);
    auto t1 = clock::now();
    for (int i = 0; i < k; ++i) cuda.vm_map(at + i * granule, granule, handles[i]);
    auto t2 = clock::now();
    cuda.vm_set_access(at, k * granule, cuda.own_access());
    auto t3 = clock::now();
    cuda.vm_unmap(at, k * granule);
    auto t4 = clock::now();
    std::byte* elsewhere = at + (std::size_t{2} << 30);
    for (int i = 0; i < k; ++i) cuda.vm_map(elsewhere + i * granule, granule, handles[i]);
    cuda.vm_set_access(elsewhere, k * granule, cuda.own_access());
    auto t5 = clock::now();
    cuda.vm_unmap(elsewhere, k * granule);
    for (int i = 0; i < k; ++i) cuda.vm_release(handles[i]);
    auto t6 = clock::now();
    std::printf("vm %2d x %zu MiB: create all %8.1f us, map all %8.1f, one access %8.1f, one unmap "
                "%8.1f, remap+access %8.1f, unmap+release all %8.1f\n",
                k, granule >> 20, us(t1 - t0), us(t2 - t1), us(t3 - t2), us(t4 - t3),
                us(t5 - t4), us(t6 - t5));
  }
  cuda.vm_unreserve(base, span);
}

}  // namespace

int main() {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::puts("no CUDA device");
    return 77;
  }
  cudaEvent_t event = nullptr;
  cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  unsigned long long id = 0;
  int device = 0;
  cudaStreamCaptureStatus status{};
  using GetId = CUresult (*)(CUstream, unsigned long long*);
  using IsCapturing = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  using GetCaptureInfo = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                      const CUgraphNode**, const CUgraphEdgeData**, size_t*);
  const auto cu_get_id = entry<GetId>("cuStreamGetId", 12000);
  const auto cu_is_capturing = entry<IsCapturing>("cuStreamIsCapturing", 10000);
  const auto cu_capture_info = entry<GetCaptureInfo>("cuStreamGetCaptureInfo", 12030);
  CUstreamCaptureStatus cu_status{};
  cuuint64_t capture = 0;

  std::printf("%-52s %8s\n", "call", "ns");
  std::printf("%-52s %8.1f\n", "cudaGetDevice", median_ns([&] { cudaGetDevice(&device); }));
  std::printf("%-52s %8.1f\n", "cudaStreamGetId", median_ns([&] { cudaStreamGetId(stream, &id); }));
  std::printf("%-52s %8.1f\n", "cudaStreamGetId(cudaStreamPerThread)",
              median_ns([&] { cudaStreamGetId(cudaStreamPerThread, &id); }));
  std::printf("%-52s %8.1f\n", "cudaStreamIsCapturing",
              median_ns([&] { cudaStreamIsCapturing(stream, &status); }));
  std::printf("%-52s %8.1f\n", "cudaStreamGetCaptureInfo(status, id)",
              median_ns([&] { cudaStreamGetCaptureInfo(stream, &status, &id); }));
  if (cu_get_id != nullptr) {
    std::printf("%-52s %8.1f\n", "cuStreamGetId (driver entry point)",
                median_ns([&] { cu_get_id(reinterpret_cast<CUstream>(stream), &id); }));
  }
  if (cu_is_capturing != nullptr) {
    std::printf("%-52s %8.1f\n", "cuStreamIsCapturing (driver entry point)",
                median_ns([&] { cu_is_capturing(reinterpret_cast<CUstream>(stream), &cu_status); }));
  }
  if (cu_capture_info != nullptr) {
    std::printf("%-52s %8.1f\n", "cuStreamGetCaptureInfo (driver entry point)",
                median_ns([&] {
                  cu_capture_info(reinterpret_cast<CUstream>(stream), &cu_status, &capture, nullptr,
                                  nullptr, nullptr, nullptr);
                }));
  }
  // Do the calls serialize threads? 16 threads, each on its own stream.
  for (int threads : {1, 16}) {
    for (int driver = 0; driver < 2; ++driver) {
      if (driver == 1 && cu_get_id == nullptr) continue;
      std::vector<cudaStream_t> streams(threads);
      for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      constexpr int calls = 200000;
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          unsigned long long mine = 0;
          for (int i = 0; i < calls; ++i) {
            if (driver == 1) cu_get_id(reinterpret_cast<CUstream>(streams[t]), &mine);
            else cudaStreamGetId(streams[t], &mine);
          }
        });
      }
      for (auto& w : workers) w.join();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%-52s %8.1f\n",
                  threads == 1 ? (driver ? "cuStreamGetId, 1 thread, M calls/s"
                                         : "cudaStreamGetId, 1 thread, M calls/s")
                               : (driver ? "cuStreamGetId, 16 threads, M calls/s"
                                         : "cudaStreamGetId, 16 threads, M calls/s"),
                  threads * calls / seconds / 1e6);
      for (auto& s : streams) cudaStreamDestroy(s);
    }
  }
  std::printf("%-52s %8.1f\n", "cudaEventRecord",
              median_ns([&] { cudaEventRecord(event, stream); }, 20000));
  cudaStreamSynchronize(stream);
  std::printf("%-52s %8.1f\n", "cudaEventQuery (complete)",
              median_ns([&] { cudaEventQuery(event); }, 20000));
  std::printf("%-52s %8.1f\n", "cudaStreamWaitEvent",
              median_ns([&] { cudaStreamWaitEvent(stream, event, 0); }, 20000));

  // A first look at the pool's own fast path (the bench measures it properly, against peers).
  auto cuda = std::make_shared<streampool::CudaDevice>(0);
  for (auto checks : {streampool::StreamChecks::none, streampool::StreamChecks::identity,
                      streampool::StreamChecks::full}) {
    streampool::PoolOptions options;
    options.read_environment = false;
    options.stream_checks = checks;
    streampool::MemoryPool pool(cuda, options);
    const char* name = checks == streampool::StreamChecks::none       ? "none"
                       : checks == streampool::StreamChecks::identity ? "identity"
                                                                      : "full";
    for (std::size_t bytes : {std::size_t{256}, std::size_t{65536}, std::size_t{16} << 20}) {
      const double ns = median_ns([&] {
        streampool::PooledBuffer<std::byte>::alloc_async(pool, bytes, stream).reset();
      });
      std::printf("pool pair %-9s %10zu B                        %8.1f\n", name, bytes, ns);
    }
    for (int threads : {1, 4, 16}) {
      std::vector<cudaStream_t> streams(threads);
      for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      constexpr int pairs = 200000;
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          for (int i = 0; i < pairs; ++i) {
            streampool::PooledBuffer<std::byte>::alloc_async(pool, 65536, streams[t]).reset();
          }
        });
      }
      for (auto& w : workers) w.join();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("pool threads %-9s %2d x 64 KiB   M pairs/s        %8.1f\n", name, threads,
                  threads * pairs / seconds / 1e6);
      for (auto& s : streams) {
        pool.release_stream(s);
        cudaStreamDestroy(s);
      }
    }
  }
  vm_costs(*cuda);
  cudaEventDestroy(event);
  cudaStreamDestroy(stream);
  return 0;
}
