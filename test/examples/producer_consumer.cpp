// The worked example (examples/producer_consumer/) on the fake device: the correct version
// reports nothing and sums right; removing the event wait or the record_stream is reported, as
// exactly the hazard that mistake is, with or without pending work.
#include "producer_consumer.hpp"

#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

using streampool::FakeDevice;
using Kind = FakeDevice::Hazard::Kind;
using example::Mistake;

namespace {

constexpr std::size_t n = 4096;

struct Run {
  float result = 0;
  std::vector<FakeDevice::Hazard> hazards;
};

// guide-begin run_example
Run run(Mistake mistake, bool auto_complete) {
  FakeDevice::Options options;
  options.host_backed = true;  // the host bodies leave what the kernels would
  options.auto_complete = auto_complete;
  auto device = std::make_shared<FakeDevice>(options);
  streampool::FakeStreamOps ops(device);
  streampool::MemoryPool pool(device);
  cudaStream_t producer = ops.create_stream("producer");
  cudaStream_t consumer = ops.create_stream("consumer");

  Run run;
  run.result = example::produce_and_consume(ops, pool, producer, consumer, n, mistake);
  run.hazards = device->hazards();
  ops.destroy_stream(consumer);
  ops.destroy_stream(producer);
  return run;
}
// guide-end

std::vector<Kind> kinds(const Run& r) {
  std::vector<Kind> out;
  for (const auto& hazard : r.hazards) out.push_back(hazard.kind);
  return out;
}

}  // namespace

TEST_CASE("the worked example: the correct version sums right and the fake reports nothing",
          "[example]") {
  const bool auto_complete = GENERATE(false, true);
  CAPTURE(auto_complete);
  const Run r = run(Mistake::none, auto_complete);
  CHECK(r.result == static_cast<float>(n));
  CHECK(r.hazards.empty());
}

TEST_CASE("the worked example without the event wait: the consumer's read is an unordered access "
          "of the producer's write",
          "[example]") {
  const bool auto_complete = GENERATE(false, true);
  CAPTURE(auto_complete);
  const Run r = run(Mistake::no_event_wait, auto_complete);
  REQUIRE(kinds(r) == std::vector<Kind>{Kind::unordered_access});
  const std::string& what = r.hazards[0].what;
  CHECK_THAT(what, Catch::Contains("read of") && Catch::Contains("by \"sum\"") &&
                       Catch::Contains("stream \"consumer\"") &&
                       Catch::Contains("the write by \"fill\" on stream \"producer\"") &&
                       Catch::Contains(std::to_string(n * sizeof(float)) + " bytes"));
}

TEST_CASE("the worked example without record_stream: the drop on the producer's stream leaves the "
          "consumer's read unrecorded",
          "[example]") {
  const bool auto_complete = GENERATE(false, true);
  CAPTURE(auto_complete);
  const Run r = run(Mistake::no_record_stream, auto_complete);
  REQUIRE(kinds(r) == std::vector<Kind>{Kind::unrecorded_use});
  const std::string& what = r.hazards[0].what;
  CHECK_THAT(what, Catch::Contains("dropped on stream \"producer\"") &&
                       Catch::Contains("work by \"sum\" on stream \"consumer\""));
  CHECK(r.result == static_cast<float>(n));  // right by luck: the pool reused nothing yet
}
