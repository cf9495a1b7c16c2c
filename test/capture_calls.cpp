// The calls a capture forbids: while a stream is captured with a pool, nothing the library does,
// on any thread, makes a call that CUDA refuses in that capture's mode (a refused call
// invalidates the capture: seen on the H200, copied by the fake device). Where the library cannot
// do what was asked without such a call it refuses with an error, or waits until the capture is
// over; it never costs the caller the capture.
#include "../lib/pool/gate.hpp"  // gate_engaged
#include "fake_helpers.hpp"
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <thread>
#include <vector>

using fake_test::capture_status;
using streampool::CapturedGraph;
using streampool::CaptureMode;
using streampool::CapturePool;
using streampool::CaptureStatus;
using streampool::Errc;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using streampool::StreamChecks;
using Bytes = PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Ends the capture with `pool` on `stream` whatever became of it, so that nothing of it outlives
// the test (an invalidated capture throws; the stream leaves capture either way).
void end_capture_anyway(cudaStream_t stream, const std::shared_ptr<CapturePool>& pool) {
  try {
    CapturedGraph graph = streampool::end_capture_with_pool(stream, pool);
  } catch (const streampool::Error&) {
  }
}

// Ends a global capture with a pool begun on another thread, from this one: CUDA ends it, and
// refuses the end (the wrong thread); the CapturePool lets it go.
void end_captured_elsewhere(streampool::FakeDevice& fake, cudaStream_t stream,
                            std::shared_ptr<CapturePool>& pool) {
  cudaGraph_t graph = nullptr;
  if (capture_status(fake, stream) != CaptureStatus::none) {
    static_cast<void>(fake.end_capture(stream, &graph));
    if (graph != nullptr) static_cast<void>(fake.graph_destroy(graph));
  }
  streampool::detach_capture_with_pool(pool);
  pool.reset();
  fake.complete_all();
}

// Until a capture's begin on another thread is counted (it may then wait for calls past their
// look at the gate: gate.hpp, CallPermit), or 10 s.
void until_counted() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!streampool::detail::gate_engaged() && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
}

// A capture with `pool` on `stream` that another thread begins just before the next `call` of
// `device` reaches the fake, waited for up to `patience` there: whether it had begun by the time
// the call was made (began_before), and whether the call was made within `making` (fired_in).
struct BeginAtCall {
  std::atomic<bool> began{false};
  std::atomic<bool> making{false};
  bool began_before = false;
  bool fired_in = false;
  std::shared_future<void> begun;

  BeginAtCall(HookedDevice& device, Call call, std::shared_ptr<CapturePool> pool,
              cudaStream_t stream, CaptureMode mode, std::chrono::milliseconds patience) {
    device.before_next(call, [this, pool = std::move(pool), stream, mode, patience] {
      fired_in = making;
      begun = on_own_thread(
          [this, pool, stream, mode] {
            streampool::begin_capture_with_pool(pool, stream, mode);
            began = true;
          },
          patience);
      began_before = began;
    });
  }
  // Makes the call through `make`, then runs the hook had it not fired, and waits for the begin.
  template <class F>
  void make(HookedDevice& device, F&& make) {
    making = true;
    make();
    making = false;
    device.run_unfired();
    begun.get();
  }
};

// Calls `call`, which may refuse with an Error: the test asserts what became of the capture.
template <class F>
void allowed_to_refuse(F call) {
  try {
    call();
  } catch (const streampool::Error&) {
  }
}

}  // namespace

// Issue 8, item 17 (deallocate): the raw API's free asks its stream's id, to learn whether it is
// the allocation's stream; on a capturing stream CUDA refuses that and invalidates the capture.
// Under StreamChecks::none too, from a thread that has not seen the stream yet.
TEST_CASE("a raw free on a stream captured with a pool asks nothing CUDA refuses") {
  for (StreamChecks checks : {StreamChecks::full, StreamChecks::identity, StreamChecks::none}) {
    CAPTURE(static_cast<int>(checks));
    auto options = test_options();
    options.stream_checks = checks;
    PoolOnFake pool(options);
    FakeDevice& fake = pool.fake();
    cudaStream_t s = fake.create_stream();
    void* p = pool->allocate(4096, s);  // before the capture
    auto capture = std::make_shared<CapturePool>(*pool);
    streampool::begin_capture_with_pool(capture, s);
    if (checks == StreamChecks::none) {
      std::thread([&] { pool->deallocate(p, 4096, s); }).join();
    } else {
      pool->deallocate(p, 4096, s);
    }
    CHECK(capture_status(fake, s) == CaptureStatus::active);
    end_capture_anyway(s, capture);
  }
}

// Issue 8, item 17 (record_stream): record_stream asks the named stream's id, refused (and the
// capture invalidated) when that stream is being captured.
TEST_CASE("record_stream naming a stream captured with a pool asks nothing CUDA refuses") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  auto x = Bytes::alloc_async(*pool, 4096, o);
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  allowed_to_refuse([&] { x.record_stream(s); });  // the graph will use x
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_capture_anyway(s, capture);
}

// Issue 8, item 17 (release_stream): release_stream asks the stream's id first, refused (and the
// capture invalidated) on a capturing stream.
TEST_CASE("release_stream of a stream captured with a pool asks nothing CUDA refuses") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  Bytes::alloc_async(*pool, 4096, s).reset();
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  allowed_to_refuse([&] { pool->release_stream(s); });
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_capture_anyway(s, capture);
}

// Issue 8, item 18 (trim): trim synchronizes the device unless a global capture, or a
// thread-local one of the calling thread, is under way. CUDA refuses cudaDeviceSynchronize
// during any capture (relaxed included: seen on the H200), from any thread, and invalidates it.
TEST_CASE("trim during a capture with a pool leaves the capture intact, in every mode and from "
          "every thread") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  Bytes::alloc_async(*pool, 4096, s).reset();  // something to reclaim
  auto capture = std::make_shared<CapturePool>(*pool);

  SECTION("a relaxed capture") {
    streampool::begin_capture_with_pool(capture, s, CaptureMode::relaxed);
    pool->trim();
  }
  SECTION("a thread-local capture, and trim from another thread") {
    streampool::begin_capture_with_pool(capture, s, CaptureMode::thread_local_);
    std::thread([&] { pool->trim(); }).join();
  }
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_capture_anyway(s, capture);
}

// Issue 8, item 18 (the out-of-memory ladder): its third step synchronizes the device under the
// same condition as trim, and so invalidates a relaxed capture, or a thread-local one of another
// thread, when some allocation runs out of memory meanwhile.
TEST_CASE("an allocation out of memory during a capture with a pool leaves the capture intact, "
          "in every mode and from every thread") {
  auto options = test_options();
  options.segment_bytes = MiB;  // segments as large as each request
  PoolOnFake pool(options, FakeDevice::Options{.capacity = 48 * MiB});
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  auto kept = Bytes::alloc_async(*pool, 40 * MiB, o);
  auto capture = std::make_shared<CapturePool>(*pool);
  std::error_code error;

  SECTION("a relaxed capture") {
    streampool::begin_capture_with_pool(capture, s, CaptureMode::relaxed);
    Bytes::try_alloc_async(*pool, 40 * MiB, o, error);  // does not fit beside `kept`
  }
  SECTION("a thread-local capture, and the allocation on another thread") {
    streampool::begin_capture_with_pool(capture, s, CaptureMode::thread_local_);
    std::thread([&] { Bytes::try_alloc_async(*pool, 40 * MiB, o, error); }).join();
  }
  CHECK(error == Errc::out_of_memory);
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_capture_anyway(s, capture);
}

// Issue 8, item 19 (release_stream of another stream): release_stream waits for the released
// stream's last fence with cudaEventSynchronize, which a global capture refuses from any thread.
TEST_CASE("release_stream of another stream during a global capture leaves the capture intact") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 4096, o);
    write_on(fake, o, x);
  }
  auto capture = std::make_shared<CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s);
  allowed_to_refuse([&] { pool->release_stream(o); });
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_capture_anyway(s, capture);
  fake.complete_all();
}

// Issue 8, item 19 (another pool's end): a pool core that goes synchronizes the device and frees
// its segments, whatever capture is under way; a global capture refuses both, from any thread.
TEST_CASE("another MemoryPool's end during a global capture leaves the capture intact") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  auto other = std::make_unique<streampool::MemoryPool>(pool.device, test_options());
  std::optional<Bytes> last(Bytes::alloc_async(*other, 4096, o));
  auto capture = std::make_shared<CapturePool>(*pool);

  SECTION("the other MemoryPool destroyed") {
    last.reset();  // nothing alive: the core goes with the MemoryPool
    streampool::begin_capture_with_pool(capture, s);
    other.reset();
  }
  SECTION("the last buffer of an orphaned MemoryPool dropped") {
    other.reset();  // its core waits for the last buffer
    streampool::begin_capture_with_pool(capture, s);
    last.reset();
  }
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_capture_anyway(s, capture);
}

// Issue 8, "also" (the "already bound" check): begin_capture_with_pool checks that the
// CapturePool is not capturing, then begins the capture, and only then records it in the
// CapturePool. Two threads beginning captures with one CapturePool on two streams both pass the
// check, and the CapturePool ends up bound to two captures while it knows of one.
TEST_CASE("a CapturePool is bound to one capture at a time, even when two threads begin at once") {
  HookedPool pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s1 = fake.create_stream();
  cudaStream_t s2 = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  Errc second = Errc::success;
  std::shared_future<void> second_done;
  pool.device->after_next(Call::begin_capture, [&] {
    // The first capture has begun, and begin_capture_with_pool has not returned: a second thread
    // begins with the same CapturePool now. Should it get past the check, the fake refuses its
    // capture, so that the test leaves no second capture behind.
    fake.fail_next(Call::begin_capture);
    second_done = on_own_thread([&] {
      try {
        streampool::begin_capture_with_pool(capture, s2);
      } catch (const streampool::Error& e) {
        second = e.errc();
      }
    });
  });
  streampool::begin_capture_with_pool(capture, s1);
  pool.device->run_unfired();
  second_done.wait();
  fake.fail_next(Call::begin_capture, 0);
  CHECK(second == Errc::capture_mismatch);
  CHECK(capture_status(fake, s2) == CaptureStatus::none);
  end_capture_anyway(s1, capture);
}

// Issue 8, "also" (the registration window): begin_capture_with_pool counts a capture among those
// under way only after cudaStreamBeginCapture returned. In between, another thread's allocation
// that must grow sees no global capture and calls cudaMalloc, which CUDA refuses, invalidating
// the capture.
TEST_CASE("no other thread makes a device allocation once a global capture with a pool has begun") {
  HookedPool pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  std::error_code error;
  std::shared_future<void> grown;
  pool.device->after_next(Call::begin_capture, [&] {
    grown = on_own_thread([&] { Bytes::try_alloc_async(*pool, 8 * MiB, o, error); });
  });
  streampool::begin_capture_with_pool(capture, s);
  pool.device->run_unfired();
  grown.wait();
  CHECK(error == Errc::capture_forbids_call);
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_capture_anyway(s, capture);
}

// A growth looks at the gate once before it waits for the growth lock, and again once it holds
// it (LargeTier::grow): a global capture with a pool whose begin is counted while the growth
// waits for another thread's forbids the cudaMalloc it was about to make. (The begin itself waits
// until the other thread's growth, past its look, has made its own.)
TEST_CASE("a growth that waited for another thread's growth makes no device allocation once a "
          "global capture with a pool has begun") {
  HookedPool pool;  // fixed segments: nothing but cudaMalloc can grow
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  std::error_code error;
  std::shared_future<void> waited;
  std::shared_future<void> begun;
  pool.device->after_next(Call::malloc, [&] {
    // b's growth holds the growth lock: a's allocation (more than b's segment leaves) decides to
    // grow and waits for it. Then a global capture with a pool begins, on a third thread: it is
    // counted (the hook waits for that), and waits for b's growth. (An `a` that took more than
    // 200 ms to reach the lock would meet the capture at its first look instead: the same
    // outcome, by the other line.)
    waited = on_own_thread([&] { Bytes::try_alloc_async(*pool, 24 * MiB, a, error); },
                           std::chrono::milliseconds(200));
    begun = on_own_thread([&] { streampool::begin_capture_with_pool(capture, s); },
                          std::chrono::milliseconds(0));
    until_counted();
  });
  auto on_b = Bytes::alloc_async(*pool, 8 * MiB, b);
  pool.device->run_unfired();
  waited.wait();
  begun.get();
  CHECK(error == Errc::capture_forbids_call);
  CHECK(fake.calls(Call::malloc) == 1);  // b's alone
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_captured_elsewhere(fake, s, capture);
}

// Found in review, 2026-12-07: the gate was read, then the call made, with nothing that kept a
// capture from beginning in between. A growth holds a permit from its look at the gate through
// its cudaMalloc (gate.hpp, CallPermit): a global capture whose begin comes meanwhile waits for
// it, and begins intact. A relaxed one, which allows cudaMalloc, does not wait.
TEST_CASE("a capture with a pool begun while another thread's growth is past its look at the "
          "gate waits for that growth's device allocation where its mode refuses it") {
  const CaptureMode mode = GENERATE(CaptureMode::global, CaptureMode::relaxed);
  CAPTURE(fake_test::mode_name(mode));
  const bool waits = mode == CaptureMode::global;
  HookedPool pool;  // fixed segments: nothing but cudaMalloc can grow
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t other = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  // The patience: past the begin when it does not wait (long), past the call when it does.
  BeginAtCall begin(*pool.device, Call::malloc, capture, s, mode,
                    std::chrono::milliseconds(waits ? 200 : 2000));
  std::error_code error;
  Bytes grown;
  begin.make(*pool.device, [&] { grown = Bytes::try_alloc_async(*pool, 64 * MiB, other, error); });
  REQUIRE(begin.fired_in);
  CHECK(begin.began_before == !waits);
  CHECK_FALSE(error);
  CHECK(grown.data() != nullptr);
  CHECK(fake.calls(Call::malloc) == 1);
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  grown.reset();
  end_captured_elsewhere(fake, s, capture);
}

// A thread-local capture restricts its own thread alone, whose calls end before its begin: a
// notice of one for another thread (a framework's, before that thread begins) waits for no third
// thread's device allocation, even one that takes long (found in review, 2026-12-08: it waited
// for every thread's, and threads that kept allocating could hold it off without end).
TEST_CASE("a thread-local capture noticed for another thread does not wait for a third thread's "
          "device allocation") {
  HookedPool pool;  // fixed segments: nothing but cudaMalloc can grow
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> in_call{false};
  pool.device->before_next(Call::malloc, [&] {
    in_call = true;
    released.wait_for(std::chrono::seconds(10));
  });
  std::error_code error;
  std::thread grower([&] {
    auto grown = Bytes::try_alloc_async(*pool, 64 * MiB, a, error);
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!in_call && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  REQUIRE(in_call);  // the grower holds its permit, in its cudaMalloc
  std::promise<void> quit;
  std::thread noted([done = quit.get_future()]() mutable { done.wait(); });  // begins nothing
  const std::thread::id capturing = noted.get_id();
  std::shared_future<void> noticed = on_own_thread(
      [capturing] { streampool::CaptureNotice notice(CaptureMode::thread_local_, capturing); },
      std::chrono::milliseconds(2000));
  const bool without_waiting =
      noticed.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  release.set_value();
  grower.join();
  noticed.wait();
  quit.set_value();
  noted.join();
  CHECK(without_waiting);
  CHECK_FALSE(error);
  CHECK(fake.calls(Call::malloc) == 1);
}

// A capture begun from inside one of the pool's device calls (a Device of the user's that begins
// one, which device.hpp forbids) would wait for that very call's permit: it is refused with an
// error instead of waiting for ever (found in review, 2026-12-08: only a debug assert said so).
TEST_CASE("a capture begun inside a device call of the pool's is refused rather than waiting for "
          "that call") {
  HookedPool pool;  // fixed segments: a growth is a cudaMalloc
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  std::atomic<int> refused{-1};  // the Errc of the refusal; 0 where the notice was made
  pool.device->before_next(Call::malloc, [&] {
    try {
      streampool::CaptureNotice notice(CaptureMode::global);
      refused = 0;
    } catch (const streampool::Error& e) {
      refused = e.code().value();
    }
  });
  std::error_code error;
  std::atomic<bool> done{false};
  std::thread grower([&] {
    auto grown = Bytes::try_alloc_async(*pool, 64 * MiB, a, error);
    done = true;
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  if (!done) {
    grower.detach();  // waiting for itself for ever: the failure below says so
    FAIL("the allocation did not return: the begin inside its cudaMalloc waited for it");
  }
  grower.join();
  CHECK(refused == static_cast<int>(Errc::capture_forbids_call));
  CHECK_FALSE(error);
  CHECK(fake.calls(Call::malloc) == 1);
}

// A device whose granularity query answers but whose address reservation says it lacks virtual
// memory: the growth falls back to cudaMalloc (LargeTier::grow) under the permit it took before
// those calls, so that a global capture with a pool begun during them waits for it.
TEST_CASE("a growth that finds the device lacks virtual memory falls back to a device allocation "
          "before a global capture with a pool begun during its calls") {
  auto options = test_options();
  options.expandable_segments = true;
  HookedPool pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t a = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  fake.fail_next(Call::vm_reserve, 1, cudaErrorNotSupported);
  std::shared_future<void> begun;
  pool.device->before_next(Call::vm_reserve, [&] {
    begun = on_own_thread([&] { streampool::begin_capture_with_pool(capture, s); },
                          std::chrono::milliseconds(200));
  });
  std::error_code error;
  auto on_a = Bytes::try_alloc_async(*pool, 8 * MiB, a, error);
  pool.device->run_unfired();
  begun.get();
  CHECK_FALSE(error);
  CHECK(on_a.data() != nullptr);
  CHECK(fake.calls(Call::vm_reserve) == 1);
  CHECK(fake.calls(Call::malloc) == 1);
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  on_a.reset();
  end_captured_elsewhere(fake, s, capture);
  // Once the capture is over, the same request is served from that segment.
  auto after = Bytes::alloc_async(*pool, 8 * MiB, a);
  CHECK(fake.calls(Call::malloc) == 1);
}

// Each restricted call the pool makes is made under a permit taken before its look at the gate
// (gate.hpp, CallPermit): a global capture with a pool whose begin comes between the look and
// the call waits until the call has returned, and begins intact.
TEST_CASE("a global capture with a pool begun between a call's look at the gate and the call "
          "waits for the call, whichever call") {
  HookedPool pool(one_block_slabs());  // a slab of one block: a miss looks at other streams
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  auto capture = std::make_shared<CapturePool>(*pool);
  Call call = Call::device_synchronize;
  std::function<void()> make;  // what makes the call
  std::optional<Bytes> held;
  SECTION("the device synchronize of trim") {
    Bytes::alloc_async(*pool, 4 * MiB, a).reset();
    call = Call::device_synchronize;
    make = [&] { pool->trim(0); };
  }
  SECTION("the cudaFree of trim") {
    Bytes::alloc_async(*pool, 4 * MiB, a).reset();
    fake.complete_all();
    call = Call::free;
    make = [&] { pool->trim(0); };
  }
  SECTION("the stream synchronize of release_stream") {
    auto buffer = Bytes::alloc_async(*pool, 4 * MiB, a);
    fake.launch(a, {fake_test::write_of(buffer.data(), 4 * MiB)});
    buffer.reset();  // fenced on a, pending
    call = Call::stream_synchronize;
    make = [&] { pool->release_stream(a); };
  }
  SECTION("the event query of another stream's fence") {
    // a holds a block of the class behind a recorded, pending fence (c's miss asks a for a
    // fence, a's next call records it); b misses and asks whether that fence completed.
    constexpr std::size_t size = 4096;
    constexpr std::size_t other = 100000;  // another class
    cudaStream_t c = fake.create_stream();
    Bytes::alloc_async(*pool, other, b).reset();
    {
      auto on_a = Bytes::alloc_async(*pool, size, a);
      fake.launch(a, {fake_test::write_of(on_a.data(), size)});
    }
    held = Bytes::alloc_async(*pool, size, c);
    Bytes::alloc_async(*pool, other, a).reset();
    REQUIRE(pool->stats().fences_recorded >= 1);
    call = Call::event_query;
    make = [&] { Bytes::alloc_async(*pool, size, b).reset(); };
  }
  CAPTURE(static_cast<int>(call));
  BeginAtCall begin(*pool.device, call, capture, s, CaptureMode::global,
                    std::chrono::milliseconds(200));
  begin.make(*pool.device, make);
  REQUIRE(begin.fired_in);  // the call was made
  CHECK_FALSE(begin.began_before);
  CHECK(capture_status(fake, s) == CaptureStatus::active);
  end_captured_elsewhere(fake, s, capture);
}

namespace {
// A device whose restricted calls, made from a thread that asks for it, first spin a little: the
// moment between the pool's look at the gate and the call, widened for a stress test to find.
thread_local bool slow_calls_here = false;
class SlowDevice final : public streampool::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  // The names device_calls.def uses, as in namespace streampool.
  using StreamId = streampool::StreamId;
  using CaptureId = streampool::CaptureId;
  using CaptureMode = streampool::CaptureMode;
  using CaptureStatus = streampool::CaptureStatus;
#define STREAMPOOL_DEVICE_CALL(name, params, args)                            \
  cudaError_t name params noexcept override {                                 \
    if (slow_calls_here && slowed(Call::name)) spin_a_little();               \
    return inner().name args;                                                 \
  }
#include <streampool/device_calls.def>

 private:
  static void spin_a_little() noexcept {  // 20 us: a sleep would take a millisecond or more
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  static bool slowed(Call call) noexcept {
    return call == Call::malloc || call == Call::free || call == Call::device_synchronize ||
           call == Call::stream_synchronize || call == Call::event_query ||
           call == Call::event_synchronize;
  }
};
}  // namespace

// The permits at work: threads that grow (cudaMalloc), trim (device synchronize, cudaFree) and
// wait for other streams' fences on one device, each call slowed, while another thread begins
// and ends global captures with a pool on that device, over and over. No capture is refused its
// end, nor any of its allocations (every call it would refuse waited for, or not made).
TEST_CASE("global captures begun over and over beside threads that grow and trim all end "
          "intact") {
  auto options = test_options();
  options.segment_bytes = 4 * MiB;  // fixed segments: growths are cudaMalloc, trims cudaFree
  auto fake_device = std::make_shared<FakeDevice>();
  streampool::MemoryPool pool(std::make_shared<SlowDevice>(fake_device), options);
  FakeDevice& fake = *fake_device;
  cudaStream_t captured = fake.create_stream();
  std::atomic<int> work{0};
  std::vector<std::jthread> workers;  // stopped and joined as they go, on every path
  for (int t = 0; t < 2; ++t) {
    workers.emplace_back([&, t](std::stop_token stop) {
      slow_calls_here = true;
      cudaStream_t own = fake.create_stream();
      std::uint32_t x = 12345u + static_cast<std::uint32_t>(t);
      while (!stop.stop_requested()) {
        x = x * 1664525u + 1013904223u;
        const std::size_t bytes = std::size_t{4096} << (x >> 28) % 12;  // 4 KiB to 8 MiB
        std::error_code error;  // refused during a capture: allowed
        auto buffer = Bytes::try_alloc_async(pool, bytes, own, error);
        if ((x & 7) == 0) {
          try {
            pool.trim(0);
          } catch (const streampool::Error&) {
          }
        }
        work.fetch_add(1);
      }
    });
  }
  auto cp = std::make_shared<CapturePool>(pool);
  cp->reserve(2 * MiB);
  while (work.load() < 2) std::this_thread::yield();  // the workers under way
  constexpr int captures = 100;  // without the permits, a third to nine tenths were refused
  int ended = 0;
  int refused = 0;
  for (int i = 0; i < captures; ++i) {
    try {
      streampool::begin_capture_with_pool(cp, captured, CaptureMode::global);
      auto inside = Bytes::alloc_async(pool, 64 * 1024, captured);
      inside.reset();
      std::this_thread::sleep_for(std::chrono::microseconds(100));  // the others' calls meanwhile
      CapturedGraph graph = streampool::end_capture_with_pool(captured, cp);
      ++ended;
    } catch (const streampool::Error& e) {
      ++refused;
      UNSCOPED_INFO("capture " << i << ": " << e.what());
      if (capture_status(fake, captured) != CaptureStatus::none) {
        cudaGraph_t graph = nullptr;
        static_cast<void>(fake.end_capture(captured, &graph));
        if (graph != nullptr) static_cast<void>(fake.graph_destroy(graph));
      }
      streampool::detach_capture_with_pool(cp);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // and between captures
  }
  workers.clear();
  CHECK(refused == 0);
  CHECK(ended == captures);
  CHECK(work.load() > 0);
  fake.complete_all();
}
