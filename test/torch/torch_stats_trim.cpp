// streampool_torch_get_stats and _trim: the pool's PoolStats for PyTorch's memory_stats keys,
// and empty_cache.
#include "torch_helpers.hpp"

#include <string>
#include <vector>

using streampool::FakeDevice;

TEST_CASE("stats follow the allocations PyTorch makes, with their peaks and totals") {
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  REQUIRE(streampool_torch_stats_size() == sizeof(streampool_torch_stats));
  std::vector<void*> live;
  for (ssize_t bytes : {ssize_t{1000}, ssize_t{3000}, ssize_t{5} << 20}) {
    live.push_back(streampool_torch_alloc(bytes, 0, s));
  }
  const auto s1 = torch.stats(0);
  REQUIRE(s1.requested_bytes_current == 1000 + 3000 + (5 << 20));
  REQUIRE(s1.live_allocations_current == 3);
  REQUIRE(s1.reserved_bytes_current >= s1.requested_bytes_current);
  REQUIRE(s1.reserved_bytes_current == static_cast<std::int64_t>(fake.live_bytes()));
  REQUIRE(s1.segments == static_cast<std::int64_t>(fake.live_allocations()));
  REQUIRE(s1.device_allocations == fake.live_allocations());

  streampool_torch_free(live[2], ssize_t{5} << 20, 0, s);
  live.pop_back();
  const auto s2 = torch.stats(0);
  REQUIRE(s2.requested_bytes_current == 4000);
  REQUIRE(s2.requested_bytes_peak == s1.requested_bytes_current);
  REQUIRE(s2.requested_bytes_total == s1.requested_bytes_current);
  REQUIRE(s2.live_allocations_peak == 3);
  REQUIRE(s2.live_allocations_total == 3);
  REQUIRE(s2.reserved_bytes_current == s1.reserved_bytes_current);  // cached, not returned

  streampool_torch_free(live[0], 1000, 0, s);
  void* again = streampool_torch_alloc(1000, 0, s);  // the block just freed, from the cache
  REQUIRE(again == live[0]);
  REQUIRE(torch.stats(0).cache_hits == s2.cache_hits + 1);
  streampool_torch_free(again, 1000, 0, s);
  streampool_torch_free(live[1], 3000, 0, s);

  SECTION("trim returns the cached memory to the device; the peak stays") {
    REQUIRE(streampool_torch_trim(0) == 0);
    const auto s3 = torch.stats(0);
    REQUIRE(s3.reserved_bytes_current == 0);
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(s3.reserved_bytes_peak == s1.reserved_bytes_current);
    REQUIRE(s3.device_frees == s1.device_allocations);
  }
  SECTION("trim of every device (-1), with a device that has no pool, is fine") {
    REQUIRE(streampool_torch_trim(-1) == 0);
    REQUIRE(fake.live_bytes() == 0);
    REQUIRE(streampool_torch_trim(7) == 0);
  }
}

TEST_CASE("stats of a device without a pool are zero, and a null output is refused") {
  TorchOnFakes torch;
  streampool_torch_stats s;
  s.reserved_bytes_peak = 12345;
  REQUIRE(streampool_torch_get_stats(3, &s) == 1);
  REQUIRE(s.reserved_bytes_peak == 0);
  REQUIRE(streampool_torch_get_stats(0, nullptr) == -1);
  REQUIRE(streampool_torch_get_stats(-5, &s) == 1);
}

TEST_CASE("grant_access gives a peer the memory of a device's pool, and refuses a non-peer") {
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  void* before = streampool_torch_alloc(ssize_t{5} << 20, 0, s);
  REQUIRE(before != nullptr);
  CHECK_FALSE(fake.accessible_from(before, 1));
  REQUIRE(streampool_torch_grant_access(0, 1) == 0);
  void* after = streampool_torch_alloc(ssize_t{40} << 20, 0, s);
  CHECK(fake.accessible_from(before, 1));
  CHECK(fake.accessible_from(after, 1));
  CHECK(streampool_torch_grant_access(0, 2) == -1);  // device 2 cannot reach device 0
  CHECK(std::string(streampool_torch_last_error()).find("grant_access(2)") != std::string::npos);
  streampool_torch_free(before, ssize_t{5} << 20, 0, s);
  streampool_torch_free(after, ssize_t{40} << 20, 0, s);
}
