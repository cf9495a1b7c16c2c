// StreamOps on the fake device (FakeStreamOps): the user-facing layer over a Device. Work goes to
// the fake with its accesses, label and host body, never to the launch; events go through the
// seam; copies and sets check their device side and move bytes on a host-backed fake.
#include "fake_helpers.hpp"

#include <streampool/error.hpp>
#include <streampool/stream_ops.hpp>

#include <array>
#include <cstring>
#include <memory>

using namespace fake_test;
using streampool::CopyKind;
using streampool::FakeStreamOps;
using streampool::reads;
using streampool::writes;

namespace {

struct OpsFixture {
  explicit OpsFixture(bool host_backed = true) : device(make(host_backed)), ops(device) {}
  static std::shared_ptr<FakeDevice> make(bool host_backed) {
    FakeDevice::Options o;
    o.host_backed = host_backed;
    return std::make_shared<FakeDevice>(o);
  }
  std::shared_ptr<FakeDevice> device;
  FakeStreamOps ops;
};

}  // namespace

TEST_CASE("FakeStreamOps enqueues work on the fake: the host body runs when it completes, the "
          "launch never",
          "[stream_ops]") {
  OpsFixture f;
  cudaStream_t s = f.ops.create_stream("worker");
  void* memory = must_malloc(*f.device, 256);
  int launched = 0;
  int ran = 0;
  f.ops.enqueue(
      s, "work", {writes(memory, 256)}, [&](cudaStream_t) { ++launched; }, [&] { ++ran; });
  CHECK(f.device->pending_work() == 1);
  CHECK(ran == 0);
  f.device->complete(s);
  CHECK(ran == 1);
  CHECK(launched == 0);
  REQUIRE(f.device->free(memory) == cudaSuccess);
  f.ops.destroy_stream(s);
}

TEST_CASE("FakeStreamOps work is race-checked under its label and its stream's name",
          "[stream_ops]") {
  OpsFixture f(false);
  cudaStream_t a = f.ops.create_stream("left");
  cudaStream_t b = f.ops.create_stream("right");
  void* memory = must_malloc(*f.device, 256);
  const auto nothing = [](cudaStream_t) {};
  f.ops.enqueue(a, "writer", {writes(memory, 256)}, nothing);
  f.ops.enqueue(b, "reader", {reads(memory, 256)}, nothing);
  const auto races = hazards_of(*f.device, HazardKind::race);
  REQUIRE(races.size() == 1);
  CHECK_THAT(races[0].what,
             Catch::Contains(fmt::format("read of [{}, {}) by \"reader\" on stream \"right\" ({}",
                                         hex(address(memory)), hex(address(memory) + 256),
                                         fmt::ptr(b))) &&
                 Catch::Contains(fmt::format("write by \"writer\" on stream \"left\" ({}",
                                             fmt::ptr(a))));
  f.device->clear_hazards();
  f.ops.order_after(b, a);  // an event, recorded and waited on through the seam
  f.ops.enqueue(b, "reader", {reads(memory, 256)}, nothing);
  CHECK(f.device->hazards().empty());
  CHECK(f.device->calls(Call::event_record) == 1);
  CHECK(f.device->calls(Call::stream_wait_event) == 1);
  CHECK(f.device->live_events() == 0);
  f.device->complete_all();
  REQUIRE(f.device->free(memory) == cudaSuccess);
}

TEST_CASE("FakeStreamOps copies and sets move the bytes on a host-backed fake as they complete",
          "[stream_ops]") {
  OpsFixture f;
  cudaStream_t s = f.ops.create_stream();
  auto* memory = static_cast<unsigned char*>(must_malloc(*f.device, 16));
  std::array<unsigned char, 16> in{};
  in.fill(7);
  std::array<unsigned char, 16> out{};
  f.ops.copy(memory, in.data(), 16, CopyKind::host_to_device, s);
  f.ops.set(memory + 8, 3, 8, s);
  f.ops.copy(out.data(), memory, 16, CopyKind::device_to_host, s);
  CHECK(out[0] == 0);  // nothing moved before completion
  f.ops.synchronize(s);
  CHECK(out[0] == 7);
  CHECK(out[15] == 3);
  REQUIRE(f.device->free(memory) == cudaSuccess);
}

TEST_CASE("FakeStreamOps checks a copy's device side: host memory is not an access",
          "[stream_ops]") {
  OpsFixture f(false);
  cudaStream_t s = f.ops.create_stream();
  void* memory = must_malloc(*f.device, 64);
  std::array<char, 128> host{};
  f.ops.copy(memory, host.data(), 64, CopyKind::host_to_device, s);
  CHECK(f.device->hazards().empty());
  f.ops.copy(host.data(), memory, 128, CopyKind::device_to_host, s, "too much");
  const auto out = hazards_of(*f.device, HazardKind::out_of_bounds);
  REQUIRE(out.size() == 1);
  CHECK_THAT(out[0].what, Catch::Contains("by \"too much\""));
  f.device->complete_all();
  REQUIRE(f.device->free(memory) == cudaSuccess);
}

TEST_CASE("StreamOps throws CUDA's error when a call fails", "[stream_ops]") {
  OpsFixture f;
  cudaStream_t s = f.ops.create_stream();
  f.device->fail_next(Call::event_create);
  CHECK_THROWS_AS(f.ops.create_event(), streampool::Error);
  f.device->fail_next(Call::event_record);
  try {
    f.ops.order_after(s, s);
    FAIL("order_after did not throw");
  } catch (const streampool::Error& e) {
    CHECK(e.cuda_error() == cudaErrorLaunchFailure);
    CHECK_THAT(e.what(), Catch::Contains("cudaEventRecord"));
  }
  CHECK(f.device->live_events() == 0);  // the event it made is gone
  f.device->fail_next(Call::stream_synchronize);
  CHECK_THROWS_AS(f.ops.synchronize(s), streampool::Error);
}
