// streampool_torch_alloc and _free: one pool per device, made on first use, serving PyTorch's
// allocations stream-ordered.
#include "torch_helpers.hpp"

#include <string>

using streampool::FakeDevice;

TEST_CASE("alloc serves from the pool of the device named, made on first use") {
  TorchOnFakes torch;
  streampool_torch_stats none{};
  REQUIRE(streampool_torch_get_stats(0, &none) == 1);  // no pool yet
  REQUIRE(torch.devices.empty());

  FakeDevice& fake0 = torch.fake(0);
  cudaStream_t s = fake0.create_stream();
  void* p = streampool_torch_alloc(1000, 0, s);
  REQUIRE(p != nullptr);
  REQUIRE(torch.stats(0).requested_bytes_current == 1000);
  REQUIRE(torch.stats(0).live_allocations_current == 1);

  SECTION("each device has its own pool, on its own device") {
    FakeDevice& fake1 = torch.fake(1);
    cudaStream_t s1 = fake1.create_stream();
    void* q = streampool_torch_alloc(5000, 1, s1);
    REQUIRE(q != nullptr);
    REQUIRE(fake1.live_allocations() == 1);
    REQUIRE(torch.stats(1).requested_bytes_current == 5000);
    REQUIRE(torch.stats(0).requested_bytes_current == 1000);
    streampool_torch_free(q, 5000, 1, s1);
    REQUIRE(torch.stats(1).live_allocations_current == 0);
  }
  SECTION("a free makes the memory reusable on its stream at once") {
    streampool_torch_free(p, 1000, 0, s);
    REQUIRE(torch.stats(0).live_allocations_current == 0);
    REQUIRE(streampool_torch_alloc(1000, 0, s) == p);  // live again, freed below
  }
  SECTION("a free on another stream waits for the work enqueued there") {
    cudaStream_t other = fake0.create_stream();
    fake0.launch(other, {{p, 1000, true}});  // the last use, pending on `other`
    streampool_torch_free(p, 1000, 0, other);
    void* q = streampool_torch_alloc(1000, 0, s);  // `s` may not have it yet
    REQUIRE(q != p);
    streampool_torch_free(q, 1000, 0, s);
    fake0.complete_all();
    REQUIRE(fake0.hazards().empty());
    p = nullptr;
  }
  SECTION("an unknown pointer and null are ignored") {
    int not_ours = 0;
    streampool_torch_free(&not_ours, 4, 0, s);
    streampool_torch_free(nullptr, 0, 0, s);
    REQUIRE(torch.stats(0).live_allocations_current == 1);
  }
  if (p != nullptr) streampool_torch_free(p, 1000, 0, s);
  REQUIRE(torch.stats(0).live_allocations_current == 0);
}

TEST_CASE("alloc of 0 bytes is null without an error; a failure is null with its reason") {
  TorchOnFakes torch;
  cudaStream_t s = torch.fake(0).create_stream();
  REQUIRE(streampool_torch_alloc(0, 0, s) == nullptr);
  REQUIRE(torch.stats(0).failed_allocations == 0);

  SECTION("out of memory") {
    REQUIRE(streampool_torch_alloc(ssize_t{4} << 30, 0, s) == nullptr);  // capacity 1 GiB
    REQUIRE(std::string(streampool_torch_last_error()).find("4294967296 bytes") !=
            std::string::npos);
    REQUIRE(streampool_torch_last_error_was_out_of_memory() == 1);
    REQUIRE(torch.stats(0).failed_allocations == 1);
    REQUIRE(torch.stats(0).out_of_memory == 1);
    REQUIRE(torch.stats(0).oom_retries >= 1);
  }
  SECTION("the throwing form throws it instead") {
    REQUIRE_THROWS_WITH(streampool_torch_alloc_or_throw(ssize_t{4} << 30, 0, s),
                        Catch::Contains("out of device memory"));
    REQUIRE(streampool_torch_alloc_or_throw(0, 0, s) == nullptr);
  }
  SECTION("a device out of range") {
    REQUIRE(streampool_torch_alloc(256, 64, s) == nullptr);
    REQUIRE(std::string(streampool_torch_last_error()).find("out of range") != std::string::npos);
    REQUIRE(streampool_torch_last_error_was_out_of_memory() == 0);
    REQUIRE(streampool_torch_alloc(256, -1, s) == nullptr);
  }
  // Found in review (2026-12-05): a negative size was null with no reason (the last error of an
  // earlier call stayed), and the throwing form returned null, which PyTorch uses unchecked.
  SECTION("a negative size") {
    REQUIRE(streampool_torch_alloc(256, 64, s) == nullptr);  // an earlier error, not this one's
    REQUIRE(streampool_torch_alloc(-1, 0, s) == nullptr);
    REQUIRE(std::string(streampool_torch_last_error()).find("negative size -1") !=
            std::string::npos);
    REQUIRE(streampool_torch_last_error_was_out_of_memory() == 0);
    REQUIRE_THROWS_WITH(streampool_torch_alloc_or_throw(-5, 0, s),
                        Catch::Contains("negative size -5"));
    REQUIRE(streampool_torch_segment_alloc(-1, 0, s) == nullptr);
    REQUIRE(std::string(streampool_torch_last_error()).find("negative size -1") !=
            std::string::npos);
    REQUIRE(torch.stats(0).live_allocations_current == 0);
  }
}

// With expandable segments too (found in review, 2026-12-05: the layer's limit counted only
// cudaMalloc's segments, so the fraction did nothing on virtual memory, the default).
TEST_CASE("the memory fraction limits what a device's pool reserves") {
  auto options = test_options();
  options.expandable_segments = GENERATE(false, true);
  CAPTURE(options.expandable_segments);
  TorchOnFakes torch(options);
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  REQUIRE(streampool_torch_set_memory_fraction(0.25, 0) == 0);  // of 1 GiB
  REQUIRE(torch.stats(0).reserved_limit == std::size_t{256} << 20);
  void* fits = streampool_torch_alloc(ssize_t{200} << 20, 0, s);
  REQUIRE(fits != nullptr);
  REQUIRE(streampool_torch_alloc(ssize_t{100} << 20, 0, s) == nullptr);
  REQUIRE(torch.stats(0).out_of_memory == 1);
  REQUIRE(torch.stats(0).reserved_bytes_current <= std::int64_t{256} << 20);

  SECTION("raised again, the same allocation succeeds") {
    REQUIRE(streampool_torch_set_memory_fraction(1.0, 0) == 0);
    REQUIRE(torch.stats(0).reserved_limit == 0);
    void* more = streampool_torch_alloc(ssize_t{100} << 20, 0, s);
    REQUIRE(more != nullptr);
    streampool_torch_free(more, ssize_t{100} << 20, 0, s);
  }
  SECTION("a fraction outside (0, 1] is refused") {
    REQUIRE(streampool_torch_set_memory_fraction(0.0, 0) == -1);
    REQUIRE(streampool_torch_set_memory_fraction(1.5, 0) == -1);
    REQUIRE(torch.stats(0).reserved_limit == std::size_t{256} << 20);
  }
  streampool_torch_free(fits, ssize_t{200} << 20, 0, s);
}
