// FakeDevice capture, graphs and user objects: the calls CUDA refuses during capture, in the modes
// and threads it refuses them (as measured on an H200 with CUDA 13.0), replay of captured work,
// and when a user object's destructor runs.
#include "fake_helpers.hpp"

#include <streampool/error.hpp>

#include <atomic>
#include <optional>
#include <thread>

using namespace fake_test;

namespace {

// Captures `body` (if any) as the one unit of work of a graph.
cudaGraph_t capture_graph(FakeDevice& device, cudaStream_t stream,
                          std::function<void()> body = {}) {
  REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
  device.launch(stream, {}, std::move(body));
  cudaGraph_t graph = nullptr;
  REQUIRE(device.end_capture(stream, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  return graph;
}

cudaGraphExec_t instantiate(FakeDevice& device, cudaGraph_t graph) {
  cudaGraphExec_t exec = nullptr;
  REQUIRE(device.graph_instantiate(&exec, graph) == cudaSuccess);
  return exec;
}

constexpr CaptureMode all_modes[] = {CaptureMode::global, CaptureMode::thread_local_,
                                     CaptureMode::relaxed};

}  // namespace

// --- beginning, ending and observing a capture ------------------------------------------------

TEST_CASE("begin_capture refuses a stream that is already capturing with cudaErrorIllegalState",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
  SECTION("while the capture is active") {
    REQUIRE(device.begin_capture(stream, CaptureMode::relaxed) == cudaErrorIllegalState);
    REQUIRE(capture_status(device, stream) == CaptureStatus::active);
    end_and_discard(device, stream, cudaSuccess);
  }
  SECTION("after the capture was invalidated") {
    void* ptr = nullptr;
    REQUIRE(device.malloc(&ptr, 256) == cudaErrorStreamCaptureUnsupported);
    REQUIRE(device.begin_capture(stream, CaptureMode::relaxed) == cudaErrorIllegalState);
    end_and_discard(device, stream, cudaErrorStreamCaptureInvalidated);
  }
}

TEST_CASE("begin_capture refuses the legacy default stream with cudaErrorStreamCaptureUnsupported",
          "[fake][capture]") {
  FakeDevice device;
  REQUIRE(device.begin_capture(nullptr, CaptureMode::relaxed) ==
          cudaErrorStreamCaptureUnsupported);
  REQUIRE(device.begin_capture(cudaStreamLegacy, CaptureMode::global) ==
          cudaErrorStreamCaptureUnsupported);
  REQUIRE(capture_status(device, nullptr) == CaptureStatus::none);
  // The per-thread default stream is an ordinary stream to capture.
  REQUIRE(device.begin_capture(cudaStreamPerThread, CaptureMode::global) == cudaSuccess);
  end_and_discard(device, cudaStreamPerThread, cudaSuccess);
}

TEST_CASE("capture_info reports no capture, an active one with a unique id, then an invalidated "
          "one",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  CaptureStatus status = CaptureStatus::active;
  CaptureId id_a = 0;
  CaptureId id_b = 0;
  REQUIRE(device.capture_info(a, &status, &id_a) == cudaSuccess);
  REQUIRE(status == CaptureStatus::none);

  REQUIRE(device.begin_capture(a, CaptureMode::thread_local_) == cudaSuccess);
  REQUIRE(device.begin_capture(b, CaptureMode::thread_local_) == cudaSuccess);
  REQUIRE(device.capture_info(a, &status, &id_a) == cudaSuccess);
  REQUIRE(status == CaptureStatus::active);
  REQUIRE(device.capture_info(b, &status, &id_b) == cudaSuccess);
  REQUIRE(id_a != 0);
  REQUIRE(id_b != id_a);

  REQUIRE(device.stream_synchronize(a) == cudaErrorStreamCaptureUnsupported);
  REQUIRE(capture_status(device, a) == CaptureStatus::invalidated);
  end_and_discard(device, a, cudaErrorStreamCaptureInvalidated);
  end_and_discard(device, b, cudaSuccess);
  REQUIRE(capture_status(device, a) == CaptureStatus::none);

  CaptureId again = 0;
  REQUIRE(device.begin_capture(a, CaptureMode::thread_local_) == cudaSuccess);
  REQUIRE(device.capture_info(a, &status, &again) == cudaSuccess);
  REQUIRE(again != id_a);
  REQUIRE(again != id_b);
  end_and_discard(device, a, cudaSuccess);
}

TEST_CASE("end_capture ends only a capture under way, from the thread its mode allows",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  cudaGraph_t graph = nullptr;

  SECTION("ending a stream that is not capturing fails with cudaErrorIllegalState") {
    REQUIRE(device.end_capture(stream, &graph) == cudaErrorIllegalState);
  }
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_}) {
    DYNAMIC_SECTION("ending a " << mode_name(mode) << " capture from another thread fails with "
                                << "cudaErrorStreamCaptureWrongThread and ends the capture") {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(on_other_thread([&] { return device.end_capture(stream, &graph); }) ==
              cudaErrorStreamCaptureWrongThread);
      REQUIRE(graph == nullptr);
      REQUIRE(capture_status(device, stream) == CaptureStatus::none);
      REQUIRE(device.end_capture(stream, &graph) == cudaErrorIllegalState);
    }
  }
  SECTION("a relaxed capture may be ended from any thread") {
    REQUIRE(device.begin_capture(stream, CaptureMode::relaxed) == cudaSuccess);
    REQUIRE(on_other_thread([&] { return device.end_capture(stream, &graph); }) == cudaSuccess);
    REQUIRE(graph != nullptr);
    REQUIRE(device.graph_destroy(graph) == cudaSuccess);
  }
  SECTION("ending an invalidated capture fails with cudaErrorStreamCaptureInvalidated, gives no "
          "graph, and takes the stream out of capture") {
    REQUIRE(device.begin_capture(stream, CaptureMode::relaxed) == cudaSuccess);
    REQUIRE(device.stream_synchronize(stream) == cudaErrorStreamCaptureUnsupported);
    graph = reinterpret_cast<cudaGraph_t>(0x1234);
    REQUIRE(device.end_capture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
    REQUIRE(graph == nullptr);
    REQUIRE(capture_status(device, stream) == CaptureStatus::none);
  }
}

// --- what capture does to work and events -----------------------------------------------------

TEST_CASE("work launched on a capturing stream is captured, and runs on each launch of the graph",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t capturing = device.create_stream();
  cudaStream_t replay = device.create_stream();
  std::vector<int> log;
  REQUIRE(device.begin_capture(capturing, CaptureMode::global) == cudaSuccess);
  for (int i = 1; i <= 3; ++i) device.launch(capturing, {}, note(log, i));
  REQUIRE(device.pending_work() == 0);
  cudaGraph_t graph = nullptr;
  REQUIRE(device.end_capture(capturing, &graph) == cudaSuccess);
  device.complete_all();
  REQUIRE(log.empty());

  cudaGraphExec_t exec = instantiate(device, graph);
  REQUIRE(device.graph_launches(exec) == 0);
  REQUIRE(device.graph_launch(exec, replay) == cudaSuccess);
  REQUIRE(device.graph_launch(exec, replay) == cudaSuccess);
  REQUIRE(device.graph_launches(exec) == 2);
  // Replays are ordinary work on the launch stream: pending until completed, events cover them.
  REQUIRE(device.pending_work() == 6);
  cudaEvent_t event = recorded_event(device, replay);
  REQUIRE(device.event_query(event) == cudaErrorNotReady);
  REQUIRE(log.empty());
  device.complete(replay);
  REQUIRE(log == std::vector<int>{1, 2, 3, 1, 2, 3});
  REQUIRE(device.event_query(event) == cudaSuccess);

  REQUIRE(device.event_destroy(event) == cudaSuccess);
  REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
  REQUIRE(device.graph_destroy(graph) == cudaSuccess);
}

TEST_CASE("launching a graph on a capturing stream captures its work", "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  std::vector<int> log;
  cudaGraph_t inner = capture_graph(device, stream, note(log, 1));
  cudaGraphExec_t inner_exec = instantiate(device, inner);

  REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
  REQUIRE(device.graph_launch(inner_exec, stream) == cudaSuccess);
  device.launch(stream, {}, note(log, 2));
  cudaGraph_t outer = nullptr;
  REQUIRE(device.end_capture(stream, &outer) == cudaSuccess);
  REQUIRE(device.pending_work() == 0);

  cudaGraphExec_t outer_exec = instantiate(device, outer);
  REQUIRE(device.graph_launch(outer_exec, stream) == cudaSuccess);
  REQUIRE(device.stream_synchronize(stream) == cudaSuccess);
  REQUIRE(log == std::vector<int>{1, 2});

  for (cudaGraphExec_t exec : {inner_exec, outer_exec}) {
    REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
  }
  for (cudaGraph_t graph : {inner, outer}) REQUIRE(device.graph_destroy(graph) == cudaSuccess);
}

TEST_CASE("work launched on an invalidated capture is dropped", "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  std::vector<int> log;
  REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
  device.launch(stream, {}, note(log, 1));
  REQUIRE(device.stream_synchronize(stream) == cudaErrorStreamCaptureUnsupported);
  device.launch(stream, {}, note(log, 2));
  end_and_discard(device, stream, cudaErrorStreamCaptureInvalidated);
  device.complete_all();
  REQUIRE(log.empty());
  REQUIRE(device.pending_work() == 0);
}

TEST_CASE("an event recorded on a capturing stream is captured: querying or synchronizing it fails "
          "with cudaErrorCapturedEvent and invalidates that capture",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  cudaEvent_t event = must_create_event(device);
  for (CaptureMode mode : all_modes) {
    DYNAMIC_SECTION("in " << mode_name(mode) << " mode") {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      device.launch(stream);
      REQUIRE(device.event_record(event, stream) == cudaSuccess);
      REQUIRE(device.event_query(event) == cudaErrorCapturedEvent);
      REQUIRE(capture_status(device, stream) == CaptureStatus::invalidated);
      REQUIRE(device.event_synchronize(event) == cudaErrorCapturedEvent);
      end_and_discard(device, stream, cudaErrorStreamCaptureInvalidated);
      // Recorded again outside capture, it is an ordinary event.
      REQUIRE(device.event_record(event, stream) == cudaSuccess);
      REQUIRE(device.event_query(event) == cudaSuccess);
    }
  }
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

// --- the calls capture refuses ----------------------------------------------------------------

namespace {

// What the unsafe calls need: memory to free, an event recorded outside the capture, a stream
// other than the capturing one.
struct UnsafeCallFixture {
  FakeDevice device;
  cudaStream_t capturing = device.create_stream();
  cudaStream_t other = device.create_stream();
  void* allocated = must_malloc(device, 256);
  cudaEvent_t outside = recorded_event(device, other);
  std::vector<void*> to_free{allocated};

  ~UnsafeCallFixture() {
    for (void* ptr : to_free) device.free(ptr);
    device.event_destroy(outside);
  }
};

struct UnsafeCall {
  const char* name;
  std::function<cudaError_t(UnsafeCallFixture&)> call;
};

const std::vector<UnsafeCall> unsafe_calls{
    {"malloc",
     [](UnsafeCallFixture& f) {
       void* ptr = nullptr;
       const cudaError_t status = f.device.malloc(&ptr, 256);
       if (ptr != nullptr) f.to_free.push_back(ptr);
       return status;
     }},
    {"free",
     [](UnsafeCallFixture& f) {
       const cudaError_t status = f.device.free(f.allocated);
       if (status == cudaSuccess) std::erase(f.to_free, f.allocated);
       return status;
     }},
    {"event_query on an event recorded outside the capture",
     [](UnsafeCallFixture& f) { return f.device.event_query(f.outside); }},
    {"event_synchronize on an event recorded outside the capture",
     [](UnsafeCallFixture& f) { return f.device.event_synchronize(f.outside); }},
    {"stream_synchronize of a stream that is not capturing",
     [](UnsafeCallFixture& f) { return f.device.stream_synchronize(f.other); }},
};

}  // namespace

TEST_CASE("calls CUDA forbids during capture are refused by exactly the captures that restrict "
          "the calling thread",
          "[fake][capture]") {
  for (CaptureMode mode : all_modes) {
    for (bool same_thread : {true, false}) {
      // Global captures restrict every thread, thread-local ones the thread that began them,
      // relaxed ones nobody (seen on the H200).
      const bool refused =
          mode == CaptureMode::global || (mode == CaptureMode::thread_local_ && same_thread);
      for (const UnsafeCall& unsafe : unsafe_calls) {
        DYNAMIC_SECTION(unsafe.name << " from " << (same_thread ? "the capturing" : "another")
                                    << " thread during a " << mode_name(mode) << " capture "
                                    << (refused ? "fails with cudaErrorStreamCaptureUnsupported "
                                                  "and invalidates the capture"
                                                : "succeeds and leaves the capture active")) {
          UnsafeCallFixture f;
          REQUIRE(f.device.begin_capture(f.capturing, mode) == cudaSuccess);
          const std::size_t live = f.device.live_allocations();
          const cudaError_t status =
              same_thread ? unsafe.call(f) : on_other_thread([&] { return unsafe.call(f); });
          if (refused) {
            REQUIRE(status == cudaErrorStreamCaptureUnsupported);
            REQUIRE(f.device.live_allocations() == live);  // a refused call did nothing
            REQUIRE(capture_status(f.device, f.capturing) == CaptureStatus::invalidated);
            end_and_discard(f.device, f.capturing, cudaErrorStreamCaptureInvalidated);
          } else {
            REQUIRE(status == cudaSuccess);
            REQUIRE(capture_status(f.device, f.capturing) == CaptureStatus::active);
            end_and_discard(f.device, f.capturing, cudaSuccess);
          }
        }
      }
    }
  }
}

TEST_CASE("synchronizing the capturing stream fails in every mode and invalidates the capture",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  device.launch(stream);  // enqueued before the capture: the refused call does not complete it
  for (CaptureMode mode : all_modes) {
    DYNAMIC_SECTION("in " << mode_name(mode) << " mode") {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(device.stream_synchronize(stream) == cudaErrorStreamCaptureUnsupported);
      REQUIRE(capture_status(device, stream) == CaptureStatus::invalidated);
      REQUIRE(device.pending_work() == 1);
      end_and_discard(device, stream, cudaErrorStreamCaptureInvalidated);
    }
  }
}

TEST_CASE("device_synchronize fails while any capture is active and invalidates every active one",
          "[fake][capture]") {
  FakeDevice device;
  // Neither capture restricts this thread: one is relaxed, the other another thread's.
  cudaStream_t relaxed = device.create_stream();
  cudaStream_t theirs = device.create_stream();
  cudaStream_t busy = device.create_stream();
  device.launch(busy);
  REQUIRE(device.begin_capture(relaxed, CaptureMode::relaxed) == cudaSuccess);
  REQUIRE(on_other_thread([&] {
            return device.begin_capture(theirs, CaptureMode::thread_local_);
          }) == cudaSuccess);

  REQUIRE(device.device_synchronize() == cudaErrorStreamCaptureUnsupported);
  REQUIRE(capture_status(device, relaxed) == CaptureStatus::invalidated);
  REQUIRE(capture_status(device, theirs) == CaptureStatus::invalidated);
  REQUIRE(device.pending_work() == 1);  // and completed nothing
  end_and_discard(device, relaxed, cudaErrorStreamCaptureInvalidated);
  REQUIRE(on_other_thread([&] {
            cudaGraph_t graph = nullptr;
            return device.end_capture(theirs, &graph);
          }) == cudaErrorStreamCaptureInvalidated);
  REQUIRE(device.device_synchronize() == cudaSuccess);
  REQUIRE(device.pending_work() == 0);
}

TEST_CASE("calls CUDA allows during a global capture succeed and leave the capture active",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  cudaStream_t other = device.create_stream();
  device.launch(other);
  cudaEvent_t outside = recorded_event(device, other);
  REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);

  SECTION("stream_wait_event on the capturing stream, on an event recorded in the capture") {
    REQUIRE(device.event_record(outside, stream) == cudaSuccess);  // now recorded inside
    REQUIRE(device.stream_wait_event(stream, outside) == cudaSuccess);
    REQUIRE(capture_status(device, stream) == CaptureStatus::active);
    end_and_discard(device, stream, cudaSuccess);
  }
  SECTION("mem_get_info, event_create, and stream_id and event_record on another stream") {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    StreamId id = 0;
    cudaEvent_t event = nullptr;
    REQUIRE(device.mem_get_info(&free_bytes, &total_bytes) == cudaSuccess);
    REQUIRE(device.stream_id(other, &id) == cudaSuccess);
    REQUIRE(device.event_create(&event) == cudaSuccess);
    REQUIRE(device.event_record(event, other) == cudaSuccess);
    REQUIRE(capture_status(device, stream) == CaptureStatus::active);
    end_and_discard(device, stream, cudaSuccess);
    REQUIRE(device.event_destroy(event) == cudaSuccess);
  }
  REQUIRE(device.event_destroy(outside) == cudaSuccess);
}

// --- graphs -----------------------------------------------------------------------------------

TEST_CASE("graph_upload checks its handles and enqueues nothing", "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  cudaGraph_t graph = capture_graph(device, stream);
  cudaGraphExec_t exec = instantiate(device, graph);
  REQUIRE(device.graph_upload(exec, stream) == cudaSuccess);
  REQUIRE(device.pending_work() == 0);
  REQUIRE(device.graph_launches(exec) == 0);
  REQUIRE(device.graph_upload(reinterpret_cast<cudaGraphExec_t>(graph), stream) ==
          cudaErrorInvalidResourceHandle);
  REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
  REQUIRE(device.graph_destroy(graph) == cudaSuccess);
}

TEST_CASE("graph calls naming an unknown graph, executable or user object fail with "
          "cudaErrorInvalidResourceHandle",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  cudaGraph_t graph = capture_graph(device, stream);
  cudaGraphExec_t exec = instantiate(device, graph);
  cudaUserObject_t object = nullptr;
  REQUIRE(device.user_object_create(&object, nullptr, [](void*) {}) == cudaSuccess);
  REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
  REQUIRE(device.graph_destroy(graph) == cudaSuccess);
  REQUIRE(device.user_object_release(object) == cudaSuccess);

  cudaGraphExec_t new_exec = nullptr;
  REQUIRE(device.graph_instantiate(&new_exec, graph) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.graph_launch(exec, stream) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.graph_upload(exec, stream) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.graph_exec_destroy(exec) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.graph_destroy(graph) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.user_object_release(object) == cudaErrorInvalidResourceHandle);
  cudaGraph_t live = capture_graph(device, stream);
  REQUIRE(device.graph_retain_user_object(live, object) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.graph_destroy(live) == cudaSuccess);
}

// --- user objects -----------------------------------------------------------------------------

namespace {

struct DestroyProbe {
  std::atomic<int> destroyed{0};
  std::thread::id thread;
};

void note_destroyed(void* probe) {
  auto* p = static_cast<DestroyProbe*>(probe);
  p->thread = std::this_thread::get_id();
  ++p->destroyed;
}

}  // namespace

TEST_CASE("a user object is destroyed when its last reference goes, on the thread that drops it",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  DestroyProbe probe;
  cudaUserObject_t object = nullptr;
  REQUIRE(device.user_object_create(&object, &probe, note_destroyed) == cudaSuccess);
  REQUIRE(device.live_user_objects() == 1);

  SECTION("releasing the only reference destroys it at once") {
    std::thread::id releaser;
    cudaError_t status = cudaErrorUnknown;
    std::thread([&] {
      releaser = std::this_thread::get_id();
      status = device.user_object_release(object);
    }).join();
    REQUIRE(status == cudaSuccess);
    REQUIRE(probe.destroyed == 1);
    REQUIRE(probe.thread == releaser);
  }
  SECTION("a graph that retains it keeps it until the graph is destroyed") {
    cudaGraph_t graph = capture_graph(device, stream);
    REQUIRE(device.graph_retain_user_object(graph, object) == cudaSuccess);
    REQUIRE(probe.destroyed == 0);
    REQUIRE(device.graph_destroy(graph) == cudaSuccess);
    REQUIRE(probe.destroyed == 1);
  }
  SECTION("each executable graph keeps it until that executable is destroyed") {
    cudaGraph_t graph = capture_graph(device, stream);
    REQUIRE(device.graph_retain_user_object(graph, object) == cudaSuccess);
    cudaGraphExec_t first = instantiate(device, graph);
    cudaGraphExec_t second = instantiate(device, graph);
    REQUIRE(device.graph_destroy(graph) == cudaSuccess);
    REQUIRE(device.graph_exec_destroy(first) == cudaSuccess);
    REQUIRE(probe.destroyed == 0);
    REQUIRE(device.live_user_objects() == 1);
    REQUIRE(device.graph_exec_destroy(second) == cudaSuccess);
    REQUIRE(probe.destroyed == 1);
  }
  SECTION("an executable destroyed with launches in flight keeps it until they complete, and the "
          "thread completing them destroys it") {
    cudaGraph_t graph = capture_graph(device, stream);
    REQUIRE(device.graph_retain_user_object(graph, object) == cudaSuccess);
    cudaGraphExec_t exec = instantiate(device, graph);
    REQUIRE(device.graph_destroy(graph) == cudaSuccess);
    cudaStream_t other = device.create_stream();
    REQUIRE(device.graph_launch(exec, stream) == cudaSuccess);
    REQUIRE(device.graph_launch(exec, other) == cudaSuccess);
    REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
    device.complete(stream);
    REQUIRE(probe.destroyed == 0);  // the launch on `other` is still in flight
    std::thread::id completer;
    std::thread([&] {
      completer = std::this_thread::get_id();
      device.complete(other);
    }).join();
    REQUIRE(probe.destroyed == 1);
    REQUIRE(probe.thread == completer);
  }
  SECTION("an executable whose launches have completed releases it when destroyed") {
    cudaGraph_t graph = capture_graph(device, stream);
    REQUIRE(device.graph_retain_user_object(graph, object) == cudaSuccess);
    cudaGraphExec_t exec = instantiate(device, graph);
    REQUIRE(device.graph_destroy(graph) == cudaSuccess);
    REQUIRE(device.graph_launch(exec, stream) == cudaSuccess);
    REQUIRE(device.stream_synchronize(stream) == cudaSuccess);
    REQUIRE(probe.destroyed == 0);
    REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
    REQUIRE(probe.destroyed == 1);
  }
  REQUIRE(device.live_user_objects() == 0);
}

TEST_CASE("destroying the FakeDevice destroys the user objects still alive", "[fake][capture]") {
  DestroyProbe probe;
  {
    FakeDevice device;
    cudaStream_t stream = device.create_stream();
    cudaUserObject_t object = nullptr;
    REQUIRE(device.user_object_create(&object, &probe, note_destroyed) == cudaSuccess);
    cudaGraph_t graph = capture_graph(device, stream);
    REQUIRE(device.graph_retain_user_object(graph, object) == cudaSuccess);
    REQUIRE(probe.destroyed == 0);
  }
  REQUIRE(probe.destroyed == 1);
}

namespace {

// A user object's destructor that breaks CUDA's rule and calls CUDA.
struct CallingProbe {
  FakeDevice* device = nullptr;
  cudaError_t malloc_status = cudaSuccess;
  cudaError_t event_status = cudaSuccess;
};

void call_cuda_from_destructor(void* probe) {
  auto* p = static_cast<CallingProbe*>(probe);
  void* ptr = nullptr;
  cudaEvent_t event = nullptr;
  p->malloc_status = p->device->malloc(&ptr, 256);
  p->event_status = p->device->event_create(&event);
}

}  // namespace

TEST_CASE("a CUDA call from a user object's destructor fails with cudaErrorNotPermitted and is a "
          "hazard",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  CallingProbe probe{&device};
  cudaUserObject_t object = nullptr;
  REQUIRE(device.user_object_create(&object, &probe, call_cuda_from_destructor) == cudaSuccess);

  SECTION("when a release runs the destructor") {
    REQUIRE(device.user_object_release(object) == cudaSuccess);
  }
  SECTION("when completing work runs the destructor") {
    cudaGraph_t graph = capture_graph(device, stream);
    REQUIRE(device.graph_retain_user_object(graph, object) == cudaSuccess);
    cudaGraphExec_t exec = instantiate(device, graph);
    REQUIRE(device.graph_destroy(graph) == cudaSuccess);
    REQUIRE(device.graph_launch(exec, stream) == cudaSuccess);
    REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
    device.complete(stream);
  }
  REQUIRE(device.live_user_objects() == 0);
  REQUIRE(probe.malloc_status == cudaErrorNotPermitted);
  REQUIRE(probe.event_status == cudaErrorNotPermitted);
  REQUIRE(device.live_allocations() == 0);  // the refused malloc allocated nothing
  REQUIRE(device.calls(Call::malloc) == 1);
  const auto hazards = hazards_of(device, HazardKind::call_in_user_object_destructor);
  REQUIRE(hazards.size() == 2);
  REQUIRE_THAT(hazards[0].what, Catch::Contains("malloc"));
  REQUIRE_THAT(hazards[1].what, Catch::Contains("event_create"));

  // Out of the destructor, calls work again.
  void* ptr = must_malloc(device, 256);
  REQUIRE(device.free(ptr) == cudaSuccess);
}

// Found in review (2026-12-06): a capturing stream could wait on an event captured by another
// capture, which CUDA refuses ("it is invalid to merge two separate capture graphs by waiting on a
// captured event from a stream which is being captured and is associated with a different
// capture graph than the event": cudaErrorStreamCaptureMerge). The fake accepted any captured
// event as a fork or join.
TEST_CASE("a capturing stream may not wait on an event captured by another capture") {
  const CaptureMode mode =
      GENERATE(CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed);
  CAPTURE(mode_name(mode));
  FakeDevice device;
  cudaStream_t a = device.create_stream("a");
  cudaStream_t b = device.create_stream("b");
  cudaStream_t c = device.create_stream("c");
  cudaEvent_t event = must_create_event(device);
  REQUIRE(device.begin_capture(a, mode) == cudaSuccess);
  REQUIRE(device.event_record(event, a) == cudaSuccess);  // captured in a's capture
  SECTION("another capture's event: refused, and both captures are lost") {
    REQUIRE(device.begin_capture(b, mode) == cudaSuccess);
    CHECK(device.stream_wait_event(b, event) == cudaErrorStreamCaptureMerge);
    CHECK(capture_status(device, b) == CaptureStatus::invalidated);
    CHECK(capture_status(device, a) == CaptureStatus::invalidated);
    end_and_discard(device, b, cudaErrorStreamCaptureInvalidated);
    end_and_discard(device, a, cudaErrorStreamCaptureInvalidated);
  }
  SECTION("an event of its own capture: a fork, allowed") {
    REQUIRE(device.begin_capture(c, mode) == cudaSuccess);
    cudaEvent_t own = must_create_event(device);
    REQUIRE(device.event_record(own, c) == cudaSuccess);
    CHECK(device.stream_wait_event(c, own) == cudaSuccess);
    end_and_discard(device, c, cudaSuccess);
    REQUIRE(device.event_destroy(own) == cudaSuccess);
    CHECK(capture_status(device, a) == CaptureStatus::active);
    end_and_discard(device, a, cudaSuccess);
  }
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

// Seen on an H100 (test/gpu/probes.cpp, "probe the legacy stream while a blocking stream
// captures"): a launch on the legacy default stream while a blocking stream captures fails with
// cudaErrorStreamCaptureImplicit and invalidates the capture, in every mode and from any thread.
// The fake's launch is a control and returns nothing, so it throws what FakeStreamOps passes on.
TEST_CASE("a launch on the legacy stream while cudaStreamPerThread captures throws and "
          "invalidates the capture", "[fake][capture]") {
  for (const CaptureMode mode : all_modes) {
    CAPTURE(static_cast<int>(mode));
    FakeDevice device;
    std::vector<int> log;
    REQUIRE(device.begin_capture(cudaStreamPerThread, mode) == cudaSuccess);
    try {
      device.launch(cudaStreamLegacy, {}, note(log, 1));
      FAIL("the launch was accepted");
    } catch (const streampool::Error& e) {
      CHECK(e.cuda_error() == cudaErrorStreamCaptureImplicit);
    }
    CaptureStatus status = CaptureStatus::none;
    REQUIRE(device.capture_info(cudaStreamPerThread, &status, nullptr) == cudaSuccess);
    CHECK(status == CaptureStatus::invalidated);
    end_and_discard(device, cudaStreamPerThread, cudaErrorStreamCaptureInvalidated);
    // Once the capture has ended the legacy stream takes work again, and a stream that is not
    // blocking never restricted it.
    cudaStream_t other = device.create_stream();
    REQUIRE(device.begin_capture(other, mode) == cudaSuccess);
    device.launch(cudaStreamLegacy, {}, note(log, 2));
    end_and_discard(device, other, cudaSuccess);
    device.complete_all();
    CHECK(log == std::vector<int>{2});
  }
}

// Joined streams (the device contract asserts the GPU's answers for one joined stream): the
// capture ends only once the origin depends on every joined stream's last captured work,
// through any chain of waits; an event recorded before that work joins nothing back (found in
// review: the fake took such a stale event as the join).
TEST_CASE("a capture ends only once every joined stream's last work reaches its origin",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t o = device.create_stream("o");
  cudaStream_t x = device.create_stream("x");
  cudaStream_t y = device.create_stream("y");
  std::vector<cudaEvent_t> events(3);
  for (cudaEvent_t& e : events) REQUIRE(device.event_create(&e) == cudaSuccess);
  const auto fork_both = [&] {
    REQUIRE(device.begin_capture(o, CaptureMode::relaxed) == cudaSuccess);
    REQUIRE(device.event_record(events[0], o) == cudaSuccess);
    REQUIRE(device.stream_wait_event(x, events[0]) == cudaSuccess);
    REQUIRE(device.stream_wait_event(y, events[0]) == cudaSuccess);
    device.launch(x);  // K, on x
    REQUIRE(device.event_record(events[1], x) == cudaSuccess);
  };
  SECTION("through y, which waited on x's last work before its event") {
    fork_both();
    REQUIRE(device.stream_wait_event(y, events[1]) == cudaSuccess);
    REQUIRE(device.event_record(events[2], y) == cudaSuccess);
    REQUIRE(device.stream_wait_event(o, events[2]) == cudaSuccess);
    end_and_discard(device, o, cudaSuccess);
  }
  SECTION("not through an event y recorded before it waited") {
    fork_both();
    REQUIRE(device.event_record(events[2], y) == cudaSuccess);
    REQUIRE(device.stream_wait_event(y, events[1]) == cudaSuccess);
    REQUIRE(device.stream_wait_event(o, events[2]) == cudaSuccess);
    end_and_discard(device, o, cudaErrorStreamCaptureUnjoined);
  }
  SECTION("not once x works again after the event the origin waited on") {
    fork_both();
    REQUIRE(device.stream_wait_event(o, events[1]) == cudaSuccess);
    REQUIRE(device.event_record(events[2], y) == cudaSuccess);
    REQUIRE(device.stream_wait_event(o, events[2]) == cudaSuccess);
    device.launch(x);
    end_and_discard(device, o, cudaErrorStreamCaptureUnjoined);
  }
  CaptureStatus status = CaptureStatus::active;
  for (cudaStream_t stream : {o, x, y}) {
    REQUIRE(device.capture_info(stream, &status, nullptr) == cudaSuccess);
    CHECK(status == CaptureStatus::none);
  }
  for (cudaEvent_t e : events) REQUIRE(device.event_destroy(e) == cudaSuccess);
}

TEST_CASE("a graph launched on the legacy stream while cudaStreamPerThread captures is refused",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  cudaGraph_t graph = capture_graph(device, stream);
  cudaGraphExec_t exec = instantiate(device, graph);
  REQUIRE(device.begin_capture(cudaStreamPerThread, CaptureMode::relaxed) == cudaSuccess);
  CHECK(device.graph_upload(exec, cudaStreamLegacy) == cudaErrorStreamCaptureImplicit);
  end_and_discard(device, cudaStreamPerThread, cudaErrorStreamCaptureInvalidated);
  REQUIRE(device.begin_capture(cudaStreamPerThread, CaptureMode::relaxed) == cudaSuccess);
  CHECK(device.graph_launch(exec, cudaStreamLegacy) == cudaErrorStreamCaptureImplicit);
  end_and_discard(device, cudaStreamPerThread, cudaErrorStreamCaptureInvalidated);
  CHECK(device.pending_work() == 0);
  REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
  REQUIRE(device.graph_destroy(graph) == cudaSuccess);
}

// A per-thread stream that joined another stream's capture, whose thread exits: it leaves the
// capture, which goes on (it ends unjoined, as the stream cannot be joined back).
TEST_CASE("a joined per-thread stream whose thread exits leaves the capture going",
          "[fake][capture]") {
  FakeDevice device;
  cudaStream_t o = device.create_stream("o");
  cudaEvent_t fork = nullptr;
  REQUIRE(device.event_create(&fork) == cudaSuccess);
  REQUIRE(device.begin_capture(o, CaptureMode::relaxed) == cudaSuccess);
  REQUIRE(device.event_record(fork, o) == cudaSuccess);
  std::thread([&] {
    REQUIRE(device.stream_wait_event(cudaStreamPerThread, fork) == cudaSuccess);
  }).join();
  CaptureStatus status = CaptureStatus::none;
  REQUIRE(device.capture_info(o, &status, nullptr) == cudaSuccess);
  CHECK(status == CaptureStatus::active);
  end_and_discard(device, o, cudaErrorStreamCaptureUnjoined);
  REQUIRE(device.event_destroy(fork) == cudaSuccess);
}

// A thread that exits while its per-thread stream captures (global mode): the capture is under
// way through the thread's C++ thread_local destructors, refusing other threads' calls, and over
// once the thread has exited, as the H100 answered (test/gpu/probes.cpp).
namespace {
struct StatusAtExit {
  FakeDevice* device = nullptr;
  CaptureStatus* seen = nullptr;
  ~StatusAtExit() {  // no assertion here: recorded, and checked after the join
    if (device == nullptr) return;
    if (device->capture_info(cudaStreamPerThread, seen, nullptr) != cudaSuccess) {
      *seen = CaptureStatus::invalidated;
    }
  }
};
}  // namespace

TEST_CASE("a per-thread stream's capture is under way through its thread's thread_local "
          "destructors and over once the thread has exited",
          "[fake][capture]") {
  FakeDevice device;
  CaptureStatus in_destructor = CaptureStatus::none;
  cudaError_t began = cudaErrorUnknown;
  std::thread([&] {
    // Made before the fake's first use in the thread, so destroyed after anything of the fake's
    // own that is a thread_local (the fake once ended the capture in one, too early).
    thread_local StatusAtExit at_exit;
    at_exit.device = &device;
    at_exit.seen = &in_destructor;
    began = device.begin_capture(cudaStreamPerThread, CaptureMode::global);
  }).join();
  REQUIRE(began == cudaSuccess);
  CHECK(in_destructor == CaptureStatus::active);
  void* p = nullptr;
  CHECK(device.malloc(&p, 1 << 20) == cudaSuccess);
  if (p != nullptr) CHECK(device.free(p) == cudaSuccess);
}
