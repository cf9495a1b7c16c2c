// release_stream with buffers of the stream still alive: what is dropped on a released stream
// after its last fence is not covered by that fence, and must not reach another stream until its
// own work is done, whatever the pool does with the released stream's state meanwhile.
#include "fake_helpers.hpp"
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>

#include <chrono>
#include <cmath>
#include <future>
#include <optional>

using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

}  // namespace

TEST_CASE("a block dropped on a stream while release_stream waits for it is not handed over "
          "before its own work") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, a));
  void* const dropped = x->data();
  // The body runs while release_stream waits for A's fence: it stands for another thread that,
  // meanwhile, enqueues more work on A using x, then drops x (as it may: x is still alive).
  fake.launch(a, {}, [&] {
    fake.launch(a, {{dropped, 4096, true}});
    x.reset();
  });
  pool->release_stream(a);
  REQUIRE_FALSE(x.has_value());
  REQUIRE(fake.pending_work() == 1);  // the work enqueued after the fence

  auto y = Bytes::alloc_async(*pool, 4096, b);
  write_on(fake, b, y);
  CAPTURE(static_cast<void*>(y.data()) == dropped);
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}

TEST_CASE("a large block dropped on a released stream is not handed at once to the stream that "
          "next gets the released stream's place") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 8 * MiB, a);
    pool->release_stream(a);  // x is still alive: allowed
    write_on(fake, a, x);     // pending when x is dropped
  }
  // Other streams come and go: the pool may reuse what it kept for the streams it forgot.
  for (int i = 0; i < 3; ++i) {
    cudaStream_t passing = fake.create_stream();
    Bytes::alloc_async(*pool, 100, passing).reset();
    pool->release_stream(passing);
  }
  for (int i = 0; i < 3; ++i) {
    cudaStream_t fresh = fake.create_stream();
    auto y = Bytes::alloc_async(*pool, 8 * MiB, fresh);
    write_on(fake, fresh, y);
  }
  REQUIRE(fake.hazards().empty());
  fake.complete_all();
}

// Issue 8, item 6: an allocation on X that takes the slow path checks that X is not retired,
// finds a block and only then counts itself on X's state. release_stream(X) on another thread in
// between sees no live buffer on X and recycles X's state for the next new stream, with the
// allocation then counted on it: the buffer's drop puts its block on the new stream's own list,
// and the new stream takes it back at once while X's write is pending.
TEST_CASE("release_stream racing an allocation on the same stream lets no other stream take "
          "that allocation's block early") {
  HookedPool pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t x = fake.create_stream();
  cudaStream_t o = fake.create_stream();
  cudaStream_t p = fake.create_stream();
  constexpr std::size_t size = 4096;       // the size class of the race
  constexpr std::size_t other = 100000;    // another class, for calls that only name a stream
  Bytes::alloc_async(*pool, other, x).reset();  // X is known, with no buffer alive on it

  // O holds a block of the class behind a fence that is recorded and pending: P's miss asks O
  // for a fence, O's next call records it.
  {
    auto on_o = Bytes::alloc_async(*pool, size, o);
    write_on(fake, o, on_o);
  }
  auto held_by_p = Bytes::alloc_async(*pool, size, p);
  Bytes::alloc_async(*pool, other, o).reset();
  REQUIRE(pool->stats().fences_recorded >= 1);

  // X misses and looks at O's block: while it asks whether O's fence completed, another thread
  // releases X.
  std::shared_future<void> released;
  pool.device->before_next(Call::event_query, [&] {
    released = on_own_thread([&] { pool->release_stream(x); });
  });
  auto on_x = Bytes::alloc_async(*pool, size, x);
  pool.device->run_unfired();
  released.get();

  cudaStream_t y = fake.create_stream();
  Bytes::alloc_async(*pool, other, y).reset();  // a new stream, seen by the pool
  write_on(fake, x, on_x);                      // X uses its buffer (it is alive: allowed)
  on_x.reset();
  auto on_y = Bytes::alloc_async(*pool, size, y);
  write_on(fake, y, on_y);
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Issue 8, item 7: record_stream(R) names R's state; release_stream(R) recycles that state for
// the next new stream; the drop then records the fence meant for R on the new stream, and the
// block is handed over once that fence (and the buffer's own stream's) completed, while R's work
// on it is still pending.
TEST_CASE("a buffer recorded on a stream that was then released is not handed over before that "
          "stream's work") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t r = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  std::optional<Bytes> x(Bytes::alloc_async(*pool, 4096, a));
  write_on(fake, a, *x);
  x->record_stream(r);
  pool->release_stream(r);
  // R reads x after A's write, after the release (x is alive: R may still use it).
  fake_test::order_after(fake, r, a);
  fake.launch(r, {{x->data(), x->byte_size(), false}});

  cudaStream_t n = fake.create_stream();
  Bytes::alloc_async(*pool, 100000, n).reset();  // a new stream, which may get R's old place
  x.reset();
  fake.complete(a);  // A's write is done; R's read is not

  auto y = Bytes::alloc_async(*pool, 4096, b);
  write_on(fake, b, y);
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Issue 8, "also" (the race on a stream state's `recyclable` flag, lost): the device-synchronize
// reclaim notes which retired states are idle before its synchronize and marks them recyclable
// after it, without looking again. A state that a new stream took in between is marked too;
// once that stream is gone it is recycled again, with the range it dropped still pending, and a
// third stream takes that range as its own.
TEST_CASE("a stream's state is recycled only once nothing dropped on it is pending, even when a "
          "new stream took it during a trim") {
  HookedPool pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  Bytes::alloc_async(*pool, 4096, a).reset();
  pool->release_stream(a);  // A's state is idle: recycled for the next new stream

  cudaStream_t b = fake.create_stream();
  std::optional<Bytes> on_b;
  std::shared_future<void> allocated;
  pool.device->after_next(Call::device_synchronize, [&] {
    allocated = on_own_thread([&] { on_b.emplace(Bytes::alloc_async(*pool, 8 * MiB, b)); });
  });
  pool->trim(std::size_t{1} << 40);  // keeps the memory
  pool.device->run_unfired();
  allocated.get();
  write_on(fake, b, *on_b);
  on_b.reset();  // pending: B's write

  // B's buffers are all dropped, B is destroyed; its handle goes to C, which retires B.
  fake.destroy_stream(b);
  cudaStream_t c = fake.create_stream();
  REQUIRE(c == b);
  Bytes::alloc_async(*pool, 4096, c).reset();
  cudaStream_t d = fake.create_stream();
  Bytes::alloc_async(*pool, 4096, d).reset();
  pool->release_stream(d);  // recycles the states that are idle

  for (int i = 0; i < 3; ++i) {
    cudaStream_t fresh = fake.create_stream();
    auto y = Bytes::alloc_async(*pool, 8 * MiB, fresh);
    write_on(fake, fresh, y);
  }
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Found in review: an allocation that found its stream's state gated unlocked it, asked the
// capture status, and locked it again without checking that it still named the stream: the state
// could have been recycled for another stream meanwhile, whose pending block it then took.
TEST_CASE("an allocation that waited on a gated state checks that the state still names its "
          "stream") {
  auto options = test_options();
  options.stream_checks = streampool::StreamChecks::none;
  HookedPool pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t h = fake.create_stream();
  Bytes::alloc_async(*pool, 4096, h).reset();  // h cached in this thread
  auto cp = std::make_shared<streampool::CapturePool>(*pool);
  cp->reserve((std::size_t{1} << 20));
  streampool::begin_capture_with_pool(cp, h, streampool::CaptureMode::relaxed);
  Bytes x;
  void* y_ptr = nullptr;
  cudaStream_t xs = nullptr;
  pool.device->after_next(FakeDevice::Call::end_capture, [&] {
    // CUDA has ended the capture; h's state is still gated (unbind has not run).
    pool.device->after_next(FakeDevice::Call::capture_info, [&] {
      // Inside x's allocation: it saw h gated, unlocked, asked the status (not capturing).
      // Another thread releases h, and a new stream gets h's old state.
      pool->release_stream(h);
      xs = fake.create_stream();
      auto y = Bytes::alloc_async(*pool, 4096, xs);
      fake.launch(xs, {{y.data(), y.byte_size(), true}});  // pending
      y_ptr = y.data();
    });  // y dropped on xs
    x = Bytes::alloc_async(*pool, 4096, h);
  });
  auto graph = streampool::end_capture_with_pool(h, cp);
  REQUIRE(pool.device->fired() == 2);
  fake.launch(h, {{x.data(), x.byte_size(), true}});
  INFO(first_hazard(fake));
  CHECK(static_cast<void*>(x.data()) != y_ptr);
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

// Found in review (2026-12-05): release_stream read the event of the released stream's last
// fence under the state's lock, then waited on it with no lock held. Meanwhile another thread
// could learn that the fence completed and give its event back to the pool's idle events, and a
// drop on a third stream record its own fence with that event: release_stream then waited for the
// third stream's work, which its caller may not want to wait for (or may be about to make
// possible).
TEST_CASE("release_stream waits for its own stream's work, not for the work of a stream that got "
          "the event of its last fence") {
  auto options = one_block_slabs();
  options.fence_every_free = true;  // every drop records a fence, from the idle events
  HookedPool pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  cudaStream_t c = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 4096, a);
    write_on(fake, a, x);
  }  // fenced at the drop; the fence is pending behind the write
  REQUIRE(pool->stats().fences_recorded == 1);

  std::size_t pending_on_c = 0;
  const auto another_thread = [&] {
    on_own_thread([&] {
      fake.complete(a);  // A's fence completes
      // B wants A's block, learns that A's fence completed, and so frees its event; then a
      // drop on C records a fence, taking that event, behind C's pending write (B's buffer
      // lives on meanwhile, so that its drop takes no event first).
      auto y = Bytes::alloc_async(*pool, 4096, b);
      auto z = Bytes::alloc_async(*pool, 8192, c);
      write_on(fake, c, z);
      z.reset();
      pending_on_c = fake.pending_work();
    }).get();
  };
  pool.device->before_next(Call::event_synchronize, another_thread);
  pool->release_stream(a);
  const bool waited_before = pool.device->fired() == 1;
  pool.device->run_unfired();
  REQUIRE(pool->stats().fences_recorded >= 2);
  REQUIRE(pending_on_c >= 1);
  CAPTURE(waited_before);
  CHECK(fake.pending_work() == pending_on_c);  // C's write is still pending
  fake.complete_all();
}

// Found in review (2026-12-05). release_stream waits for the released stream's work holding no
// lock. But its last fence is recorded by StreamRegistry::release -> empty_retired ->
// record_fence, under the registry mutex and the state's lock, and where no event could be had
// record_fence fell back to a stream synchronize right there: every other thread's lookup of a
// stream it has not cached (a new stream, a cache miss) then waited for the released stream's
// work. Work that needs such a thread to make progress (a kernel waiting for a flag the host sets
// after allocating) would deadlock.
TEST_CASE("release_stream where no event can be had for its fence waits for the stream holding "
          "no lock") {
  auto options = test_options();
  options.idle_ms = 0;
  HookedPool pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t c = fake.create_stream();
  {
    auto x = Bytes::alloc_async(*pool, 4096, a);
    write_on(fake, a, x);  // pending when release_stream waits
  }
  bool other_went_on = false;
  std::shared_future<void> other;
  pool.device->before_next(Call::stream_synchronize, [&] {
    // Another thread, meanwhile, allocates on a stream of its own, unrelated to `a`.
    other = on_own_thread([&] { Bytes::alloc_async(*pool, 4096, c).reset(); },
                          std::chrono::milliseconds(1000));
    other_went_on = other.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
  fake.fail_next(Call::event_create);  // no event for release_stream's fence
  pool->release_stream(a);
  REQUIRE(pool.device->fired() == 1);
  other.get();
  CHECK(other_went_on);
  fake.complete_all();
}

namespace {
// A pool that retires nothing for being idle, and its first stream, on which 64 MiB were written
// and dropped (the only stream so far: no fence at the drop), the write still pending.
cudaStream_t sixty_four_mib_dropped(PoolOnFake& pool) {
  cudaStream_t a = pool.fake().create_stream();
  auto x = Bytes::alloc_async(*pool, 64 * MiB, a);
  write_on(pool.fake(), a, x);
  return a;
}
streampool::PoolOptions without_idle_retirement() {
  auto options = test_options();
  options.idle_ms = 0;
  return options;
}
}  // namespace

// Found in review (2026-12-05). Where no event can be had for a released stream's last fence,
// empty_retired now gives it a virtual fence, and counts what was dropped on it since its last
// fence as stranded (note_stranded) and the stream as lost (lost_streams_), as for a stream that
// nothing can fence any more. But release_stream then waits for the stream and completes that
// fence: nothing is stranded, yet the counts stay, and the next slow path of any stream
// (reclaim_if_stranded) synchronizes the whole device for memory that is already clean. Before
// the commit the stream synchronize made the fence in empty_retired and nothing was counted.
TEST_CASE("release_stream that waited for its stream itself leaves nothing counted as stranded") {
  PoolOnFake pool(without_idle_retirement());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = sixty_four_mib_dropped(pool);
  fake.fail_next(Call::event_create);  // no event for release_stream's fence
  pool->release_stream(a);
  REQUIRE(fake.pending_work() == 0);  // release_stream waited for a: its blocks are clean
  const auto syncs = fake.calls(Call::device_synchronize);
  cudaStream_t b = fake.create_stream();
  auto y = Bytes::alloc_async(*pool, 4096, b);  // a slow path: reclaim_if_stranded
  CHECK(fake.calls(Call::device_synchronize) == syncs);
  fake.complete_all();
}

// Found in review (noted 2026-12-05). synchronize_and_reclaim zeroed the stranded bytes and the
// lost streams before its device synchronize, so a synchronize that failed left the stranded
// memory uncounted: no later slow path synchronized for it, and it stayed out of reach until
// some other stream's drops stranded as much again.
TEST_CASE("a device synchronize that failed leaves the stranded memory counted") {
  PoolOnFake pool(without_idle_retirement());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = sixty_four_mib_dropped(pool);
  // No event for the last fence and no waiting for the stream: its 64 MiB are stranded.
  fake.fail_next(Call::event_create);
  fake.fail_next(Call::stream_synchronize);
  pool->release_stream(a);
  REQUIRE(fake.pending_work() != 0);
  const auto syncs = fake.calls(Call::device_synchronize);
  fake.fail_next(Call::device_synchronize);
  cudaStream_t b = fake.create_stream();
  auto y = Bytes::alloc_async(*pool, 4096, b);  // a slow path: tries to reclaim, and fails
  REQUIRE(fake.calls(Call::device_synchronize) == syncs + 1);
  cudaStream_t c = fake.create_stream();
  auto z = Bytes::alloc_async(*pool, 4096, c);  // the next slow path tries again
  CHECK(fake.calls(Call::device_synchronize) == syncs + 2);
  fake.complete_all();
}

// Found in review (2026-12-05) of ede7375, which keeps the stranded memory counted after a device
// synchronize that failed, so that the next slow path tries again: a failed synchronize leaves
// a virtual fence on every stream, which only a device synchronize completes, and each stream's
// later fences complete in order behind it. With nothing stranded (a trim, or the out-of-memory
// ladder, whose synchronize failed), no slow path tried again: no block dropped on any stream
// since reached another stream, however long its own fence had completed.
TEST_CASE("after a device synchronize that failed, blocks fenced since reach other streams") {
  auto options = one_block_slabs();
  options.fence_every_free = true;
  options.idle_ms = 0;
  PoolOnFake pool(options);
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();
  // Both streams seen, with nothing of the small size on either list.
  Bytes::alloc_async(*pool, 100000, a).reset();
  Bytes::alloc_async(*pool, 100000, b).reset();
  fake.complete_all();
  fake.fail_next(Call::device_synchronize);
  const auto syncs = fake.calls(Call::device_synchronize);
  pool->trim(std::size_t{1} << 40);  // synchronizes (and fails), keeps the memory
  REQUIRE(fake.calls(Call::device_synchronize) == syncs + 1);
  void* dropped = nullptr;
  {
    auto x = Bytes::alloc_async(*pool, 4096, a);
    write_on(fake, a, x);
    dropped = x.data();
  }  // fenced (an event) at once: fence_every_free
  fake.complete(a);  // the fence completed
  auto handed = Bytes::alloc_async(*pool, 4096, b);
  CHECK(static_cast<void*>(handed.data()) == dropped);
  write_on(fake, b, handed);
  CHECK(fake.hazards().empty());
  fake.complete_all();
}

namespace {

// A pool (PoolOnFake or HookedPool) whose device synchronizes all fail from now on, after a trim
// that tried one: the next slow path of any stream may retry it.
template <class Pool>
void fail_every_synchronize(Pool& pool) {
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  Bytes::alloc_async(*pool, 4096, a).reset();
  fake.complete_all();
  fake.fail_next(Call::device_synchronize, 100000);
  const auto syncs = fake.calls(Call::device_synchronize);
  pool->trim(std::size_t{1} << 40);  // fails
  REQUIRE(fake.calls(Call::device_synchronize) > syncs);
}

streampool::PoolOptions never_idle() {
  auto options = one_block_slabs();
  options.idle_ms = 0;
  return options;
}

}  // namespace

// Found in review (2026-12-05): after a device synchronize that failed, every slow path of every
// stream tried again, each time sweeping every stream's lock and leaving another virtual fence on
// each, which only a successful synchronize clears: under an error CUDA keeps returning, the
// fences and the sweeps grew with every slow path. The first retry is still at the next slow
// path; later ones wait twice as long each time (1 ms, 2 ms, ... up to a second).
TEST_CASE("a device synchronize that keeps failing is retried ever less often") {
  PoolOnFake pool(never_idle());
  FakeDevice& fake = pool.fake();
  fail_every_synchronize(pool);
  const auto after_trim = fake.calls(Call::device_synchronize);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 300; ++i) {
    cudaStream_t s = fake.create_stream();  // a first allocation: a slow path
    Bytes::alloc_async(*pool, 4096, s).reset();
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  // The first retry at once, then one after each doubling wait: about log2 of the loop's
  // milliseconds more.
  const auto retries = fake.calls(Call::device_synchronize) - after_trim;
  CHECK(retries >= 1);
  CHECK(static_cast<double>(retries) <= 3 + std::log2(static_cast<double>(ms) + 1));
  fake.fail_next(Call::device_synchronize, 0);
  fake.complete_all();
}

// Found in review (2026-12-05): the retry was found due before the reclaimer's mutex and not
// asked again once a thread had it, so every thread that found it due while one retry ran (the
// synchronize, here 50 ms) tried again after it, each sweeping every stream and synchronizing.
TEST_CASE("threads that find a retry of a failed synchronize due together make one retry") {
  HookedPool pool(never_idle());
  FakeDevice& fake = pool.fake();
  fail_every_synchronize(pool);  // the next slow path retries at once
  const auto after_trim = fake.calls(Call::device_synchronize);
  std::promise<void> retrying;
  pool.device->before_next(Call::device_synchronize, [&] {
    retrying.set_value();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  constexpr int threads = 7;
  std::vector<cudaStream_t> streams;
  for (int i = 0; i <= threads; ++i) streams.push_back(fake.create_stream());
  std::thread first([&] { Bytes::alloc_async(*pool, 4096, streams[0]).reset(); });
  retrying.get_future().wait();  // the first retry has begun, and takes 50 ms
  std::vector<std::thread> others;
  for (int i = 1; i <= threads; ++i) {
    others.emplace_back([&, i] { Bytes::alloc_async(*pool, 4096, streams[i]).reset(); });
  }
  first.join();
  for (auto& t : others) t.join();
  // The first retry; the others found it due, waited for it, and then found the next one a
  // millisecond off. A thread that reaches the mutex later than the wait makes the next retry,
  // which doubles it (1, 2, 4, 8 ms): under ThreadSanitizer on a loaded 2-core machine 4 were
  // seen. Before the fix every thread made one: 8.
  CHECK(fake.calls(Call::device_synchronize) - after_trim <= 5);
  fake.fail_next(Call::device_synchronize, 0);
  fake.complete_all();
}
