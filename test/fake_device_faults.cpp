// FakeDevice faults and counts: fail_next makes calls fail as CUDA would, with no other effect;
// calls() counts every seam call, and only seam calls.
#include "fake_helpers.hpp"

#include <set>

using namespace fake_test;

namespace {

void no_op(void*) {}

// One of everything a seam call may name, all valid.
struct CallFixture {
  FakeDevice device{[] {
    FakeDevice::Options options;
    options.peers = 0b10;  // device 1 may reach this one's memory: enable_peer_access(1)
    return options;
  }()};
  cudaStream_t stream = device.create_stream();
  void* allocated = must_malloc(device, 256);
  cudaEvent_t event = must_create_event(device);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaUserObject_t object = nullptr;

  CallFixture() {
    REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
    device.launch(stream);
    REQUIRE(device.end_capture(stream, &graph) == cudaSuccess);
    REQUIRE(device.graph_instantiate(&exec, graph) == cudaSuccess);
    REQUIRE(device.user_object_create(&object, nullptr, no_op) == cudaSuccess);
    REQUIRE(device.vm_granularity(&granule) == cudaSuccess);
    REQUIRE(device.vm_reserve(&reservation, 4 * granule) == cudaSuccess);
    REQUIRE(device.vm_reserve(&spare_reservation, granule) == cudaSuccess);
    REQUIRE(device.vm_create(&mapped, granule) == cudaSuccess);
    REQUIRE(device.vm_create(&unmapped, granule) == cudaSuccess);
    REQUIRE(device.vm_create(&loose, granule) == cudaSuccess);
    REQUIRE(device.vm_map(reservation, granule, mapped) == cudaSuccess);
  }

  std::size_t granule = 0;
  void* reservation = nullptr;
  void* spare_reservation = nullptr;
  streampool::VmHandle mapped = 0;    // mapped at the reservation's start
  streampool::VmHandle unmapped = 0;  // for vm_map
  streampool::VmHandle loose = 0;     // for vm_release

  // What a call of this kind needs beyond the fixture: end_capture, a capture to end.
  void prepare(Call call) {
    if (call == Call::end_capture) {
      REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
    }
  }

  // Makes one call of the kind, with valid arguments.
  cudaError_t make(Call call) {
    void* ptr = nullptr;
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    cudaEvent_t new_event = nullptr;
    StreamId id = 0;
    CaptureStatus status = CaptureStatus::none;
    cudaGraph_t new_graph = nullptr;
    cudaGraphExec_t new_exec = nullptr;
    cudaUserObject_t new_object = nullptr;
    streampool::VmHandle new_handle = 0;
    std::size_t bytes = 0;
    auto* at = static_cast<std::byte*>(reservation);
    switch (call) {
      case Call::malloc: return device.malloc(&ptr, 256);
      case Call::free: return device.free(allocated);
      case Call::mem_get_info: return device.mem_get_info(&free_bytes, &total_bytes);
      case Call::enable_peer_access: return device.enable_peer_access(1);
      case Call::vm_granularity: return device.vm_granularity(&bytes);
      case Call::vm_reserve: return device.vm_reserve(&ptr, granule);
      case Call::vm_unreserve: return device.vm_unreserve(spare_reservation, granule);
      case Call::vm_create: return device.vm_create(&new_handle, granule);
      case Call::vm_release: return device.vm_release(loose);
      case Call::vm_map: return device.vm_map(at + 2 * granule, granule, unmapped);
      case Call::vm_set_access:
        return device.vm_set_access(reservation, granule, device.own_access());
      case Call::vm_unmap: return device.vm_unmap(reservation, granule);
      case Call::event_create: return device.event_create(&new_event);
      case Call::event_destroy: return device.event_destroy(event);
      case Call::event_record: return device.event_record(event, stream);
      case Call::event_query: return device.event_query(event);
      case Call::event_synchronize: return device.event_synchronize(event);
      case Call::stream_wait_event: return device.stream_wait_event(stream, event);
      case Call::stream_synchronize: return device.stream_synchronize(stream);
      case Call::device_synchronize: return device.device_synchronize();
      case Call::stream_id: return device.stream_id(stream, &id);
      case Call::capture_info: return device.capture_info(stream, &status, nullptr);
      case Call::begin_capture: return device.begin_capture(stream, CaptureMode::relaxed);
      case Call::end_capture: return device.end_capture(stream, &new_graph);
      case Call::graph_instantiate: return device.graph_instantiate(&new_exec, graph);
      case Call::graph_launch: return device.graph_launch(exec, stream);
      case Call::graph_upload: return device.graph_upload(exec, stream);
      case Call::graph_exec_destroy: return device.graph_exec_destroy(exec);
      case Call::graph_destroy: return device.graph_destroy(graph);
      case Call::user_object_create: return device.user_object_create(&new_object, nullptr, no_op);
      case Call::graph_retain_user_object: return device.graph_retain_user_object(graph, object);
      case Call::user_object_release: return device.user_object_release(object);
    }
    return cudaErrorUnknown;
  }
};

// The error each call fails with by default: CUDA's for running out of resources.
struct DefaultFault {
  Call call;
  const char* name;
  cudaError_t error;
};

constexpr DefaultFault every_call[] = {
    {Call::malloc, "malloc", cudaErrorMemoryAllocation},
    {Call::free, "free", cudaErrorLaunchFailure},
    {Call::mem_get_info, "mem_get_info", cudaErrorLaunchFailure},
    {Call::enable_peer_access, "enable_peer_access", cudaErrorLaunchFailure},
    {Call::vm_granularity, "vm_granularity", cudaErrorLaunchFailure},
    {Call::vm_reserve, "vm_reserve", cudaErrorMemoryAllocation},
    {Call::vm_unreserve, "vm_unreserve", cudaErrorLaunchFailure},
    {Call::vm_create, "vm_create", cudaErrorMemoryAllocation},
    {Call::vm_release, "vm_release", cudaErrorLaunchFailure},
    {Call::vm_map, "vm_map", cudaErrorMemoryAllocation},
    {Call::vm_set_access, "vm_set_access", cudaErrorLaunchFailure},
    {Call::vm_unmap, "vm_unmap", cudaErrorLaunchFailure},
    {Call::event_create, "event_create", cudaErrorMemoryAllocation},
    {Call::event_destroy, "event_destroy", cudaErrorLaunchFailure},
    {Call::event_record, "event_record", cudaErrorLaunchFailure},
    {Call::event_query, "event_query", cudaErrorLaunchFailure},
    {Call::event_synchronize, "event_synchronize", cudaErrorLaunchFailure},
    {Call::stream_wait_event, "stream_wait_event", cudaErrorLaunchFailure},
    {Call::stream_synchronize, "stream_synchronize", cudaErrorLaunchFailure},
    {Call::device_synchronize, "device_synchronize", cudaErrorLaunchFailure},
    {Call::stream_id, "stream_id", cudaErrorLaunchFailure},
    {Call::capture_info, "capture_info", cudaErrorLaunchFailure},
    {Call::begin_capture, "begin_capture", cudaErrorLaunchFailure},
    {Call::end_capture, "end_capture", cudaErrorLaunchFailure},
    {Call::graph_instantiate, "graph_instantiate", cudaErrorMemoryAllocation},
    {Call::graph_launch, "graph_launch", cudaErrorLaunchFailure},
    {Call::graph_upload, "graph_upload", cudaErrorLaunchFailure},
    {Call::graph_exec_destroy, "graph_exec_destroy", cudaErrorLaunchFailure},
    {Call::graph_destroy, "graph_destroy", cudaErrorLaunchFailure},
    {Call::user_object_create, "user_object_create", cudaErrorMemoryAllocation},
    {Call::graph_retain_user_object, "graph_retain_user_object", cudaErrorLaunchFailure},
    {Call::user_object_release, "user_object_release", cudaErrorLaunchFailure},
};
static_assert(std::size(every_call) == FakeDevice::call_kinds);

}  // namespace

TEST_CASE("fail_next makes the next call of a kind fail with CUDA's error for it, then the call "
          "works again",
          "[fake][faults]") {
  for (const DefaultFault& fault : every_call) {
    DYNAMIC_SECTION(fault.name << " fails with " << cudaGetErrorName(fault.error)) {
      CallFixture f;
      f.prepare(fault.call);
      const std::uint64_t before = f.device.calls(fault.call);
      f.device.fail_next(fault.call);
      REQUIRE(f.make(fault.call) == fault.error);
      REQUIRE(f.make(fault.call) == cudaSuccess);
      REQUIRE(f.device.calls(fault.call) == before + 2);
    }
  }
}

TEST_CASE("fail_next fails the next count calls of that kind only, with the error given",
          "[fake][faults]") {
  FakeDevice device;
  cudaEvent_t event = must_create_event(device);
  device.fail_next(Call::malloc, 2, cudaErrorInvalidValue);
  REQUIRE(device.event_query(event) == cudaSuccess);
  void* ptr = nullptr;

  SECTION("count calls fail, and the next succeeds") {
    REQUIRE(device.malloc(&ptr, 256) == cudaErrorInvalidValue);
    REQUIRE(device.malloc(&ptr, 256) == cudaErrorInvalidValue);
    ptr = must_malloc(device, 256);
    REQUIRE(device.free(ptr) == cudaSuccess);
  }
  SECTION("a count of 0 cancels the failures still to come") {
    device.fail_next(Call::malloc, 0);
    ptr = must_malloc(device, 256);
    REQUIRE(device.free(ptr) == cudaSuccess);
  }
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

TEST_CASE("a call failed by fail_next has no other effect", "[fake][faults]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();

  SECTION("malloc allocates nothing and leaves the pointer alone") {
    device.fail_next(Call::malloc);
    void* ptr = &device;
    REQUIRE(device.malloc(&ptr, 256) == cudaErrorMemoryAllocation);
    REQUIRE(ptr == &device);
    REQUIRE(device.live_allocations() == 0);
  }
  SECTION("free leaves the allocation live") {
    void* ptr = must_malloc(device, 256);
    device.fail_next(Call::free);
    REQUIRE(device.free(ptr) == cudaErrorLaunchFailure);
    REQUIRE(device.live_allocations() == 1);
    REQUIRE(device.free(ptr) == cudaSuccess);
  }
  SECTION("event_record leaves the event covering what it covered") {
    cudaEvent_t event = recorded_event(device, a);
    device.launch(a);
    device.fail_next(Call::event_record);
    REQUIRE(device.event_record(event, a) == cudaErrorLaunchFailure);
    REQUIRE(device.event_query(event) == cudaSuccess);
    REQUIRE(device.event_destroy(event) == cudaSuccess);
  }
  SECTION("stream_wait_event adds no wait") {
    device.launch(a);
    cudaEvent_t event = recorded_event(device, a);
    device.fail_next(Call::stream_wait_event);
    REQUIRE(device.stream_wait_event(b, event) == cudaErrorLaunchFailure);
    device.launch(b);
    device.complete(b);
    REQUIRE(device.pending_work() == 1);  // a's work was not completed on b's behalf
    REQUIRE(device.event_destroy(event) == cudaSuccess);
  }
  SECTION("the synchronizing calls complete nothing") {
    device.launch(a);
    cudaEvent_t event = recorded_event(device, a);
    device.fail_next(Call::stream_synchronize);
    device.fail_next(Call::event_synchronize);
    device.fail_next(Call::device_synchronize);
    REQUIRE(device.stream_synchronize(a) == cudaErrorLaunchFailure);
    REQUIRE(device.event_synchronize(event) == cudaErrorLaunchFailure);
    REQUIRE(device.device_synchronize() == cudaErrorLaunchFailure);
    REQUIRE(device.pending_work() == 1);
    REQUIRE(device.event_destroy(event) == cudaSuccess);
  }
  SECTION("begin_capture begins no capture") {
    device.fail_next(Call::begin_capture);
    REQUIRE(device.begin_capture(a, CaptureMode::global) == cudaErrorLaunchFailure);
    REQUIRE(capture_status(device, a) == CaptureStatus::none);
  }
  SECTION("a call failed during a global capture does not invalidate it") {
    REQUIRE(device.begin_capture(a, CaptureMode::global) == cudaSuccess);
    device.fail_next(Call::malloc);
    void* ptr = nullptr;
    REQUIRE(device.malloc(&ptr, 256) == cudaErrorMemoryAllocation);
    REQUIRE(capture_status(device, a) == CaptureStatus::active);
    end_and_discard(device, a, cudaSuccess);
  }
  SECTION("graph calls leave graphs, executables and user objects as they were") {
    REQUIRE(device.begin_capture(a, CaptureMode::global) == cudaSuccess);
    device.launch(a);
    cudaGraph_t graph = nullptr;
    REQUIRE(device.end_capture(a, &graph) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(device.graph_instantiate(&exec, graph) == cudaSuccess);
    cudaUserObject_t object = nullptr;
    REQUIRE(device.user_object_create(&object, nullptr, no_op) == cudaSuccess);

    device.fail_next(Call::graph_launch);
    REQUIRE(device.graph_launch(exec, b) == cudaErrorLaunchFailure);
    REQUIRE(device.pending_work() == 0);
    REQUIRE(device.graph_launches(exec) == 0);

    device.fail_next(Call::user_object_release);
    REQUIRE(device.user_object_release(object) == cudaErrorLaunchFailure);
    REQUIRE(device.live_user_objects() == 1);

    device.fail_next(Call::graph_exec_destroy);
    device.fail_next(Call::graph_destroy);
    REQUIRE(device.graph_exec_destroy(exec) == cudaErrorLaunchFailure);
    REQUIRE(device.graph_destroy(graph) == cudaErrorLaunchFailure);
    REQUIRE(device.graph_launch(exec, b) == cudaSuccess);
    cudaGraphExec_t second = nullptr;
    REQUIRE(device.graph_instantiate(&second, graph) == cudaSuccess);

    REQUIRE(device.user_object_release(object) == cudaSuccess);
    REQUIRE(device.live_user_objects() == 0);
    for (cudaGraphExec_t e : {exec, second}) REQUIRE(device.graph_exec_destroy(e) == cudaSuccess);
    REQUIRE(device.graph_destroy(graph) == cudaSuccess);
  }
}

TEST_CASE("calls counts every seam call of its kind, failed ones included, and nothing else",
          "[fake][faults]") {
  FakeDevice device;
  // Controls are not seam calls.
  cudaStream_t stream = device.create_stream();
  device.launch(stream);
  device.complete(stream);
  device.complete_all();
  device.set_capacity(1024);
  (void)device.pending_work();
  (void)device.live_bytes();
  device.destroy_stream(stream);
  REQUIRE(device.total_calls() == 0);

  void* ptr = must_malloc(device, 512);
  void* refused = nullptr;
  REQUIRE(device.malloc(&refused, 4096) == cudaErrorMemoryAllocation);  // past the capacity
  device.fail_next(Call::free);
  REQUIRE(device.free(ptr) == cudaErrorLaunchFailure);
  REQUIRE(device.free(&refused) == cudaErrorInvalidValue);
  REQUIRE(device.free(ptr) == cudaSuccess);
  StreamId id = 0;
  REQUIRE(device.stream_id(stream, &id) == cudaErrorInvalidResourceHandle);

  REQUIRE(device.calls(Call::malloc) == 2);
  REQUIRE(device.calls(Call::free) == 3);
  REQUIRE(device.calls(Call::stream_id) == 1);
  REQUIRE(device.calls(Call::event_create) == 0);
  REQUIRE(device.total_calls() == 6);
}

TEST_CASE("call_name names each call as its enumerator does", "[fake][faults]") {
  std::set<std::string> names;
  for (const DefaultFault& fault : every_call) {
    REQUIRE(std::string(FakeDevice::call_name(fault.call)) == fault.name);
    names.insert(fault.name);
  }
  REQUIRE(names.size() == FakeDevice::call_kinds);
}
