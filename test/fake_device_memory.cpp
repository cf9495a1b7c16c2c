// FakeDevice memory: a bump allocator over a simulated address space, with a capacity, and host
// memory behind each allocation on request.
#include "fake_helpers.hpp"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <set>

using namespace fake_test;

TEST_CASE("malloc returns 256-byte-aligned, non-overlapping addresses never given out twice",
          "[fake][memory]") {
  FakeDevice::Options options;
  const bool host_backed = GENERATE(false, true);
  options.host_backed = host_backed;
  FakeDevice device(options);
  INFO("host_backed = " << host_backed);

  std::set<std::uintptr_t> seen;
  void* previous = nullptr;
  std::size_t previous_bytes = 0;
  for (std::size_t bytes : {1, 255, 256, 257, 4096, 70000}) {
    void* ptr = must_malloc(device, bytes);
    REQUIRE(address(ptr) % 256 == 0);
    REQUIRE(seen.insert(address(ptr)).second);
    if (previous != nullptr) {  // the previous allocation is still live: no overlap
      const bool apart = address(ptr) >= address(previous) + previous_bytes ||
                         address(ptr) + bytes <= address(previous);
      REQUIRE(apart);
      REQUIRE(device.free(previous) == cudaSuccess);
    }
    previous = ptr;
    previous_bytes = bytes;
  }
  REQUIRE(device.free(previous) == cudaSuccess);
  for (int i = 0; i < 64; ++i) {  // freed addresses stay taken, even host memory's
    void* ptr = must_malloc(device, 4096);
    REQUIRE(seen.insert(address(ptr)).second);
    REQUIRE(device.free(ptr) == cudaSuccess);
  }
}

TEST_CASE("host-backed allocations can be written and read through the returned address",
          "[fake][memory]") {
  FakeDevice::Options options;
  options.host_backed = true;
  FakeDevice device(options);
  auto* bytes = static_cast<unsigned char*>(must_malloc(device, 10000));
  std::memset(bytes, 0xab, 10000);
  REQUIRE(bytes[0] == 0xab);
  REQUIRE(bytes[9999] == 0xab);
  REQUIRE(device.free(bytes) == cudaSuccess);
}

TEST_CASE("a work body can write host-backed memory when its work completes", "[fake][memory]") {
  FakeDevice::Options options;
  options.host_backed = true;
  FakeDevice device(options);
  cudaStream_t stream = device.create_stream();
  auto* value = static_cast<int*>(must_malloc(device, sizeof(int)));
  *value = 1;
  device.launch(stream, {write_of(value, sizeof(int))}, [value] { *value = 2; });
  REQUIRE(*value == 1);
  device.complete(stream);
  REQUIRE(*value == 2);
  REQUIRE(device.free(value) == cudaSuccess);
}

TEST_CASE("malloc of zero bytes succeeds with a null pointer and allocates nothing",
          "[fake][memory]") {
  FakeDevice device;
  void* ptr = &device;
  REQUIRE(device.malloc(&ptr, 0) == cudaSuccess);
  REQUIRE(ptr == nullptr);
  REQUIRE(device.live_allocations() == 0);
  REQUIRE(device.live_bytes() == 0);
}

TEST_CASE("malloc past the capacity fails with cudaErrorMemoryAllocation and allocates nothing",
          "[fake][memory]") {
  FakeDevice::Options options;
  options.capacity = 1 << 20;
  FakeDevice device(options);
  void* first = must_malloc(device, 768 << 10);
  void* refused = nullptr;
  REQUIRE(device.malloc(&refused, 512 << 10) == cudaErrorMemoryAllocation);
  REQUIRE(device.live_allocations() == 1);
  REQUIRE(device.live_bytes() == 768 << 10);

  SECTION("what is left up to the capacity can still be allocated") {
    void* rest = must_malloc(device, 256 << 10);
    REQUIRE(device.live_bytes() == 1 << 20);
    REQUIRE(device.malloc(&refused, 1) == cudaErrorMemoryAllocation);
    REQUIRE(device.free(rest) == cudaSuccess);
  }
  SECTION("set_capacity moves the limit for later mallocs") {
    device.set_capacity(2 << 20);
    void* more = must_malloc(device, 512 << 10);
    device.set_capacity(512 << 10);  // below what is live: nothing more fits
    REQUIRE(device.malloc(&refused, 1) == cudaErrorMemoryAllocation);
    REQUIRE(device.free(more) == cudaSuccess);
  }
  REQUIRE(device.free(first) == cudaSuccess);
}

TEST_CASE("live_bytes and live_allocations count what malloc gave and free has not taken back",
          "[fake][memory]") {
  FakeDevice device;
  void* a = must_malloc(device, 1000);
  void* b = must_malloc(device, 24);
  REQUIRE(device.live_allocations() == 2);
  REQUIRE(device.live_bytes() == 1024);
  REQUIRE(device.free(a) == cudaSuccess);
  REQUIRE(device.live_allocations() == 1);
  REQUIRE(device.live_bytes() == 24);
  REQUIRE(device.free(b) == cudaSuccess);
  REQUIRE(device.live_allocations() == 0);
  REQUIRE(device.live_bytes() == 0);
}

TEST_CASE("mem_get_info reports the capacity less live bytes as free, and the capacity as total",
          "[fake][memory]") {
  FakeDevice::Options options;
  options.capacity = 1 << 20;
  FakeDevice device(options);
  void* ptr = must_malloc(device, 1000);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  REQUIRE(device.mem_get_info(&free_bytes, &total_bytes) == cudaSuccess);
  REQUIRE(free_bytes == (1 << 20) - 1000);
  REQUIRE(total_bytes == 1 << 20);

  device.set_capacity(500);  // below what is live
  REQUIRE(device.mem_get_info(&free_bytes, &total_bytes) == cudaSuccess);
  REQUIRE(free_bytes == 0);
  REQUIRE(total_bytes == 500);
  REQUIRE(device.free(ptr) == cudaSuccess);
}

TEST_CASE("free of a null pointer succeeds and frees nothing", "[fake][memory]") {
  FakeDevice device;
  void* ptr = must_malloc(device, 256);
  REQUIRE(device.free(nullptr) == cudaSuccess);
  REQUIRE(device.live_allocations() == 1);
  REQUIRE(device.free(ptr) == cudaSuccess);
}

TEST_CASE("free of a pointer malloc did not return fails with cudaErrorInvalidValue",
          "[fake][memory]") {
  FakeDevice device;
  void* ptr = must_malloc(device, 1024);

  SECTION("a pointer never allocated") {
    int on_host = 0;
    REQUIRE(device.free(&on_host) == cudaErrorInvalidValue);
  }
  SECTION("a pointer into the middle of an allocation, which stays live") {
    REQUIRE(device.free(const_cast<std::byte*>(offset(ptr, 256))) == cudaErrorInvalidValue);
    REQUIRE(device.live_allocations() == 1);
  }
  SECTION("a pointer already freed") {
    REQUIRE(device.free(ptr) == cudaSuccess);
    REQUIRE(device.free(ptr) == cudaErrorInvalidValue);
    return;
  }
  REQUIRE(device.free(ptr) == cudaSuccess);
}

TEST_CASE("the ordinal is the one the options name", "[fake][memory]") {
  FakeDevice::Options options;
  options.ordinal = 3;
  REQUIRE(FakeDevice(options).ordinal() == 3);
  REQUIRE(FakeDevice().ordinal() == 0);
  // Ordinals a mask of devices cannot name (vm_set_access's) are refused: before, a fake of
  // ordinal 64 or -1 was made, and its growths' vm_set_access refused (review of 9ed639b).
  for (const int bad : {-1, 64}) {
    options.ordinal = bad;
    CHECK_THROWS_AS(FakeDevice(options), std::invalid_argument);
  }
  options.ordinal = 63;
  CHECK(FakeDevice(options).own_access() == std::uint64_t{1} << 63);
}
