// An allocator-free probe: when the stress bench's 24 streams share CUDA's hardware queues, does
// the GPU finish the same kernels sooner if the threads submit them more slowly?
//
// 12 threads, two non-blocking streams each, the stress bench's loop without a buffer: a "tag"
// kernel that spins 0-60 us on the first stream, then a "check" kernel that spins 0-4 us and
// counts itself, on the first stream or (a third of the time) on the second after an event;
// every thread at most 32 checks ahead of the GPU, read from mapped host memory without a CUDA
// call. Each configuration adds W ns of host busy work (no CUDA call) to every iteration, either
// between the two launches or after the check's, and runs for S seconds; it prints the
// iterations per second of all threads together. ":fence" records an event after the check's
// launch on each stream the iteration used, as fence_every_free's drop does (then W ns after
// it): do the event records themselves, and not only the time a drop takes, change the rate?
//
// Not built by CMake (a throwaway of 2026-12-06, kept for its result: bench/results/
// h100-hardware-queues.md). Build and run on a GPU machine:
//
//   nvcc -O2 -arch=sm_90 -std=c++17 bench/probes/hardware_queues.cu -o hardware_queues
//   [CUDA_DEVICE_MAX_CONNECTIONS=32] ./hardware_queues S W[:after|:between|:fence] ...
//
// e.g. `./hardware_queues 4 0 4000:after 4000:between 0 8000:after` (":after" when omitted).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

#define CHECK(call)                                                                  \
  do {                                                                               \
    const cudaError_t e = (call);                                                    \
    if (e != cudaSuccess) {                                                          \
      std::printf("%s: %s\n", #call, cudaGetErrorString(e));                        \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void spin_for(unsigned ns) {
  const unsigned long long start = now_ns();
  while (now_ns() - start < ns) {
  }
}

__global__ void tag(unsigned ns) { spin_for(ns); }

// Counts itself in device memory (`counter[0]`, the highest count stored in `counter[1]`), then
// copies the highest count to mapped host memory with a plain store: atomics on host memory are
// not allowed on every machine.
__global__ void check(unsigned ns, unsigned long long* counter, unsigned long long* done) {
  spin_for(ns);
  const unsigned long long n = atomicAdd(counter, 1ull) + 1;
  atomicMax(counter + 1, n);
  *static_cast<volatile unsigned long long*>(done) =
      *static_cast<volatile unsigned long long*>(counter + 1);
}

void busy_for(long ns) {
  if (ns <= 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < end) {
  }
}

enum class Where { between, after, fence };

struct Config {
  long work_ns;
  Where where;
};

struct Lane {
  cudaStream_t first, second;
  cudaEvent_t order;
  cudaEvent_t fence_first, fence_second;  // ":fence"
  unsigned long long* counter;  // device memory: [0] checks done, [1] the highest count stored
  unsigned long long* done;     // mapped host memory: checks done, as the GPU last stored it
  unsigned long long* done_on_device;
};

unsigned long long read_done(const Lane& lane) {
  return *static_cast<volatile unsigned long long*>(lane.done);
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int threads = 12;
  constexpr unsigned long long max_in_flight = 32;
  const double seconds = argc > 1 ? std::atof(argv[1]) : 4;
  std::vector<Config> configs;
  for (int i = 2; i < argc; ++i) {
    const char* colon = std::strchr(argv[i], ':');
    const char where = colon != nullptr ? colon[1] : 'a';
    configs.push_back({std::atol(argv[i]), where == 'b'   ? Where::between
                                           : where == 'f' ? Where::fence
                                                          : Where::after});
  }

  CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
  std::vector<Lane> lanes(threads);
  for (Lane& lane : lanes) {
    CHECK(cudaStreamCreateWithFlags(&lane.first, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&lane.second, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&lane.order, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&lane.fence_first, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&lane.fence_second, cudaEventDisableTiming));
    CHECK(cudaHostAlloc(&lane.done, sizeof *lane.done, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(&lane.done_on_device, lane.done, 0));
    CHECK(cudaMalloc(&lane.counter, 2 * sizeof *lane.counter));
  }
  const char* queues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");

  for (const Config config : configs) {
    std::atomic<long> total{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        Lane& lane = lanes[t];
        std::mt19937 rng(1234 + t);
        std::uniform_int_distribution<unsigned> tag_ns(0, 60000), check_ns(0, 4000), third(0, 2);
        CHECK(cudaMemsetAsync(lane.counter, 0, 2 * sizeof *lane.counter, lane.first));
        CHECK(cudaStreamSynchronize(lane.first));
        *static_cast<volatile unsigned long long*>(lane.done) = 0;
        unsigned long long launched = 0;
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (std::chrono::steady_clock::now() < end) {
          // Bounded by the deadline too, so that a lost count cannot hang the probe.
          while (launched - read_done(lane) > max_in_flight &&
                 std::chrono::steady_clock::now() < end + std::chrono::seconds(2)) {
            std::this_thread::yield();
          }
          tag<<<1, 1, 0, lane.first>>>(tag_ns(rng));
          if (config.where == Where::between) busy_for(config.work_ns);
          cudaStream_t stream = lane.first;
          if (third(rng) == 0) {
            CHECK(cudaEventRecord(lane.order, lane.first));
            CHECK(cudaStreamWaitEvent(lane.second, lane.order, 0));
            stream = lane.second;
          }
          check<<<1, 1, 0, stream>>>(check_ns(rng), lane.counter, lane.done_on_device);
          ++launched;
          if (config.where == Where::fence) {
            CHECK(cudaEventRecord(lane.fence_first, lane.first));
            if (stream == lane.second) CHECK(cudaEventRecord(lane.fence_second, lane.second));
          }
          if (config.where != Where::between) busy_for(config.work_ns);
        }
        CHECK(cudaStreamSynchronize(lane.first));
        CHECK(cudaStreamSynchronize(lane.second));
        CHECK(cudaGetLastError());
        if (read_done(lane) != launched) {
          std::printf("lane %d: %llu of %llu checks seen\n", t, read_done(lane), launched);
        }
        total += static_cast<long>(launched);
      });
    }
    const auto start = std::chrono::steady_clock::now();
    for (std::thread& worker : workers) worker.join();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("queues %s  host work %5ld ns %-7s  %9.0f iterations/s\n",
                queues != nullptr ? queues : "8 (unset)", config.work_ns,
                config.where == Where::fence     ? "fence"
                : config.work_ns == 0             ? ""
                : config.where == Where::between ? "between"
                                                  : "after",
                static_cast<double>(total) / elapsed);
    std::fflush(stdout);
  }
}
