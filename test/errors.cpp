// Errors: one code enum, one category, one exception type; CUDA's own words survive the trip.
#include <streampool/error.hpp>

#include <catch2/catch.hpp>

using streampool::Errc;
using streampool::Error;

TEST_CASE("library codes belong to the streampool category and have messages") {
  const std::error_code code = Errc::out_of_memory;
  REQUIRE(code.category() == streampool::category());
  REQUIRE(std::string(code.category().name()) == "streampool");
  REQUIRE(code.message() == "out of device memory");
  REQUIRE(code == std::errc::not_enough_memory);
  REQUIRE(std::error_code(Errc::invalid_value) == std::errc::invalid_argument);
  REQUIRE_FALSE(std::error_code(Errc::device_error) == std::errc::not_enough_memory);
}

TEST_CASE("CUDA errors map to the library's codes") {
  using streampool::errc_from_cuda;
  REQUIRE(errc_from_cuda(cudaSuccess) == Errc::success);
  REQUIRE(errc_from_cuda(cudaErrorMemoryAllocation) == Errc::out_of_memory);
  REQUIRE(errc_from_cuda(cudaErrorInvalidValue) == Errc::invalid_value);
  REQUIRE(errc_from_cuda(cudaErrorNoDevice) == Errc::no_device);
  REQUIRE(errc_from_cuda(cudaErrorInsufficientDriver) == Errc::no_device);
  REQUIRE(errc_from_cuda(cudaErrorStreamCaptureInvalidated) == Errc::capture_invalidated);
  REQUIRE(errc_from_cuda(cudaErrorLaunchFailure) == Errc::device_error);
}

TEST_CASE("an Error from CUDA keeps CUDA's name, message and code") {
  const Error error(cudaErrorMemoryAllocation, "cudaMalloc of 1024 bytes");
  REQUIRE(error.errc() == Errc::out_of_memory);
  REQUIRE(error.cuda_error() == cudaErrorMemoryAllocation);
  REQUIRE_THAT(error.what(), Catch::StartsWith("cudaMalloc of 1024 bytes: "));
  REQUIRE_THAT(error.what(), Catch::Contains("cudaErrorMemoryAllocation"));
  REQUIRE_THAT(error.what(), Catch::Contains("out of memory"));
}

TEST_CASE("Error is a std::system_error carrying the library code") {
  try {
    throw Error(Errc::capture_pool_sealed, "allocation of 64 bytes");
  } catch (const std::system_error& e) {
    REQUIRE(e.code() == Errc::capture_pool_sealed);
    REQUIRE_THAT(e.what(), Catch::Contains("allocation of 64 bytes"));
    return;
  }
  FAIL("not thrown");
}

TEST_CASE("throw_on_cuda_error throws only on failure") {
  REQUIRE_NOTHROW(streampool::throw_on_cuda_error(cudaSuccess, "fine"));
  REQUIRE_THROWS_AS(streampool::throw_on_cuda_error(cudaErrorInvalidValue, "bad"), Error);
}
