// The stress command on GPU 0: the only CUDA code of the command. Each lane has two non-blocking
// streams, one event (created once, recorded on the first stream and waited on by the second
// whenever a check runs there), device counters that the check kernels add to (mismatches, which
// finish() reads back, and completed checks), and a copy of the completed count in mapped host
// memory (how far the thread runs ahead of the GPU, read without a CUDA call). Every CUDA call's
// status is checked, and the last error after every launch; a failure throws StressError naming
// the call.
//
// nvcc compiles this file: it includes no fmt (fmt 9's headers do not compile under nvcc 13).
#include "stress_target.hpp"

#include <streampool/cuda_device.hpp>

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

namespace streampool::bench {
namespace {

// At most this many blocks of 256 threads per kernel: enough to write 8 MiB in a few
// microseconds on an H200, and few enough that twelve threads' kernels run side by side.
constexpr unsigned max_blocks = 64;
constexpr unsigned block_threads = 256;

void checked(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw StressError(std::string(call) + ": " + cudaGetErrorName(status) + " (" +
                      cudaGetErrorString(status) + ")");
  }
}

__device__ std::uint64_t global_time_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every thread spins until `spin_ns` of real time have passed since it started, so that the
// write lands late and a block handed to another stream too early is caught; then the grid
// writes the tag into every word.
__global__ void spin_then_write_tag(unsigned* data, std::size_t words, std::uint32_t tag,
                                    std::uint32_t spin_ns) {
  const std::uint64_t until = global_time_ns() + spin_ns;
  while (global_time_ns() < until) __nanosleep(100);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    data[i] = tag;
  }
}

// Counts the words that differ from `tag`; then the first block's first thread counts the check
// as completed: in device memory (`counters[1]`), and copies the count to mapped host memory
// (`completed`) with a plain store, which the CPU reads without a CUDA call (system-scope
// atomics on host memory are not allowed on every machine). Two checks of the lane finishing
// together may store their counts out of order: the host's count is then one low until the next.
__global__ void count_tag_mismatches(const unsigned* data, std::size_t words, std::uint32_t tag,
                                     unsigned long long* counters,
                                     unsigned long long* completed) {
  unsigned long long* mismatches = counters;
  unsigned long long local = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    local += data[i] != tag;
  }
  if (local != 0) atomicAdd(mismatches, local);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned long long done = atomicAdd(counters + 1, 1ull) + 1;
    *static_cast<volatile unsigned long long*>(completed) = done;
  }
}

unsigned blocks_for(std::size_t words) {
  const std::size_t blocks = (words + block_threads - 1) / block_threads;
  return blocks == 0 ? 1u : blocks < max_blocks ? static_cast<unsigned>(blocks) : max_blocks;
}

// The runtime keeps the last error of any call in this thread, including ones that are not
// failures of the launch (the pool's cudaEventQuery of a pending fence leaves
// cudaErrorNotReady there): clear it before a launch, so that what is read after is the
// launch's own.
void clear_last_error() { static_cast<void>(cudaGetLastError()); }

class GpuLane final : public StressLane {
 public:
  explicit GpuLane(int ordinal) : ordinal_(ordinal) {
    try {
      enter_thread();
      checked(cudaStreamCreateWithFlags(&first_, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
      checked(cudaStreamCreateWithFlags(&second_, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
      checked(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming),
              "cudaEventCreateWithFlags");
      checked(cudaEventCreateWithFlags(&mark_, cudaEventDisableTiming),
              "cudaEventCreateWithFlags");
      void* counter = nullptr;
      checked(cudaMalloc(&counter, 2 * sizeof(unsigned long long)), "cudaMalloc (counters)");
      mismatches_ = static_cast<unsigned long long*>(counter);
      void* completed = nullptr;
      checked(cudaHostAlloc(&completed, sizeof(unsigned long long), cudaHostAllocMapped),
              "cudaHostAlloc (completed checks)");
      completed_ = static_cast<unsigned long long*>(completed);
      *completed_ = 0;
      // On first_, and waited for: a plain cudaMemset goes to the legacy stream, which
      // non-blocking streams do not wait for.
      checked(cudaMemsetAsync(mismatches_, 0, 2 * sizeof(unsigned long long), first_),
              "cudaMemsetAsync");
      checked(cudaStreamSynchronize(first_), "cudaStreamSynchronize");
    } catch (...) {
      release();
      throw;
    }
  }

  ~GpuLane() override { release(); }

  void enter_thread() override { checked(cudaSetDevice(ordinal_), "cudaSetDevice"); }
  cudaStream_t first() const override { return first_; }
  cudaStream_t second() const override { return second_; }

  void write_tag(unsigned* data, std::size_t words, std::uint32_t tag,
                 std::uint32_t spin_ns) override {
    clear_last_error();
    spin_then_write_tag<<<blocks_for(words), block_threads, 0, first_>>>(data, words, tag, spin_ns);
    checked(cudaGetLastError(), "launch of spin_then_write_tag");
  }

  void mark_first() override { checked(cudaEventRecord(mark_, first_), "cudaEventRecord"); }

  void check_tag(const unsigned* data, std::size_t words, std::uint32_t tag,
                 bool on_second) override {
    cudaStream_t stream = first_;
    if (on_second) {
      checked(cudaEventRecord(order_, first_), "cudaEventRecord");
      checked(cudaStreamWaitEvent(second_, order_, 0), "cudaStreamWaitEvent");
      stream = second_;
    }
    clear_last_error();
    count_tag_mismatches<<<blocks_for(words), block_threads, 0, stream>>>(data, words, tag,
                                                                          mismatches_, completed_);
    checked(cudaGetLastError(), "launch of count_tag_mismatches");
    ++launched_checks_;
  }

  void renew_first() override {
    // CUDA lets a stream with pending work be destroyed: the work completes, and the handle is
    // usually given to the very next stream created (seen on the H200).
    const cudaStream_t old = first_;
    first_ = nullptr;
    checked(cudaStreamDestroy(old), "cudaStreamDestroy");
    checked(cudaStreamCreateWithFlags(&first_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }

  std::uint64_t finish() override {
    checked(cudaStreamSynchronize(first_), "cudaStreamSynchronize");
    checked(cudaStreamSynchronize(second_), "cudaStreamSynchronize");
    unsigned long long count = 0;
    checked(cudaMemcpy(&count, mismatches_, sizeof count, cudaMemcpyDeviceToHost),
            "cudaMemcpy (mismatch counter)");
    return count;
  }

  std::uint64_t checks_in_flight() const override {
    const std::uint64_t done = *static_cast<volatile unsigned long long*>(completed_);
    return launched_checks_ > done ? launched_checks_ - done : 0;
  }

 private:
  int ordinal_;
  cudaStream_t first_ = nullptr;
  cudaStream_t second_ = nullptr;
  cudaEvent_t order_ = nullptr;
  cudaEvent_t mark_ = nullptr;  // mark_first()'s
  unsigned long long* mismatches_ = nullptr;  // device: [0] mismatches, [1] completed checks
  unsigned long long* completed_ = nullptr;  // host memory, mapped: written by the checks
  std::uint64_t launched_checks_ = 0;

  // After finish() has waited for the lane's work (or a failure ended the run): what fails here
  // can only be reported as lost, and the run has already said what went wrong.
  void release() noexcept {
    if (mismatches_ != nullptr) static_cast<void>(cudaFree(mismatches_));
    if (completed_ != nullptr) static_cast<void>(cudaFreeHost(completed_));
    completed_ = nullptr;
    if (order_ != nullptr) static_cast<void>(cudaEventDestroy(order_));
    if (mark_ != nullptr) static_cast<void>(cudaEventDestroy(mark_));
    for (cudaStream_t s : {first_, second_}) {
      if (s != nullptr) static_cast<void>(cudaStreamDestroy(s));
    }
    mismatches_ = nullptr;
    order_ = mark_ = nullptr;
    first_ = second_ = nullptr;
  }
};

class GpuStressTarget final : public StressTarget {
 public:
  GpuStressTarget() : device_(make_device()) {
    cudaDeviceProp props{};
    checked(cudaGetDeviceProperties(&props, device_->ordinal()), "cudaGetDeviceProperties");
    description_ = props.name;
    // How many hardware queues CUDA gives the process's streams (8 unless set): with more streams
    // than queues, unrelated streams share a queue and wait for each other, which changes what the
    // run measures (bench/results/stress-h200.md).
    const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    description_ += ", CUDA_DEVICE_MAX_CONNECTIONS=";
    description_ += connections != nullptr ? connections : "8 (unset)";
  }

  std::shared_ptr<Device> device() const override { return device_; }
  std::string description() const override { return description_; }
  std::unique_ptr<StressLane> make_lane() override {
    return std::make_unique<GpuLane>(device_->ordinal());
  }
  // After the workers: wait for everything, so that an error of any kernel surfaces here.
  void stop() override { checked(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

 private:
  static std::shared_ptr<CudaDevice> make_device() {
    if (CudaDevice::count() == 0) throw StressError("no GPU: CUDA sees none (use --fake)");
    return std::make_shared<CudaDevice>(0);
  }

  std::shared_ptr<CudaDevice> device_;
  std::string description_;
};

}  // namespace

std::unique_ptr<StressTarget> make_gpu_stress_target() {
  return std::make_unique<GpuStressTarget>();
}

bool gpu_stress_built() noexcept { return true; }

}  // namespace streampool::bench
