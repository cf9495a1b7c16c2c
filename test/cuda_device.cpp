// CudaDevice on whatever machine runs the tests: without a GPU, construction fails cleanly with
// CUDA's own message; with one, it works and count() agrees.
#include <streampool/cuda_device.hpp>
#include <streampool/error.hpp>

#include <catch2/catch.hpp>

TEST_CASE("CudaDevice construction fails with a clear error exactly where there is no GPU") {
  const int count = streampool::CudaDevice::count();
  if (count == 0) {
    try {
      streampool::CudaDevice device(0);
      FAIL("constructed a CudaDevice with no GPU");
    } catch (const streampool::Error& e) {
      REQUIRE(e.errc() == streampool::Errc::no_device);
      // CUDA's own name for what went wrong (no driver, or no device) is in the message, and
      // its value in cuda_error() when CUDA refused to count the devices.
      REQUIRE_THAT(e.what(), Catch::Contains("cudaError"));
      int n = 0;
      const cudaError_t status = cudaGetDeviceCount(&n);
      cudaGetLastError();
      if (status != cudaSuccess) REQUIRE(e.cuda_error() == status);
    }
  } else {
    streampool::CudaDevice device(0);
    REQUIRE(device.ordinal() == 0);
  }
  REQUIRE_THROWS_AS(streampool::CudaDevice(-1), streampool::Error);
}
