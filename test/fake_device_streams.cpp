// FakeDevice streams, work and events: handles and ids as CUDA gives them, work that completes
// only when told to and in stream order, events that cover the work before their record.
#include "fake_helpers.hpp"

#include <atomic>
#include <future>
#include <optional>
#include <set>
#include <stdexcept>

using namespace fake_test;

// --- streams ----------------------------------------------------------------------------------

TEST_CASE("create_stream returns handles distinct from each other and from the default streams",
          "[fake][streams]") {
  FakeDevice device;
  std::set<cudaStream_t> handles{nullptr, cudaStreamLegacy, cudaStreamPerThread};
  for (int i = 0; i < 8; ++i) REQUIRE(handles.insert(device.create_stream()).second);
}

TEST_CASE("a destroyed stream's handle goes to the very next create_stream, with a new stream id",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  const StreamId a_id = id_of(device, a);
  const StreamId b_id = id_of(device, b);
  device.destroy_stream(a);
  device.destroy_stream(b);

  cudaStream_t first = device.create_stream();  // the last handle destroyed comes back first
  REQUIRE(first == b);
  cudaStream_t second = device.create_stream();
  REQUIRE(second == a);
  std::set<StreamId> ids{a_id, b_id, id_of(device, first), id_of(device, second)};
  REQUIRE(ids.size() == 4);
}

TEST_CASE("stream ids are unique and increase with each new stream, across devices too",
          "[fake][streams]") {
  FakeDevice device;
  FakeDevice other;
  StreamId last = 0;
  for (int i = 0; i < 4; ++i) {
    FakeDevice& d = i % 2 == 0 ? device : other;
    cudaStream_t stream = d.create_stream();
    const StreamId id = id_of(d, stream);
    REQUIRE(id > last);
    last = id;
    d.destroy_stream(stream);
  }
}

TEST_CASE("0 and cudaStreamLegacy name one legacy default stream, the same in every thread",
          "[fake][streams]") {
  FakeDevice device;
  const StreamId legacy = id_of(device, cudaStreamLegacy);
  REQUIRE(id_of(device, nullptr) == legacy);
  REQUIRE(on_other_thread([&] { return id_of(device, nullptr); }) == legacy);

  std::vector<int> log;
  device.launch(nullptr, {}, note(log, 1));
  device.complete(cudaStreamLegacy);
  REQUIRE(log == std::vector<int>{1});
}

TEST_CASE("cudaStreamPerThread names a stream private to each thread", "[fake][streams]") {
  FakeDevice device;
  const StreamId here = id_of(device, cudaStreamPerThread);
  REQUIRE(id_of(device, cudaStreamPerThread) == here);
  REQUIRE(here != id_of(device, cudaStreamLegacy));
  const StreamId there = on_other_thread([&] { return id_of(device, cudaStreamPerThread); });
  REQUIRE(there != here);

  SECTION("completing it in another thread completes that thread's stream, not this one's") {
    device.launch(cudaStreamPerThread);
    std::thread([&] { device.complete(cudaStreamPerThread); }).join();
    REQUIRE(device.pending_work() == 1);
    device.complete(cudaStreamPerThread);
    REQUIRE(device.pending_work() == 0);
  }
}

TEST_CASE("a FakeDevice built where a destroyed one lived gets per-thread streams of its own",
          "[fake][streams]") {
  std::optional<FakeDevice> device;  // both devices live in the optional's storage
  device.emplace();
  // The per-thread streams belong to a thread that outlives the first device.
  std::promise<void> first_asked;
  std::promise<void> second_built;
  StreamId first = 0;
  StreamId second = 0;
  cudaError_t first_status = cudaErrorUnknown;
  cudaError_t second_status = cudaErrorUnknown;
  std::thread worker([&] {
    first_status = device->stream_id(cudaStreamPerThread, &first);
    first_asked.set_value();
    second_built.get_future().wait();
    second_status = device->stream_id(cudaStreamPerThread, &second);
  });
  first_asked.get_future().wait();
  device.emplace();
  second_built.set_value();
  worker.join();
  REQUIRE(first_status == cudaSuccess);
  REQUIRE(second_status == cudaSuccess);
  REQUIRE(second != first);
}

TEST_CASE("calls naming an unknown or destroyed stream fail with cudaErrorInvalidResourceHandle",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t gone = device.create_stream();
  device.destroy_stream(gone);
  cudaStream_t never = reinterpret_cast<cudaStream_t>(0xdead0);
  cudaEvent_t event = must_create_event(device);

  for (cudaStream_t bad : {gone, never}) {
    StreamId id = 0;
    CaptureStatus status = CaptureStatus::none;
    cudaGraph_t graph = nullptr;
    REQUIRE(device.stream_id(bad, &id) == cudaErrorInvalidResourceHandle);
    REQUIRE(device.event_record(event, bad) == cudaErrorInvalidResourceHandle);
    REQUIRE(device.stream_wait_event(bad, event) == cudaErrorInvalidResourceHandle);
    REQUIRE(device.stream_synchronize(bad) == cudaErrorInvalidResourceHandle);
    REQUIRE(device.capture_info(bad, &status, nullptr) == cudaErrorInvalidResourceHandle);
    REQUIRE(device.begin_capture(bad, CaptureMode::relaxed) == cudaErrorInvalidResourceHandle);
    REQUIRE(device.end_capture(bad, &graph) == cudaErrorInvalidResourceHandle);
    // Controls are the test's own calls: a bad handle there is a bug in the test, and throws.
    REQUIRE_THROWS_AS(device.launch(bad), std::invalid_argument);
    REQUIRE_THROWS_AS(device.complete(bad), std::invalid_argument);
    REQUIRE_THROWS_AS(device.destroy_stream(bad), std::invalid_argument);
  }
  REQUIRE_THROWS_AS(device.destroy_stream(cudaStreamPerThread), std::invalid_argument);
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

// --- work -------------------------------------------------------------------------------------

TEST_CASE("work stays pending until its stream is completed, then runs its bodies in order",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  std::vector<int> log;
  device.launch(a, {}, note(log, 1));
  device.launch(b, {}, note(log, 10));
  device.launch(a, {}, note(log, 2));
  REQUIRE(device.pending_work() == 3);
  REQUIRE(log.empty());

  device.complete(a);
  REQUIRE(log == std::vector<int>{1, 2});  // b's work is not a's to complete
  REQUIRE(device.pending_work() == 1);
  device.complete_all();
  REQUIRE(log == std::vector<int>{1, 2, 10});
  REQUIRE(device.pending_work() == 0);
}

TEST_CASE("complete completes the work enqueued so far, not work its bodies enqueue",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  std::vector<int> log;
  device.launch(stream, {}, [&] {
    log.push_back(1);
    device.launch(stream, {}, note(log, 2));
  });
  device.complete(stream);
  REQUIRE(log == std::vector<int>{1});
  REQUIRE(device.pending_work() == 1);
  device.complete_all();  // but complete_all completes until nothing is left
  REQUIRE(log == std::vector<int>{1, 2});
}

TEST_CASE("a destroyed stream's pending work stays pending and can still complete",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  std::vector<int> log;
  device.launch(stream, {}, note(log, 1));
  cudaEvent_t event = recorded_event(device, stream);
  device.destroy_stream(stream);
  REQUIRE(device.pending_work() == 1);
  REQUIRE(device.event_query(event) == cudaErrorNotReady);

  SECTION("through complete_all") { device.complete_all(); }
  SECTION("through device_synchronize") { REQUIRE(device.device_synchronize() == cudaSuccess); }
  SECTION("through event_synchronize on an event recorded before the stream went") {
    REQUIRE(device.event_synchronize(event) == cudaSuccess);
  }
  SECTION("through a stream that waits on it") {
    cudaStream_t waiter = device.create_stream();  // gets the destroyed stream's handle
    REQUIRE(device.stream_wait_event(waiter, event) == cudaSuccess);
    device.launch(waiter, {}, note(log, 2));
    REQUIRE(device.stream_synchronize(waiter) == cudaSuccess);
    REQUIRE(log == std::vector<int>{1, 2});
  }
  REQUIRE(log.front() == 1);
  REQUIRE(device.pending_work() == 0);
  REQUIRE(device.event_query(event) == cudaSuccess);
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

TEST_CASE("completing a stream first completes the work its event waits cover on other streams",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  cudaStream_t c = device.create_stream();
  std::vector<int> log;
  device.launch(a, {}, note(log, 1));
  order_after(device, b, a);
  device.launch(a, {}, note(log, 2));  // after the record: b does not wait for it
  device.launch(b, {}, note(log, 10));

  SECTION("one wait") {
    device.complete(b);
    REQUIRE(log == std::vector<int>{1, 10});
    REQUIRE(device.pending_work() == 1);
  }
  SECTION("a chain of waits, completed from its last stream") {
    order_after(device, c, b);
    device.launch(c, {}, note(log, 100));
    device.complete(c);
    REQUIRE(log == std::vector<int>{1, 10, 100});
    REQUIRE(device.pending_work() == 1);
  }
  SECTION("work before the wait on the waiting stream does not wait") {
    cudaStream_t d = device.create_stream();
    device.launch(d, {}, note(log, 1000));
    order_after(device, d, a);
    device.launch(d, {}, note(log, 1001));
    std::vector<int> expected{1000, 1, 2, 1001};  // the wait covers all of a's work so far
    device.complete(d);
    REQUIRE(log == expected);
  }
}

TEST_CASE("synchronizing calls complete exactly the work they wait for", "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  std::vector<int> log;
  device.launch(a, {}, note(log, 1));
  cudaEvent_t event = recorded_event(device, a);
  device.launch(a, {}, note(log, 2));
  device.launch(b, {}, note(log, 10));

  SECTION("stream_synchronize completes the stream's work") {
    REQUIRE(device.stream_synchronize(a) == cudaSuccess);
    REQUIRE(log == std::vector<int>{1, 2});
  }
  SECTION("event_synchronize completes the work before the record") {
    REQUIRE(device.event_synchronize(event) == cudaSuccess);
    REQUIRE(log == std::vector<int>{1});
  }
  SECTION("device_synchronize completes everything") {
    REQUIRE(device.device_synchronize() == cudaSuccess);
    REQUIRE(log.size() == 3);
    REQUIRE(device.pending_work() == 0);
  }
  SECTION("stream_synchronize completes what the stream waits for, with no work after the wait") {
    cudaStream_t waiter = device.create_stream();
    REQUIRE(device.stream_wait_event(waiter, event) == cudaSuccess);
    REQUIRE(device.stream_synchronize(waiter) == cudaSuccess);  // CUDA enqueues the wait itself
    REQUIRE(log == std::vector<int>{1});
    REQUIRE(device.event_query(event) == cudaSuccess);
  }
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

TEST_CASE("device_synchronize waits for the work enqueued before it, not for work enqueued while "
          "it waits",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  std::vector<int> log;
  // A body stands for another thread that enqueues work while the synchronize is under way.
  device.launch(a, {}, [&] {
    log.push_back(1);
    device.launch(b, {}, note(log, 2));
  });
  REQUIRE(device.device_synchronize() == cudaSuccess);
  REQUIRE(log == std::vector<int>{1});
  REQUIRE(device.pending_work() == 1);
  device.complete_all();
  REQUIRE(log == std::vector<int>{1, 2});
}

TEST_CASE("with auto-complete, work completes as it is launched", "[fake][streams]") {
  std::vector<int> log;
  SECTION("from the options") {
    FakeDevice::Options options;
    options.auto_complete = true;
    FakeDevice device(options);
    device.launch(device.create_stream(), {}, note(log, 1));
    REQUIRE(log == std::vector<int>{1});
    REQUIRE(device.pending_work() == 0);
  }
  SECTION("from set_auto_complete, which turns it on and off") {
    FakeDevice device;
    cudaStream_t stream = device.create_stream();
    device.set_auto_complete(true);
    device.launch(stream, {}, note(log, 1));
    REQUIRE(log == std::vector<int>{1});
    device.set_auto_complete(false);
    device.launch(stream, {}, note(log, 2));
    REQUIRE(log == std::vector<int>{1});
    REQUIRE(device.pending_work() == 1);
  }
}

TEST_CASE("bodies run without the fake's lock, so they may call the fake", "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  std::size_t pending_seen = 0;
  cudaError_t malloc_status = cudaErrorUnknown;
  void* ptr = nullptr;
  device.launch(a, {}, [&] {
    pending_seen = device.pending_work();
    malloc_status = device.malloc(&ptr, 256);
    device.launch(b);
    device.complete(b);
  });
  device.complete(a);
  REQUIRE(pending_seen == 1);  // the work running its body completes once the body returns
  REQUIRE(malloc_status == cudaSuccess);
  REQUIRE(device.pending_work() == 0);
  REQUIRE(device.free(ptr) == cudaSuccess);
}

// --- events -----------------------------------------------------------------------------------

TEST_CASE("event_create returns distinct handles, counted as live until destroyed",
          "[fake][events]") {
  FakeDevice device;
  std::set<cudaEvent_t> events;
  for (int i = 0; i < 8; ++i) REQUIRE(events.insert(must_create_event(device)).second);
  REQUIRE(device.live_events() == 8);
  for (cudaEvent_t event : events) REQUIRE(device.event_destroy(event) == cudaSuccess);
  REQUIRE(device.live_events() == 0);
}

TEST_CASE("an event is complete once the work enqueued before its last record has completed",
          "[fake][events]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  cudaEvent_t event = must_create_event(device);

  SECTION("an event never recorded is complete") {
    REQUIRE(device.event_query(event) == cudaSuccess);
    REQUIRE(device.event_synchronize(event) == cudaSuccess);
  }
  SECTION("an event recorded on an idle stream is complete") {
    REQUIRE(device.event_record(event, a) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaSuccess);
  }
  SECTION("an event recorded after pending work completes with it, not with later work") {
    device.launch(a);
    REQUIRE(device.event_record(event, a) == cudaSuccess);
    device.launch(a);
    REQUIRE(device.event_query(event) == cudaErrorNotReady);
    REQUIRE(device.event_synchronize(event) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaSuccess);
    REQUIRE(device.pending_work() == 1);
  }
  SECTION("recording again replaces what the event covers") {
    device.launch(a);
    REQUIRE(device.event_record(event, a) == cudaSuccess);
    REQUIRE(device.event_record(event, b) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaSuccess);
    device.launch(b);
    REQUIRE(device.event_record(event, b) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaErrorNotReady);
    device.complete(b);
    REQUIRE(device.event_query(event) == cudaSuccess);
  }
  SECTION("an event recorded after a wait completes only when the awaited work has") {
    device.launch(a);
    order_after(device, b, a);
    REQUIRE(device.event_record(event, b) == cudaSuccess);  // no work of b's in between
    REQUIRE(device.event_query(event) == cudaErrorNotReady);
    device.complete(a);
    REQUIRE(device.event_query(event) == cudaSuccess);
  }
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

TEST_CASE("a pending event can be destroyed, and streams waiting on it still wait",
          "[fake][events]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  std::vector<int> log;
  device.launch(a, {}, note(log, 1));
  cudaEvent_t event = recorded_event(device, a);
  REQUIRE(device.stream_wait_event(b, event) == cudaSuccess);
  REQUIRE(device.event_destroy(event) == cudaSuccess);
  device.launch(b, {}, note(log, 2));
  device.complete(b);
  REQUIRE(log == std::vector<int>{1, 2});
}

TEST_CASE("calls naming an unknown or destroyed event fail with cudaErrorInvalidResourceHandle",
          "[fake][events]") {
  FakeDevice device;
  cudaStream_t stream = device.create_stream();
  cudaEvent_t gone = must_create_event(device);
  REQUIRE(device.event_destroy(gone) == cudaSuccess);
  REQUIRE(device.event_destroy(gone) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.event_record(gone, stream) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.event_query(gone) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.event_synchronize(gone) == cudaErrorInvalidResourceHandle);
  REQUIRE(device.stream_wait_event(stream, gone) == cudaErrorInvalidResourceHandle);
}

// --- threads ----------------------------------------------------------------------------------

TEST_CASE("many threads may use one FakeDevice at once", "[fake][streams]") {
  FakeDevice device;
  std::atomic<int> bodies{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        cudaStream_t stream = device.create_stream();
        void* ptr = nullptr;
        cudaEvent_t event = nullptr;
        if (device.malloc(&ptr, 4096) != cudaSuccess) ++failures;
        device.launch(stream, {{ptr, 4096, true}}, [&] { ++bodies; });
        if (device.event_create(&event) != cudaSuccess) ++failures;
        if (device.event_record(event, stream) != cudaSuccess) ++failures;
        if (i % 2 == 0) {
          if (device.stream_synchronize(stream) != cudaSuccess) ++failures;
        } else {
          if (device.event_synchronize(event) != cudaSuccess) ++failures;
        }
        if (device.event_query(event) != cudaSuccess) ++failures;
        if (device.event_destroy(event) != cudaSuccess) ++failures;
        if (device.free(ptr) != cudaSuccess) ++failures;
        device.destroy_stream(stream);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  REQUIRE(failures == 0);
  REQUIRE(bodies == 400);
  REQUIRE(device.pending_work() == 0);
  REQUIRE(device.live_allocations() == 0);
  REQUIRE(device.hazards().empty());
}

TEST_CASE("work completes once its body has returned: while it runs, the events recorded after "
          "it and work that waits for it are pending",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t b = device.create_stream();
  cudaEvent_t after = nullptr;
  REQUIRE(device.event_create(&after) == cudaSuccess);
  std::optional<cudaError_t> seen_inside;
  std::size_t pending_inside = 0;
  bool waiter_ran = false;
  bool waiter_ran_inside = false;
  device.launch(a, {}, [&] {
    seen_inside = device.event_query(after);
    device.complete(b);  // b's work waits for this one: it cannot complete before it
    waiter_ran_inside = waiter_ran;
    pending_inside = device.pending_work();
  });
  REQUIRE(device.event_record(after, a) == cudaSuccess);
  REQUIRE(device.stream_wait_event(b, after) == cudaSuccess);
  device.launch(b, {}, [&] { waiter_ran = true; });
  device.complete(a);
  REQUIRE(seen_inside.has_value());
  CHECK(*seen_inside == cudaErrorNotReady);
  CHECK_FALSE(waiter_ran_inside);
  CHECK(pending_inside == 2);  // a's running work and b's
  CHECK(device.event_query(after) == cudaSuccess);
  CHECK_FALSE(waiter_ran);  // complete(a) completes a's work only
  device.complete(b);
  CHECK(waiter_ran);
  CHECK(device.pending_work() == 0);
  REQUIRE(device.event_destroy(after) == cudaSuccess);
}

TEST_CASE("a synchronize inside a body that waits for that body is not permitted; one that does "
          "not wait for it completes",
          "[fake][streams]") {
  FakeDevice device;
  cudaStream_t a = device.create_stream();
  cudaStream_t c = device.create_stream();
  cudaEvent_t on_a = nullptr;
  REQUIRE(device.event_create(&on_a) == cudaSuccess);
  REQUIRE(device.event_record(on_a, a) == cudaSuccess);  // covers nothing yet: complete
  bool c_ran = false;
  device.launch(c, {}, [&] { c_ran = true; });
  cudaError_t own = cudaSuccess;
  cudaError_t other = cudaErrorUnknown;
  cudaError_t whole_device = cudaSuccess;
  device.launch(a, {}, [&] {
    own = device.stream_synchronize(a);
    other = device.stream_synchronize(c);
    whole_device = device.device_synchronize();
  });
  device.complete(a);
  CHECK(own == cudaErrorNotPermitted);
  CHECK(other == cudaSuccess);
  CHECK(c_ran);
  CHECK(whole_device == cudaErrorNotPermitted);
  CHECK(device.pending_work() == 0);
  CHECK(device.event_synchronize(on_a) == cudaSuccess);
  REQUIRE(device.event_destroy(on_a) == cudaSuccess);
}
