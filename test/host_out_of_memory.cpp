// When host memory runs out: the pool's own bookkeeping (a segment, its ranges) cannot be had at
// the moment it is needed. An executable of its own, because it replaces the program's global
// operator new (and delete) with one that a test can make fail once.
#include "../lib/pool/large_tier.hpp"  // sizeof(Segment): the allocation made to fail
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/reserved_limit.hpp>
#include <streampool/stream_ops.hpp>
#include <streampool/trace_recorder.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using streampool::FakeDevice;
using streampool::MemoryPool;
using Call = FakeDevice::Call;
using Bytes = streampool::PooledBuffer<std::byte>;

namespace {
constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Armed with a size, the next operator new of that many bytes on this thread throws
// std::bad_alloc; armed with a count n, the n-th operator new from now on this thread, outside a
// device call (in_device), throws, and with fail_onward every one after it too (memory has run
// out); unarmed (0), operator new is malloc's.
thread_local std::size_t fail_next_of = 0;
thread_local long fail_countdown = 0;
thread_local bool fail_onward = false;
thread_local long failures = 0;  // allocations the countdown failed
thread_local int in_device = 0;

// The n-th host allocation of this thread from now fails, and with `onward` every one after it,
// for as long as it lives.
struct HostMemoryRunsOut {
  HostMemoryRunsOut(long n, bool onward) noexcept {
    fail_countdown = n;
    fail_onward = onward;
  }
  ~HostMemoryRunsOut() {
    fail_onward = false;
    fail_countdown = 0;
  }
  HostMemoryRunsOut(const HostMemoryRunsOut&) = delete;
  HostMemoryRunsOut& operator=(const HostMemoryRunsOut&) = delete;
};

// Runs run(n) for n = 1, 2, ... (below `most`), each run arming fail_countdown with its n, until
// one in which nothing failed: it made fewer than n host allocations from where it armed, so each
// of them has failed in turn. More than `at_least` runs must have been made (a sweep that stopped
// at once tested nothing).
template <class Run>
void each_in_turn(long most, long at_least, Run run) {
  long n = 1;
  for (; n < most; ++n) {
    CAPTURE(n);
    failures = 0;
    run(n);
    if (failures == 0) break;
  }
  CHECK(n > at_least);
}

std::int64_t reserved(MemoryPool& pool) { return pool.stats().reserved_bytes.current; }

// The library's next safe point: a dead pool kept for a later attempt is destroyed there.
void safe_point(const std::shared_ptr<FakeDevice>& device) { MemoryPool next(device, test_options()); }
}  // namespace

// Not inlined: GCC otherwise pairs the inlined malloc with the operator delete below and warns
// (-Wmismatched-new-delete). The deletes are replaced too, so that a sanitizer's own operator
// delete never sees memory its operator new did not give.
[[gnu::noinline]] void* operator new(std::size_t bytes) {
  if (fail_next_of != 0 && bytes == fail_next_of) {
    fail_next_of = 0;
    throw std::bad_alloc();
  }
  if (in_device == 0 && fail_countdown > 0 && --fail_countdown == 0) {
    if (fail_onward) fail_countdown = 1;  // the next one fails too
    ++failures;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(bytes != 0 ? bytes : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The other forms that come to malloc and free in the C++ library, replaced as well: under
// AddressSanitizer, whose own forms would otherwise allocate what the ones above free (an
// alloc-dealloc mismatch). The aligned forms are left to the library: new and delete alike.
[[gnu::noinline]] void* operator new[](std::size_t bytes) { return ::operator new(bytes); }
[[gnu::noinline]] void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(bytes);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
[[gnu::noinline]] void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
  return ::operator new(bytes, std::nothrow);
}
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

// Found in review (2026-12-05): a growth took the device memory first and only then the host
// memory of its bookkeeping (the segment, its first range); where that failed, it gave the
// device memory back with one cudaFree (cuMemAddressFree for a reservation) whose answer it
// ignored, so a refusal leaked the memory unknown to the pool: not counted reserved, never tried
// again. Now the bookkeeping is taken before the device call.
TEST_CASE("a growth whose bookkeeping finds no host memory keeps no device memory the pool does "
          "not count") {
  // The failed growth is an out-of-memory error inside the allocation, whose ladder tries again
  // (with host memory by then): the allocation succeeds, and what must not be is device memory
  // beyond what the pool counts reserved, nor any left once the pool is gone.
  SECTION("a cudaMalloc segment") {
    std::shared_ptr<FakeDevice> device;
    {
      HookedPool pool(test_options());  // fixed segments
      device = pool.fake_device;
      FakeDevice& fake = pool.fake();
      cudaStream_t a = fake.create_stream();
      fake.fail_next(Call::free, 1);  // a give-back of the new segment, where one is made, refused
      fail_next_of = sizeof(streampool::detail::Segment);
      std::error_code error;
      auto x = Bytes::try_alloc_async(*pool, 4 * MiB, a, error);
      CHECK(!error);
      fail_next_of = 0;
      fake.fail_next(Call::free, 0);
      CHECK(reserved(*pool) == static_cast<std::int64_t>(fake.live_bytes()));
    }
    safe_point(device);
    CHECK(device->live_allocations() == 0);
    CHECK(device->live_bytes() == 0);
  }
  SECTION("a reservation of addresses") {
    auto options = test_options();
    options.expandable_segments = true;
    options.large_rounding = 128 * KiB;
    std::shared_ptr<FakeDevice> device;
    {
      HookedPool pool(options);
      device = pool.fake_device;
      FakeDevice& fake = pool.fake();
      cudaStream_t a = fake.create_stream();
      fake.fail_next(Call::vm_unreserve, 1);
      fail_next_of = sizeof(streampool::detail::Segment);
      std::error_code error;
      auto x = Bytes::try_alloc_async(*pool, 4 * MiB, a, error);
      CHECK(!error);
      fail_next_of = 0;
      fake.fail_next(Call::vm_unreserve, 0);
      CHECK(reserved(*pool) == static_cast<std::int64_t>(fake.live_bytes()));
      x.reset();
      pool->trim(0);
      CHECK(fake.live_reservations() == 0);  // trim gives back every empty reservation it has
    }
    safe_point(device);
    CHECK(device->live_reservations() == 0);
    CHECK(device->live_bytes() == 0);
  }
}

// Found while failing each host allocation in turn (2026-12-05): the record of the threads that
// use the stream locks (biased_lock.cpp) was made on the heap at the first lock of the process,
// in a function that may not throw: out of host memory there, the process ended
// (std::terminate). It is made in static storage now. The record is 48 bytes on glibc (a mutex
// and a pointer); CTest runs each test case in a process of its own, so the first allocation of
// that size after the pool is made was the record's (now another one of that size fails, which
// the pool answers as out of memory or goes on without).
TEST_CASE("the first stream lock of the process needs no host memory") {
  auto device = std::make_shared<FakeDevice>();
  MemoryPool pool(device, test_options());
  cudaStream_t a = device->create_stream();
  fail_next_of = 48;
  std::error_code error;
  auto x = Bytes::try_alloc_async(pool, 4 * KiB, a, error);
  const bool failed_on_time = fail_next_of == 0;
  fail_next_of = 0;
  CAPTURE(failed_on_time);
  CHECK((error ? x.is_empty() : !x.is_empty()));  // still here: no terminate
}

namespace streampool {  // where the seam's list (device_calls.def) names its types
// The fake device's own bookkeeping is a test double's, not the pool's: its calls are made with
// host memory to spare, so that what fails is always the pool's (or the test's) allocation.
struct DeviceWithMemory : streampool::ForwardingDevice {
  using ForwardingDevice::ForwardingDevice;
  struct Inside {
    Inside() noexcept { ++in_device; }
    ~Inside() { --in_device; }
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;
  };
#define STREAMPOOL_DEVICE_CALL(name, params, args) \
  cudaError_t name params noexcept override {      \
    Inside inside;                                 \
    return ForwardingDevice::name args;            \
  }
#define STREAMPOOL_DEVICE_NOTE(name, params, args) \
  void name params noexcept override {             \
    Inside inside;                                 \
    ForwardingDevice::name args;                   \
  }
#include <streampool/device_calls.def>
};
}  // namespace streampool

using streampool::DeviceWithMemory;

// Found by failing each host allocation of a pool's life in turn (2026-12-05): a CapturePool made
// its binding, which holds the pool's core, before the pool's capture gate; where the gate found
// no host memory, the constructor threw, the destructor that lets the core go never ran, and the
// pool and its device memory were never freed. Each allocation of the construction fails in
// turn here.
TEST_CASE("a CapturePool whose construction finds no host memory lets its pool go") {
  each_in_turn(100, 1, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t a = fake->create_stream();
      { auto x = Bytes::alloc_async(pool, 4 * KiB, a); }  // the pool holds device memory
      fail_countdown = n;
      try {
        streampool::CapturePool capture_pool(pool);
      } catch (const std::bad_alloc&) {
      }
      fail_countdown = 0;
      fake->complete_all();
    }
    CHECK(fake->live_bytes() == 0);
  });
}

namespace {
// A pool's life: buffers of both tiers, record_stream, a raw allocation freed on another
// stream, stats, release_stream, trim; with `capture`, a CapturePool's capture too.
void a_pool_life(MemoryPool& pool, FakeDevice& fake, cudaStream_t a, cudaStream_t b,
                 bool capture) {
  std::vector<Bytes> buffers;
  for (int i = 0; i < 6; ++i) {
    buffers.push_back(Bytes::alloc_async(pool, i % 2 == 0 ? 4 * KiB : 3 * MiB, a));
    DeviceWithMemory::Inside inside;
    fake.launch(a, {{buffers.back().data(), buffers.back().byte_size(), true}});
  }
  buffers[0].record_stream(b);
  buffers[1].record_stream(b);
  if (capture) {
    auto capture_pool = std::make_shared<streampool::CapturePool>(pool);
    capture_pool->reserve(64 * KiB);  // fixed segments: no growth during the capture
    cudaStream_t c = nullptr;
    {
      DeviceWithMemory::Inside inside;
      c = fake.create_stream("captured");
    }
    streampool::begin_capture_with_pool(capture_pool, c);
    auto in_graph = Bytes::alloc_async(pool, 8 * KiB, c);
    auto graph = streampool::end_capture_with_pool(c, capture_pool);
  }
  buffers.clear();
  void* raw = pool.allocate(MiB, a);
  pool.deallocate(raw, MiB, b);
  (void)pool.stats();
  (void)pool.breakdown();
  pool.release_stream(b);
  pool.trim();
}
}  // namespace

// A pool's whole life with each host allocation failing in turn (2026-12-05): at level-2 checks
// the arena's consistency check failed where a free range found no host memory for its index
// entry (left unindexed, lost to reuse until it merges or its segment goes, as designed; the
// check did not know such ranges). The arena now counts them, and the check with them.
//
// Every host allocation of a pool's life failing in turn: each failure is an exception (out of
// memory) from the call that made it, or is absorbed; never the end of the process, a block
// reaching a stream early, or device memory left after the pool.
TEST_CASE("each host allocation of a pool's life failing in turn ends no process, races nothing "
          "and leaks no device memory") {
  const bool expandable = GENERATE(false, true);
  const bool capture = GENERATE(false, true);
  CAPTURE(expandable, capture);
  each_in_turn(5000, 10, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    auto options = test_options();
    options.expandable_segments = expandable;
    {
      auto pool = std::make_unique<MemoryPool>(std::make_shared<DeviceWithMemory>(fake), options);
      cudaStream_t a = fake->create_stream("a");
      cudaStream_t b = fake->create_stream("b");
      fail_countdown = n;
      try {
        a_pool_life(*pool, *fake, a, b, capture);
      } catch (const std::bad_alloc&) {
      } catch (const streampool::Error& e) {
        CHECK(e.errc() == streampool::Errc::out_of_memory);
      }
      fail_countdown = 0;
      fake->complete_all();
    }
    INFO(first_hazard(*fake));
    CHECK(fake->hazards().empty());
    CHECK(fake->live_bytes() == 0);
  });
}

// Found in review (2026-12-05): ReservedLimit recorded a device allocation's size after the
// device call; where that record found no host memory, it freed the allocation again and ignored
// the answer, so a refused free left device memory that neither the caller (told the allocation
// failed) nor the limit counted. Now the record is made before the device call, which then has
// nothing left to fail after it.
TEST_CASE("a reserved-memory limit whose record finds no host memory leaves no device memory "
          "it does not count") {
  const bool physical = GENERATE(false, true);  // malloc, or vm_create
  CAPTURE(physical);
  constexpr std::size_t bytes = 4 * MiB;
  each_in_turn(50, 1, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    streampool::ReservedLimit limit(std::make_shared<DeviceWithMemory>(fake), bytes);
    fake->fail_next(physical ? Call::vm_release : Call::free, 1);  // a give-back is refused
    void* ptr = nullptr;
    streampool::VmHandle handle = 0;
    fail_countdown = n;
    const cudaError_t status =
        physical ? limit.vm_create(&handle, bytes) : limit.malloc(&ptr, bytes);
    fail_countdown = 0;
    fake->fail_next(physical ? Call::vm_release : Call::free, 0);
    if (status == cudaSuccess) {
      CHECK(fake->live_bytes() == bytes);
      CHECK((physical ? limit.vm_release(handle) : limit.free(ptr)) == cudaSuccess);
    } else {
      CHECK(status == cudaErrorMemoryAllocation);
      CHECK(fake->live_bytes() == 0);  // the caller has nothing to free
    }
    CHECK(fake->live_bytes() == 0);
    // The limit counts nothing: the whole of it can be taken again.
    CHECK((physical ? limit.vm_create(&handle, bytes) : limit.malloc(&ptr, bytes)) ==
          cudaSuccess);
    CHECK((physical ? limit.vm_release(handle) : limit.free(ptr)) == cudaSuccess);
  });
}

// Found in review (2026-12-05): the trace recorder's calls from the pool may not throw
// (observer.hpp). Out of host memory for an allocation's record the recorder stops, as
// documented; but the message it stopped with was built (a std::string, the argument of its
// fail()) inside the bad_alloc handler of a noexcept function, so where that allocation failed
// too, the process ended (std::terminate). Here the n-th host allocation of a pair fails, and the
// first of the message's size after it.
TEST_CASE("a recording that runs out of host memory stops, and the process goes on") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("streampool_host_memory." + std::to_string(::getpid()) + ".csv"))
                               .string();
  bool stopped = false;
  for (long n = 1; n <= 8; ++n) {
    CAPTURE(n);
    auto fake = std::make_shared<FakeDevice>();
    auto options = test_options();
    options.trace_file = path;
    MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), options);
    cudaStream_t a = fake->create_stream();
    { auto x = Bytes::alloc_async(pool, 4 * KiB, a); }  // the stream, thread and slab are known
    fail_countdown = n;
    fail_next_of = sizeof("no memory to record an allocation");  // the message's size
    {
      std::error_code error;
      auto x = Bytes::try_alloc_async(pool, 4 * KiB, a, error);
    }
    fail_countdown = 0;
    fail_next_of = 0;
    const streampool::TraceStatus status = streampool::trace_status(pool);
    if (!status.error_message.empty()) {
      stopped = true;
      CHECK(!status.recording);
      CHECK(status.error_message.find("the recording stopped") != std::string::npos);
    }
    auto after = Bytes::alloc_async(pool, 4 * KiB, a);  // the pool goes on
    CHECK(after.data() != nullptr);
  }
  CHECK(stopped);  // some n failed the recorder's own allocation
  std::remove(path.c_str());
}

// Found in review (2026-12-05): CaptureBinding::insert_piece grew its free neighbour before it
// copied the needs into it; where that copy found no host memory, the neighbour covered the
// dropped piece without its needs, and a later capture was handed the piece while the work of its
// last use was pending. Each host allocation of the piece's drop fails in turn.
TEST_CASE("a private piece whose drop finds no host memory is not reused before its pending "
          "uses") {
  each_in_turn(100, 1, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t s = fake->create_stream("captured");
      cudaStream_t y = fake->create_stream("user");
      cudaStream_t w = fake->create_stream("replay");
      auto capture = std::make_shared<streampool::CapturePool>(pool);
      capture->reserve(MiB);
      std::optional<Bytes> q, p, z;
      streampool::begin_capture_with_pool(capture, s);
      q.emplace(Bytes::alloc_async(pool, 4 * KiB, s));
      p.emplace(Bytes::alloc_async(pool, 4 * KiB, s));
      z.emplace(Bytes::alloc_async(pool, 4 * KiB, s));  // keeps P apart from the free remainder
      auto g1 = streampool::end_capture_with_pool(s, capture);
      REQUIRE(static_cast<std::byte*>(p->data()) == static_cast<std::byte*>(q->data()) + 4 * KiB);
      std::byte* const p_ptr = static_cast<std::byte*>(p->data());

      q.reset();  // free before P, with S's fence as its need
      p->record_stream(y);
      fake->launch(y, {{p->data(), p->byte_size(), true}}, {}, "user write of P");  // pending
      fail_countdown = n;
      p.reset();  // P's needs: S's and Y's fences
      fail_countdown = 0;
      fake->complete(s);  // S's fence completes; Y's write is still pending

      streampool::begin_capture_with_pool(capture, s);
      std::error_code error;
      std::optional<Bytes> r(Bytes::try_alloc_async(pool, 8 * KiB, s, error));
      if (!r->is_empty()) fake->launch(s, {{r->data(), r->byte_size(), true}}, {}, "graph write");
      auto g2 = streampool::end_capture_with_pool(s, capture);
      auto* const r_ptr = static_cast<std::byte*>(r->data());
      CHECK((r->is_empty() || r_ptr >= p_ptr + 4 * KiB || r_ptr + r->byte_size() <= p_ptr));
      g2.launch(w);
      INFO(first_hazard(*fake));
      CHECK(fake->hazards().empty());
      fake->complete_all();
      r.reset();
      z.reset();
    }
  });
}

// Found in review (2026-12-05): a shared block adopted by a capture whose uses could not be
// listed (no host memory for their needs) was marked "never covered" only after it was filed;
// where the mark found no host memory either, the block went back to the pool with no need when
// the CapturePool went, while another stream's write to it was pending. Memory runs out from the
// n-th host allocation of the drop on; earlier adoptions leave the list of adopted blocks room.
TEST_CASE("a block adopted by a capture when host memory has run out is not reused before its "
          "other stream's work") {
  each_in_turn(100, 1, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t s = fake->create_stream("captured");
      cudaStream_t y = fake->create_stream("other");
      cudaStream_t z = fake->create_stream("later");
      std::vector<Bytes> earlier;
      for (int i = 0; i < 3; ++i) earlier.push_back(Bytes::alloc_async(pool, 4 * KiB, s));
      std::optional<Bytes> b(Bytes::alloc_async(pool, 4 * KiB, s));
      b->record_stream(y);
      {
        DeviceWithMemory::Inside inside;
        fake->launch(y, {{b->data(), b->byte_size(), true}}, {}, "pending write on y");
      }
      std::byte* const b_ptr = static_cast<std::byte*>(b->data());
      {
        auto capture_pool = std::make_shared<streampool::CapturePool>(pool);
        capture_pool->reserve(64 * KiB);
        streampool::begin_capture_with_pool(capture_pool, s);
        earlier.clear();  // three adoptions: the list has room for a fourth
        fail_countdown = n;
        fail_onward = true;
        b.reset();  // adopted: used on s before the capture, and on y
        fail_onward = false;
        fail_countdown = 0;
        streampool::end_capture_with_pool(s, capture_pool);  // the graph goes at once
      }
      streampool::complete_graph_releases();  // the CapturePool goes: its adopted blocks too
      for (int i = 0; i < 8; ++i) {
        auto later = Bytes::alloc_async(pool, 4 * KiB, z);
        DeviceWithMemory::Inside inside;
        fake->launch(z, {{later.data(), later.byte_size(), true}}, {}, "write on z");
        if (static_cast<std::byte*>(later.data()) == b_ptr) break;
      }
      INFO(first_hazard(*fake));
      CHECK(fake->hazards().empty());
      fake->complete_all();
    }
  });
}

// Found in review (2026-12-05): end_capture_with_pool made the graph's reference to its
// CapturePool after the capture ended; where that found no host memory, the ended graph was never
// destroyed. Each host allocation of the end fails in turn.
TEST_CASE("an end of a capture that finds no host memory leaves no graph behind") {
  each_in_turn(100, 1, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t s = fake->create_stream("captured");
      auto capture_pool = std::make_shared<streampool::CapturePool>(pool);
      capture_pool->reserve(64 * KiB);
      streampool::begin_capture_with_pool(capture_pool, s);
      { auto x = Bytes::alloc_async(pool, 4 * KiB, s); }
      std::optional<streampool::CapturedGraph> graph;
      fail_countdown = n;
      try {
        graph.emplace(streampool::end_capture_with_pool(s, capture_pool));
      } catch (const std::bad_alloc&) {
      }
      fail_countdown = 0;
      graph.reset();
      capture_pool.reset();
      streampool::complete_graph_releases();
      CHECK(fake->live_graphs() == 0);
      streampool::CaptureStatus status = streampool::CaptureStatus::active;
      CHECK(fake->capture_info(s, &status, nullptr) == cudaSuccess);
      CHECK(status == streampool::CaptureStatus::none);
    }
  });
}


// Found in review (2026-12-06), the pattern of the fix above where it was not applied: stop_trace
// is noexcept and returns the recording's status by value, a copy of its path and message made
// inside the noexcept call; and close_file, noexcept too, builds the message of a failed close with
// no try. Where that host memory runs out, the process ends (std::terminate). Here the n-th host
// allocation of stop_trace fails, for n = 1, 2, ...
TEST_CASE("a stop of a recording that finds no host memory ends no process") {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("streampool_host_memory_stop_with_a_long_name." + std::to_string(::getpid()) + ".csv"))
          .string();
  for (long n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto fake = std::make_shared<FakeDevice>();
    MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
    streampool::start_trace(pool, path);
    { auto x = Bytes::alloc_async(pool, 4 * KiB, fake->create_stream()); }
    fail_countdown = n;
    const streampool::TraceStatus status = streampool::stop_trace(pool);
    fail_countdown = 0;
    CHECK(!streampool::trace_status(pool).recording);
    (void)status;
  }
  std::remove(path.c_str());
}

// The same in close_file: a close that fails (its descriptor closed behind the recorder's back:
// EBADF) builds its message with no host memory.
TEST_CASE("a recording whose close fails with no host memory for the message ends no process") {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("streampool_host_memory_close." + std::to_string(::getpid()) + ".csv"))
          .string();
  auto fake = std::make_shared<FakeDevice>();
  MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
  streampool::start_trace(pool, path);
  streampool::flush_trace(pool);
  int closed = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const auto target = std::filesystem::read_symlink(entry.path(), error);
    if (!error && target == std::filesystem::path(path)) {
      ::close(std::stoi(entry.path().filename().string()));
      ++closed;
    }
  }
  REQUIRE(closed == 1);
  fail_countdown = 1;  // the close's message
  (void)streampool::stop_trace(pool);
  fail_countdown = 0;
  CHECK(!streampool::trace_status(pool).recording);
  std::remove(path.c_str());
}

// Found in review (2026-12-06): retiring a stream moved its free blocks into a vector; where that
// found no host memory, the blocks stayed on the retired state's lists, counted as none, reachable
// by no stream (and no trim) until the state was recycled. Each host allocation of a
// release_stream fails in turn; then every block must still reach the device at a trim.
TEST_CASE("a stream released when host memory runs out leaves no block out of reach") {
  each_in_turn(100, 1, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t b = fake->create_stream();
      {
        std::vector<Bytes> buffers;
        for (int i = 0; i < 3; ++i) buffers.push_back(Bytes::alloc_async(pool, 4 * KiB, b));
      }  // three free blocks on b's lists
      fail_countdown = n;
      try {
        pool.release_stream(b);
      } catch (const std::bad_alloc&) {
      }
      fail_countdown = 0;
      fake->complete_all();
      pool.trim(0);
      CHECK(fake->live_bytes() == 0);
    }
  });
}

// Found in review (2026-12-06), each failing without its fix: a drop whose uses are on two streams,
// each host allocation of the drop failing in turn (and, with fail_onward, every one after it):
// every block must still reach the device at a trim (none lost to reuse for good).
TEST_CASE("a drop with a recorded use when host memory runs out leaves no block out of reach") {
  for (const std::size_t bytes : {4 * KiB, 4 * MiB}) {
    for (const bool onward : {false, true}) {
      each_in_turn(100, 1, [&](long n) {
        CAPTURE(bytes, onward);
        auto fake = std::make_shared<FakeDevice>();
        {
          MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
          cudaStream_t a = fake->create_stream();
          cudaStream_t b = fake->create_stream();
          {
            Bytes x = Bytes::alloc_async(pool, bytes, a);
            x.record_stream(b);
            const HostMemoryRunsOut out(n, onward);
            x.reset();
          }
          fake->complete_all();
          pool.trim(0);
          CHECK(fake->live_bytes() == 0);
        }
      });
    }
  }
}

// Found in review (2026-12-06): release_stream of a stream whose shelf holds ranges, each host
// allocation failing in turn: every range must still reach the device at a trim.
TEST_CASE("a stream with shelved ranges released when host memory runs out leaves none out of "
          "reach") {
  each_in_turn(100, 1, [&](long n) {
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t b = fake->create_stream();
      {
        std::vector<Bytes> buffers;
        for (int i = 0; i < 2; ++i) buffers.push_back(Bytes::alloc_async(pool, 4 * MiB, b));
      }  // two ranges on b's shelf
      fail_countdown = n;
      try {
        pool.release_stream(b);
      } catch (const std::bad_alloc&) {
      }
      fail_countdown = 0;
      fake->complete_all();
      pool.trim(0);
      CHECK(fake->live_bytes() == 0);
    }
  });
}

// A block stranded while work of another stream that uses it is
// still pending is never handed out before that work completed.
TEST_CASE("a stranded block is not reused before the work that used it completed") {
  for (const std::size_t bytes : {4 * KiB, 4 * MiB}) {
    for (const bool onward : {false, true}) {
      each_in_turn(60, 1, [&](long n) {
        CAPTURE(bytes, onward);
        auto fake = std::make_shared<FakeDevice>();
        {
          MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
          cudaStream_t a = fake->create_stream();
          cudaStream_t b = fake->create_stream();
          cudaStream_t c = fake->create_stream();
          {
            Bytes x = Bytes::alloc_async(pool, bytes, a);
            x.record_stream(b);
            fake->launch(b, {streampool::writes(x.data(), bytes)});  // pending
            const HostMemoryRunsOut out(n, onward);
            x.reset();
          }
          {
            std::vector<Bytes> more;
            for (int i = 0; i < 8; ++i) {
              more.push_back(Bytes::alloc_async(pool, bytes, c));
              fake->launch(c, {streampool::writes(more.back().data(), bytes)});
            }
          }
          pool.trim(0);  // the stranded block comes back here (the fake completes everything)
          {
            Bytes y = Bytes::alloc_async(pool, bytes, c);
            fake->launch(c, {streampool::writes(y.data(), bytes)});
          }
          fake->complete_all();
          CHECK(fake->hazards().empty());
        }
      });
    }
  }
}

// Found in review (2026-12-06): a block dropped with a lost use (a device-timeline need), whose
// park finds no host memory, was counted stranded twice (settle, then strand): 10 MiB stranded
// passed the 16 MiB bound, and the next slow path synchronized the device for nothing.
TEST_CASE("a block stranded by its park is counted stranded once") {
  for (int k = 0; k < 34; ++k) {
    each_in_turn(40, 1, [&](long n) {
      CAPTURE(k);
      auto fake = std::make_shared<FakeDevice>();
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t a = fake->create_stream();
      cudaStream_t b = fake->create_stream();
      cudaStream_t c = fake->create_stream();
      for (int i = 0; i < k; ++i) {  // parked: uses on a and c, neither fence known complete
        Bytes y = Bytes::alloc_async(pool, 4 * KiB, a);
        y.record_stream(c);
      }
      Bytes x = Bytes::alloc_async(pool, 10 * MiB, a);
      x.record_stream(b);
      pool.release_stream(b);  // x's use on b is lost: only a device synchronize covers it
      fail_countdown = n;
      x.reset();
      fail_countdown = 0;
      const auto before = fake->calls(Call::device_synchronize);
      Bytes probe = Bytes::alloc_async(pool, 64 * KiB, a);  // a slow path: the stranded bound
      CHECK(fake->calls(Call::device_synchronize) == before);
    });
  }
}

// Found in review of the capture layer (2026-12-06): a CapturePool whose piece's uses could not be
// listed (no host memory for their needs), or whose binding could not list them as it went, kept
// its private ranges out of the MemoryPool for good; an adopted block whose uses could not be
// listed was parked with a need nothing covers, and one that could not be filed at all was held
// by nothing. None came back at a trim while the pool lived. Now each waits for a device
// synchronize (stranded), which covers every use it had once the binding is gone. The n-th host
// allocation from the drops on fails (and with `onward` every one after it, through the
// CapturePool's end).
TEST_CASE("a CapturePool that goes when host memory has run out leaves no memory out of reach") {
  const bool onward = GENERATE(false, true);
  each_in_turn(200, 1, [&](long n) {
    CAPTURE(onward);
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t s = fake->create_stream("captured");
      cudaStream_t y = fake->create_stream("other");
      try {
        std::optional<Bytes> shared(Bytes::alloc_async(pool, 4 * KiB, s));
        shared->record_stream(y);
        auto capture_pool = std::make_shared<streampool::CapturePool>(pool);
        capture_pool->reserve(MiB);
        streampool::begin_capture_with_pool(capture_pool, s);
        std::optional<Bytes> piece(Bytes::alloc_async(pool, 4 * KiB, s));
        const HostMemoryRunsOut out(n, onward);
        shared.reset();  // adopted
        {
          auto graph = streampool::end_capture_with_pool(s, capture_pool);
          DeviceWithMemory::Inside inside;
          graph.launch(s);
          fake->launch(s, {streampool::writes(piece->data(), piece->byte_size())}, {}, "later use");
        }
        piece.reset();  // a piece with a use on s after the capture
        capture_pool.reset();
        streampool::complete_graph_releases();
      } catch (const std::bad_alloc&) {
      }
      streampool::complete_graph_releases();
      fake->complete_all();
      pool.trim(0);
      CHECK(fake->live_bytes() == 0);
    }
  });
}

// A block stranded (its uses could not be listed) is in no part of the breakdown but its own
// until the synchronize that brings it back (2026-12-06: it was in none, so the parts of the
// reserved memory did not say where it was).
TEST_CASE("the breakdown counts stranded blocks until a synchronize brings them back") {
  for (const std::size_t bytes : {4 * KiB, 4 * MiB}) {
    CAPTURE(bytes);
    auto fake = std::make_shared<FakeDevice>();
    MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
    cudaStream_t a = fake->create_stream();
    cudaStream_t b = fake->create_stream();
    Bytes x = Bytes::alloc_async(pool, bytes, a);
    x.record_stream(b);
    {
      const HostMemoryRunsOut out(1, true);
      x.reset();  // no memory for the list of its uses' needs: stranded
    }
    streampool::PoolBreakdown parts = pool.breakdown();
    CHECK(parts.stranded_blocks == 1);
    CHECK(parts.stranded_bytes == static_cast<std::int64_t>(bytes));  // a size of its tier
    CHECK(parts.parked_blocks == 0);
    if (bytes >= MiB) {  // a range: the segment is that and the free rest
      CHECK(parts.stranded_bytes + parts.free_clean_bytes + parts.free_owned_bytes ==
            parts.segment_bytes);
    } else {  // a block: its slab is that and the free rest
      CHECK(parts.stranded_bytes + parts.small_cached_bytes + parts.small_depot_bytes ==
            parts.slab_bytes);
    }
    fake->complete_all();
    pool.trim(0);
    parts = pool.breakdown();
    CHECK(parts.stranded_blocks == 0);
    CHECK(parts.stranded_bytes == 0);
    CHECK(parts.segment_bytes == 0);
  }
}

// A growth finds what it may give back through the free-range indexes (LargeTier::unmappable):
// a range left out of them when host memory ran out must still be seen, as a walk sees it.
namespace {
// A node of a std::set<Block*>, the free-range indexes (libstdc++: a colour, three links, the
// value): the next allocation of this size is a range's entry in one of them.
constexpr std::size_t index_node_bytes = 40;

streampool::PoolOptions mapped_options() {
  auto options = test_options();
  options.expandable_segments = true;
  options.segment_bytes = 20 * MiB;
  options.large_rounding = 128 * KiB;
  options.large_shelf = 0;
  return options;
}
}  // namespace

// A covered whole mapping in a clean range left unindexed (index() found no host memory when the
// range moved to the clean index) is given back, not mapped beside.
TEST_CASE("give-back unmaps a covered mapping whose free range host memory left unindexed") {
  auto options = mapped_options();
  options.stream_homes = 0;
  auto fake = std::make_shared<FakeDevice>();
  MemoryPool pool(fake, options);
  cudaStream_t a = fake->create_stream("a");
  cudaStream_t b = fake->create_stream("b");
  auto other = Bytes::alloc_async(pool, 20 * MiB, b);
  auto left = Bytes::alloc_async(pool, 20 * MiB, a);
  auto middle = Bytes::alloc_async(pool, 20 * MiB, a);
  auto right = Bytes::alloc_async(pool, 20 * MiB, a);
  write_on(*fake, a, left);
  REQUIRE(reserved(pool) == static_cast<std::int64_t>(80 * MiB));
  left.reset();
  fake->complete(a);
  fail_next_of = index_node_bytes;  // left's entry in the clean index
  auto big = Bytes::alloc_async(pool, 30 * MiB, b);
  CHECK(fail_next_of == 0);
  CHECK(fake->calls(Call::vm_unmap) == 1);
  CHECK(reserved(pool) == static_cast<std::int64_t>(90 * MiB));  // not 110
  fake->complete_all();
}

// One stream, a pending whole mapping of its own in a free range left unindexed: the growth waits
// for the stream and gives it back (50 MiB reserved), rather than mapping beside it (70 MiB).
TEST_CASE("a growth waits for its own stream's range that host memory left unindexed") {
  auto fake = std::make_shared<FakeDevice>();
  MemoryPool pool(fake, mapped_options());
  cudaStream_t a = fake->create_stream("a");
  auto left = Bytes::alloc_async(pool, 20 * MiB, a);
  auto right = Bytes::alloc_async(pool, 20 * MiB, a);
  write_on(*fake, a, left);
  fail_next_of = index_node_bytes;  // left's entry in the owned index
  left.reset();
  CHECK(fail_next_of == 0);
  auto big = Bytes::alloc_async(pool, 30 * MiB, a);
  CHECK(pool.stats().growth_waits == 1);
  CHECK(fake->calls(Call::vm_unmap) == 1);
  CHECK(reserved(pool) == static_cast<std::int64_t>(50 * MiB));  // not 70
  fake->complete_all();
}
// Review (2026-12-07): a drop with ten capture candidates, each host allocation of the drop
// failing in turn (the ninth candidate's heap slot among them): every binding let go once.
TEST_CASE("a drop with more capture candidates than it keeps in place lets each go once when "
          "host memory runs out") {
  const bool onward = GENERATE(false, true);
  each_in_turn(200, 1, [&](long n) {
    CAPTURE(onward);
    auto fake = std::make_shared<FakeDevice>();
    {
      MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
      cudaStream_t home = fake->create_stream("home");
      std::optional<Bytes> x(Bytes::alloc_async(pool, 64 * KiB, home));
      std::vector<cudaStream_t> origins;
      std::vector<std::shared_ptr<streampool::CapturePool>> pools;
      for (int i = 0; i < 10; ++i) {
        origins.push_back(fake->create_stream());
        pools.push_back(std::make_shared<streampool::CapturePool>(pool));
        streampool::begin_capture_with_pool(pools.back(), origins.back(),
                                            streampool::CaptureMode::relaxed);
      }
      for (int i = 0; i < 10; ++i) {
        x->record_stream(origins[i]);
        DeviceWithMemory::Inside inside;
        fake->launch(origins[i], {{x->data(), x->byte_size(), false}}, {}, "reads x");
      }
      {
        const HostMemoryRunsOut out(n, onward);
        x.reset();
      }
      std::vector<streampool::CapturedGraph> graphs;
      for (int i = 0; i < 10; ++i) {
        graphs.push_back(streampool::end_capture_with_pool(origins[i], pools[i]));
      }
      pools.clear();
      graphs.clear();
      streampool::complete_graph_releases();
      fake->complete_all();
      pool.trim(0);
      CHECK(fake->live_bytes() == 0);
    }
    safe_point(fake);
    CHECK(fake->live_bytes() == 0);
    CHECK(fake->live_events() == 0);
  });
}

namespace {
// Does a trim on another thread synchronize the device (which CUDA refuses, invalidating it,
// during a global capture)?
bool trim_elsewhere_synchronizes(MemoryPool& pool, FakeDevice& fake) {
  const auto before = fake.calls(Call::device_synchronize);
  std::thread([&] { pool.trim(0); }).join();
  return fake.calls(Call::device_synchronize) > before;
}
}  // namespace

// Noticed 2026-12-07, fixed 2026-12-07 (the next session): a capture given up while CUDA still
// captured it (a detach before the caller's end) whose note found no host memory was counted
// over at once, as if its thread had exited: another thread's trim then synchronized the device
// during the global capture. Now the note's room is taken when the capture begins. (The room is
// the process's: in a process of its own, as ctest runs each test, the note is its first.)
TEST_CASE("a capture left under way when host memory has run out stays counted") {
  auto fake = std::make_shared<FakeDevice>();
  {
    MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
    cudaStream_t s = fake->create_stream("captured");
    { auto warm = Bytes::alloc_async(pool, MiB, fake->create_stream()); }
    auto capture = std::make_shared<streampool::CapturePool>(pool);
    streampool::begin_capture_with_pool(capture, s, streampool::CaptureMode::global);
    {
      const HostMemoryRunsOut out(1, true);
      streampool::detach_capture_with_pool(capture);  // before the end: left under way
    }
    CHECK_FALSE(trim_elsewhere_synchronizes(pool, *fake));
    streampool::CaptureStatus status = streampool::CaptureStatus::none;
    REQUIRE(fake->capture_info(s, &status, nullptr) == cudaSuccess);
    CHECK(status == streampool::CaptureStatus::active);
    cudaGraph_t graph = nullptr;
    REQUIRE(fake->end_capture(s, &graph) == cudaSuccess);
    REQUIRE(fake->graph_destroy(graph) == cudaSuccess);
    CHECK(trim_elsewhere_synchronizes(pool, *fake));  // seen ended by that thread's settle
    capture.reset();
    fake->complete_all();
  }
  CHECK(fake->live_bytes() == 0);
}

// Noticed as the fix above was made: a thread that exited with a per-thread capture left to it
// and no host memory at its exit kept the capture counted for the life of the process (its
// settle could not copy the list it settles): no thread's trim synchronized the device again.
TEST_CASE("a thread that exits when host memory has run out lets the per-thread captures left "
          "to it go") {
  auto fake = std::make_shared<FakeDevice>();
  {
    MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
    { auto warm = Bytes::alloc_async(pool, MiB, fake->create_stream()); }
    auto capture = std::make_shared<streampool::CapturePool>(pool);
    std::promise<void> begun;
    std::promise<void> dropped;
    std::thread capturing([&] {
      streampool::begin_capture_with_pool(capture, cudaStreamPerThread,
                                          streampool::CaptureMode::global);
      begun.set_value();
      dropped.get_future().wait();
      fail_countdown = 1;  // for the thread's exit: its thread_local objects' destructors
      fail_onward = true;
    });
    begun.get_future().wait();
    capture.reset();  // on another thread: its per-thread capture is left to it
    CHECK_FALSE(trim_elsewhere_synchronizes(pool, *fake));
    dropped.set_value();
    capturing.join();  // CUDA ends a thread's per-thread captures with it
    CHECK(trim_elsewhere_synchronizes(pool, *fake));
    fake->complete_all();
  }
  CHECK(fake->live_bytes() == 0);
}

// A begin that finds no host memory (its note's room, or a thread-local capture's count) counts
// nothing; and room for the notes of every capture under way was taken: four left with no host
// memory stay counted (review of the fix above, 2026-12-07).
TEST_CASE("a capture begin that runs out of host memory counts nothing and captures begun after "
          "it stay counted when left with no host memory") {
  const auto mode = GENERATE(streampool::CaptureMode::global, streampool::CaptureMode::thread_local_,
                             streampool::CaptureMode::relaxed);
  CAPTURE(static_cast<int>(mode));
  auto fake = std::make_shared<FakeDevice>();
  {
    MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
    { auto warm = Bytes::alloc_async(pool, MiB, fake->create_stream()); }
    std::vector<cudaStream_t> streams;
    std::vector<std::shared_ptr<streampool::CapturePool>> pools;
    for (int i = 0; i < 4; ++i) {
      streams.push_back(fake->create_stream("captured"));
      pools.push_back(std::make_shared<streampool::CapturePool>(pool));
    }
    long failed_begins = 0;
    for (int i = 0; i < 4; ++i) {
      for (long n = 1; n < 50; ++n) {
        failures = 0;
        bool threw = false;
        {
          const HostMemoryRunsOut out(n, false);
          try {
            streampool::begin_capture_with_pool(pools[i], streams[i], mode);
          } catch (const std::bad_alloc&) {
            threw = true;
          } catch (const streampool::Error& e) {
            CHECK(e.errc() == streampool::Errc::out_of_memory);
            threw = true;
          }
        }
        if (!threw) break;
        ++failed_begins;
        // Nothing of the failed begin is counted.
        streampool::CaptureStatus status = streampool::CaptureStatus::none;
        REQUIRE(fake->capture_info(streams[i], &status, nullptr) == cudaSuccess);
        CHECK(status == streampool::CaptureStatus::none);
        if (i == 0) CHECK(trim_elsewhere_synchronizes(pool, *fake));
      }
    }
    CHECK(failed_begins > 0);
    // Four under way: each left with no host memory stays counted.
    for (int i = 0; i < 4; ++i) {
      const HostMemoryRunsOut out(1, true);
      streampool::detach_capture_with_pool(pools[i]);
    }
    CHECK_FALSE(trim_elsewhere_synchronizes(pool, *fake));
    for (int i = 0; i < 4; ++i) {
      cudaGraph_t graph = nullptr;
      REQUIRE(fake->end_capture(streams[i], &graph) == cudaSuccess);
      REQUIRE(fake->graph_destroy(graph) == cudaSuccess);
    }
    CHECK(trim_elsewhere_synchronizes(pool, *fake));
    pools.clear();
    fake->complete_all();
  }
  CHECK(fake->live_bytes() == 0);
}

// Settles on several threads at once: each left capture is counted over once (a second count
// would let calls through during another capture).
TEST_CASE("settles on four threads at once count each left capture over once") {
  auto fake = std::make_shared<FakeDevice>();
  {
    MemoryPool pool(std::make_shared<DeviceWithMemory>(fake), test_options());
    { auto warm = Bytes::alloc_async(pool, MiB, fake->create_stream()); }
    for (int round = 0; round < 50; ++round) {
      constexpr int k = 8;
      std::vector<cudaStream_t> streams;
      std::vector<std::shared_ptr<streampool::CapturePool>> pools;
      for (int i = 0; i < k; ++i) {
        streams.push_back(fake->create_stream("captured"));
        pools.push_back(std::make_shared<streampool::CapturePool>(pool));
        streampool::begin_capture_with_pool(pools[i], streams[i], streampool::CaptureMode::relaxed);
        streampool::detach_capture_with_pool(pools[i]);  // left under way
      }
      for (int i = 0; i < k; ++i) {
        cudaGraph_t graph = nullptr;
        REQUIRE(fake->end_capture(streams[i], &graph) == cudaSuccess);
        REQUIRE(fake->graph_destroy(graph) == cudaSuccess);
      }
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) threads.emplace_back([&] { pool.trim(0); });
      for (auto& t : threads) t.join();
      CHECK(trim_elsewhere_synchronizes(pool, *fake));
      pools.clear();
      for (cudaStream_t s : streams) fake->destroy_stream(s);
    }
    fake->complete_all();
  }
  CHECK(fake->live_bytes() == 0);
}
