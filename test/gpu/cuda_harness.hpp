// The device-contract harness over CudaDevice and a real GPU (see device_contract.hpp).
#pragma once

#include "kernels.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <thread>

struct CudaHarness {
  static constexpr const char* name = "cuda";

  streampool::CudaDevice cuda{0};
  int* flag = nullptr;  // host-mapped: kernels spin on it, release() writes it
  int tickets = 0;

  CudaHarness() {
    REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped) ==
            cudaSuccess);
    *flag = 0;
  }
  ~CudaHarness() {
    release();
    cudaDeviceSynchronize();
    cudaFreeHost(flag);
  }
  CudaHarness(const CudaHarness&) = delete;
  CudaHarness& operator=(const CudaHarness&) = delete;

  streampool::Device& device() { return cuda; }
  cudaStream_t create_stream() {
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    return stream;
  }
  void destroy_stream(cudaStream_t stream) { REQUIRE(cudaStreamDestroy(stream) == cudaSuccess); }
  void launch_blocked(cudaStream_t stream) {
    REQUIRE(gpu_test::launch_spin(stream, device_flag(), ++tickets) == cudaSuccess);
  }
  void launch_short(cudaStream_t stream) { REQUIRE(gpu_test::launch_noop(stream) == cudaSuccess); }
  void release() { __atomic_store_n(flag, tickets, __ATOMIC_SEQ_CST); }
  std::size_t refused_size() { return std::size_t{1} << 50; }  // 1 PiB
  bool wait_until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return done();
  }

 private:
  const volatile int* device_flag() {
    int* device = nullptr;
    REQUIRE(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), flag, 0) == cudaSuccess);
    return device;
  }
};
