// The device contract, run on the real GPU and on the fake device in the same run: both must
// behave the same wherever a behaviour is observable on both.
#include "cuda_harness.hpp"
#include "fake_harness.hpp"

#define STREAMPOOL_CONTRACT_HARNESSES CudaHarness, FakeHarness
#include "device_contract.hpp"

TEST_CASE("CudaDevice restores the caller's current device", "[cuda]") {
  int before = -1;
  REQUIRE(cudaGetDevice(&before) == cudaSuccess);
  const int last = streampool::CudaDevice::count() - 1;
  streampool::CudaDevice device(last);
  void* ptr = nullptr;
  REQUIRE(device.malloc(&ptr, 1 << 20) == cudaSuccess);
  int after = -1;
  REQUIRE(cudaGetDevice(&after) == cudaSuccess);
  REQUIRE(after == before);
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, ptr) == cudaSuccess);
  REQUIRE(attributes.device == last);
  REQUIRE(device.free(ptr) == cudaSuccess);
}

TEST_CASE("CudaDevice refuses an ordinal CUDA does not have, with a clear error", "[cuda]") {
  try {
    streampool::CudaDevice device(streampool::CudaDevice::count());
    FAIL("constructed");
  } catch (const streampool::Error& e) {
    REQUIRE(e.errc() == streampool::Errc::no_device);
    REQUIRE_THAT(e.what(), Catch::Contains("device"));
  }
}
