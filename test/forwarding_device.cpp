// ForwardingDevice: the base of device decorators and test hooks. Every call reaches the wrapped
// device unchanged; a subclass changes only the calls it overrides.
#include <streampool/fake_device.hpp>

#include <catch2/catch.hpp>

#include <memory>

using streampool::FakeDevice;
using streampool::ForwardingDevice;
using Call = FakeDevice::Call;

namespace {

// Refuses every event record, as a hook in a test would, and counts what it refused.
class NoEvents final : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  cudaError_t event_record(cudaEvent_t, cudaStream_t) noexcept override {
    ++refused;
    return cudaErrorLaunchFailure;
  }
  int refused = 0;
};

}  // namespace

TEST_CASE("a ForwardingDevice passes each call to the device it wraps", "[device][forwarding]") {
  FakeDevice::Options options;
  options.ordinal = 3;
  auto fake = std::make_shared<FakeDevice>(options);
  ForwardingDevice device(fake);
  REQUIRE(&device.inner() == fake.get());
  REQUIRE(device.ordinal() == 3);

  void* ptr = nullptr;
  REQUIRE(device.malloc(&ptr, 1000) == cudaSuccess);
  REQUIRE(fake->live_bytes() == 1000);
  cudaStream_t stream = fake->create_stream();
  cudaEvent_t event = nullptr;
  REQUIRE(device.event_create(&event) == cudaSuccess);
  fake->launch(stream);
  REQUIRE(device.event_record(event, stream) == cudaSuccess);
  REQUIRE(device.event_query(event) == cudaErrorNotReady);  // the fake's answer, unchanged
  REQUIRE(device.stream_synchronize(stream) == cudaSuccess);
  REQUIRE(device.event_query(event) == cudaSuccess);
  REQUIRE(device.event_destroy(event) == cudaSuccess);
  REQUIRE(device.free(ptr) == cudaSuccess);
  REQUIRE(fake->live_bytes() == 0);
  for (Call call : {Call::malloc, Call::event_create, Call::event_record, Call::event_query,
                    Call::stream_synchronize, Call::event_destroy, Call::free}) {
    INFO(FakeDevice::call_name(call));
    REQUIRE(fake->calls(call) >= 1);
  }
  REQUIRE(fake->total_calls() == 8);
}

TEST_CASE("a subclass of ForwardingDevice changes only the calls it overrides",
          "[device][forwarding]") {
  auto fake = std::make_shared<FakeDevice>();
  NoEvents device(fake);
  cudaStream_t stream = fake->create_stream();
  cudaEvent_t event = nullptr;
  REQUIRE(device.event_create(&event) == cudaSuccess);
  REQUIRE(device.event_record(event, stream) == cudaErrorLaunchFailure);
  REQUIRE(device.refused == 1);
  REQUIRE(fake->calls(Call::event_record) == 0);  // never reached the fake
  REQUIRE(device.event_destroy(event) == cudaSuccess);
  REQUIRE(fake->calls(Call::event_destroy) == 1);
}
