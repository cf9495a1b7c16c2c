// The model check's own machinery (test/model/pool_model.hpp): its byte source replays a seeded
// run exactly, a run is a pure function of its input, and its checks do catch a pool that hands
// memory over early. These run by default: they test the harness, not today's pool core.
#include "model/pool_model.hpp"

#include <streampool/device.hpp>

#include <catch2/catch.hpp>

#include <memory>
#include <vector>

using pool_model::ByteSource;
using pool_model::Profile;
using pool_model::RunOptions;
using pool_model::RunResult;

namespace {

// A device whose fences always read complete: a pool on it hands blocks to other streams while
// their last owner's work is still pending.
class EarlyFences final : public streampool::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  cudaError_t event_query(cudaEvent_t) noexcept override { return cudaSuccess; }
  cudaError_t event_synchronize(cudaEvent_t) noexcept override { return cudaSuccess; }
  cudaError_t stream_synchronize(cudaStream_t) noexcept override { return cudaSuccess; }
  cudaError_t device_synchronize() noexcept override { return cudaSuccess; }
};

RunOptions basic() {
  RunOptions options;
  options.profile = Profile::basic;
  options.max_steps = 200;
  return options;
}

}  // namespace

TEST_CASE("the byte source draws the same bytes from a seed as from what it drew") {
  ByteSource seeded(42);
  std::vector<std::uint32_t> draws;
  for (std::uint32_t n : {2u, 7u, 256u, 300u, 70000u, 1u, 0u}) draws.push_back(seeded.below(n));
  REQUIRE(draws[0] < 2);
  REQUIRE(draws[1] < 7);
  REQUIRE(draws[4] < 70000);
  REQUIRE(draws[5] == 0);
  REQUIRE(draws[6] == 0);
  REQUIRE(seeded.position() == 1 + 1 + 1 + 2 + 4);
  REQUIRE_FALSE(seeded.exhausted());

  const std::vector<std::uint8_t> bytes = seeded.drawn();
  ByteSource replay(bytes);
  std::vector<std::uint32_t> again;
  for (std::uint32_t n : {2u, 7u, 256u, 300u, 70000u, 1u, 0u}) again.push_back(replay.below(n));
  REQUIRE(again == draws);
  REQUIRE_FALSE(replay.exhausted());
  replay.byte();
  REQUIRE(replay.exhausted());  // past the end: zeros, and the run stops
}

TEST_CASE("a run is a function of its input: a seed and the bytes it drew decode the same run") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const RunResult first = pool_model::run_seed(seed, basic());
    const RunResult replayed = pool_model::run_bytes(first.bytes, basic());
    CAPTURE(seed);
    REQUIRE(first.log.size() > 10);
    REQUIRE(replayed.setup == first.setup);
    REQUIRE(replayed.log == first.log);
    REQUIRE(replayed.failure.has_value() == first.failure.has_value());
  }
}

TEST_CASE("the model catches a pool whose device says fences completed before they did") {
  RunOptions lying = basic();
  lying.wrap_device = [](std::shared_ptr<streampool::FakeDevice> fake) {
    return std::make_shared<EarlyFences>(std::move(fake));
  };
  int races = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const RunResult result = pool_model::run_seed_isolated(seed, lying);
    if (result.failure && result.failure->kind == "race") ++races;
  }
  REQUIRE(races > 0);
}
