// PooledBuffer<T>, the RAII handle, and the raw allocate/deallocate API under it: sizes and their
// errors, what a buffer reports about itself, moves, reset, alignment, and cudaFreeAsync's
// semantics for a pointer freed on another stream than the one it was allocated on.
#include "pool_helpers.hpp"

#include <streampool/error.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

using streampool::Errc;
using streampool::Error;
using streampool::FakeDevice;
using streampool::PooledBuffer;
using Bytes = PooledBuffer<std::byte>;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();

std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

// Found in review (2026-12-05): a PooledBuffer of a type aligned to more than the pool's blocks
// are handed out pointers misaligned for it (the pool promises 256 B). Now such a type cannot name
// a PooledBuffer at all.
template <class T>
constexpr bool holdable = requires { typename PooledBuffer<T>; };
struct alignas(256) AtTheBound {
  std::byte bytes[256];
};
struct alignas(512) PastTheBound {
  std::byte bytes[512];
};
static_assert(holdable<std::byte> && holdable<double> && holdable<AtTheBound>);
static_assert(!holdable<PastTheBound>, "the pool's blocks are aligned to 256 B only");

// Orders `waiter` after the work enqueued on `first` so far, as a user would with an event.
void order_after(FakeDevice& fake, cudaStream_t waiter, cudaStream_t first) {
  cudaEvent_t event = nullptr;
  REQUIRE(fake.event_create(&event) == cudaSuccess);
  REQUIRE(fake.event_record(event, first) == cudaSuccess);
  REQUIRE(fake.stream_wait_event(waiter, event) == cudaSuccess);
  REQUIRE(fake.event_destroy(event) == cudaSuccess);
}

template <class F>
Errc errc_thrown_by(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.errc();
  }
  FAIL("nothing thrown");
  return Errc::success;
}

}  // namespace

TEST_CASE("alloc_async throws invalid_value for a size of zero or one that overflows") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();

  SECTION("zero elements") {
    REQUIRE(errc_thrown_by([&] { PooledBuffer<float>::alloc_async(*pool, 0, s); }) ==
            Errc::invalid_value);
  }
  SECTION("n * sizeof(T) past SIZE_MAX") {
    REQUIRE(errc_thrown_by([&] {
              PooledBuffer<double>::alloc_async(*pool, size_max / sizeof(double) + 1, s);
            }) == Errc::invalid_value);
    REQUIRE(errc_thrown_by([&] { PooledBuffer<std::uint32_t>::alloc_async(*pool, size_max, s); }) ==
            Errc::invalid_value);
  }
  SECTION("the message says why") {
    REQUIRE_THROWS_WITH(PooledBuffer<float>::alloc_async(*pool, 0, s),
                        Catch::Contains("must be positive"));
  }
  REQUIRE(pool->stats().live_allocations.total == 0);
  REQUIRE(pool.fake().calls(FakeDevice::Call::malloc) == 0);
}

TEST_CASE("try_alloc_async reports failure through the error code, with an empty buffer") {
  FakeDevice::Options device;
  device.capacity = 64 * MiB;
  PoolOnFake pool(test_options(), device);
  cudaStream_t s = pool.fake().create_stream();
  std::error_code error;

  SECTION("zero elements: invalid_value") {
    auto buffer = PooledBuffer<float>::try_alloc_async(*pool, 0, s, error);
    REQUIRE(buffer.is_empty());
    REQUIRE(error == Errc::invalid_value);
  }
  SECTION("an overflowing size: invalid_value") {
    auto buffer = PooledBuffer<double>::try_alloc_async(*pool, size_max / 2, s, error);
    REQUIRE(buffer.is_empty());
    REQUIRE(error == Errc::invalid_value);
  }
  SECTION("more than the device has: out_of_memory") {
    auto buffer = Bytes::try_alloc_async(*pool, 100 * MiB, s, error);
    REQUIRE(buffer.is_empty());
    REQUIRE(buffer.data() == nullptr);
    REQUIRE(error == Errc::out_of_memory);
  }
  SECTION("success clears a code the caller left set") {
    error = make_error_code(Errc::out_of_memory);
    auto buffer = PooledBuffer<int>::try_alloc_async(*pool, 10, s, error);
    REQUIRE_FALSE(buffer.is_empty());
    REQUIRE_FALSE(error);
  }
  SECTION("the code carries the library's category") {
    PooledBuffer<int>::try_alloc_async(*pool, 0, s, error);
    REQUIRE(error.category() == streampool::category());
  }
}

TEST_CASE("a buffer reports its length, size in bytes, address and stream") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();

  SECTION("a buffer holding memory") {
    auto buffer = PooledBuffer<float>::alloc_async(*pool, 1000, s);
    REQUIRE_FALSE(buffer.is_empty());
    REQUIRE(buffer.len() == 1000);
    REQUIRE(buffer.byte_size() == 4000);
    REQUIRE(buffer.data() != nullptr);
    REQUIRE(buffer.as_device_ptr() == static_cast<CUdeviceptr>(address(buffer.data())));
    REQUIRE(buffer.stream() == s);
    REQUIRE(pool->stats().requested_bytes.current == 4000);
  }
  SECTION("a buffer of a wide element type counts bytes, not elements") {
    struct Wide {
      double x, y, z;
    };
    auto buffer = PooledBuffer<Wide>::alloc_async(*pool, 7, s);
    REQUIRE(buffer.len() == 7);
    REQUIRE(buffer.byte_size() == 7 * sizeof(Wide));
    REQUIRE(pool->stats().requested_bytes.current == static_cast<std::int64_t>(7 * sizeof(Wide)));
  }
  SECTION("a buffer on the per-thread default stream names that stream") {
    auto buffer = PooledBuffer<int>::alloc_async(*pool, 10, cudaStreamPerThread);
    REQUIRE(buffer.stream() == cudaStreamPerThread);
  }
  SECTION("a default-constructed buffer is empty") {
    PooledBuffer<float> buffer;
    REQUIRE(buffer.is_empty());
    REQUIRE(buffer.len() == 0);
    REQUIRE(buffer.byte_size() == 0);
    REQUIRE(buffer.data() == nullptr);
    REQUIRE(buffer.as_device_ptr() == 0);
    REQUIRE(buffer.stream() == nullptr);
  }
}

TEST_CASE("moving a buffer hands its memory over and leaves the source empty") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  const auto live = [&] { return pool->stats().live_allocations.current; };

  SECTION("move construction; the source's destructor then drops nothing") {
    std::optional<PooledBuffer<int>> source(PooledBuffer<int>::alloc_async(*pool, 100, s));
    int* const memory = source->data();
    PooledBuffer<int> target(std::move(*source));
    REQUIRE(target.data() == memory);
    REQUIRE(target.len() == 100);
    REQUIRE(target.stream() == s);
    REQUIRE(source->is_empty());
    REQUIRE(source->data() == nullptr);
    REQUIRE(source->len() == 0);
    REQUIRE(source->stream() == nullptr);
    source.reset();  // the moved-from buffer's destructor
    REQUIRE(live() == 1);
    // The memory is still the target's: a new buffer on the stream does not get it.
    auto other = PooledBuffer<int>::alloc_async(*pool, 100, s);
    REQUIRE(other.data() != memory);
  }
  SECTION("move assignment into an empty buffer") {
    PooledBuffer<int> target;
    std::optional<PooledBuffer<int>> source(PooledBuffer<int>::alloc_async(*pool, 100, s));
    int* const memory = source->data();
    target = std::move(*source);
    REQUIRE(target.data() == memory);
    REQUIRE(target.len() == 100);
    REQUIRE(source->is_empty());
    source.reset();
    REQUIRE(live() == 1);
  }
  SECTION("move assignment into a buffer holding memory drops that memory first") {
    auto target = PooledBuffer<int>::alloc_async(*pool, 100, s);
    auto source = PooledBuffer<int>::alloc_async(*pool, 300, s);
    int* const memory = source.data();
    REQUIRE(live() == 2);
    target = std::move(source);
    REQUIRE(live() == 1);
    REQUIRE(pool->stats().requested_bytes.current == static_cast<std::int64_t>(300 * sizeof(int)));
    REQUIRE(target.data() == memory);
    REQUIRE(target.len() == 300);
    REQUIRE(source.is_empty());
  }
  SECTION("a moved-from buffer can take memory again") {
    auto source = PooledBuffer<int>::alloc_async(*pool, 100, s);
    PooledBuffer<int> target(std::move(source));
    source = PooledBuffer<int>::alloc_async(*pool, 50, s);
    REQUIRE(source.len() == 50);
    REQUIRE(live() == 2);
  }
}

// Found by the model check (fuzz), through a CapturePool's release completed on another thread
// (capture_per_thread.cpp): a buffer's drop is ordered on its own stream, but the pool announced
// it to the device with the buffer's handle, and cudaStreamPerThread names another stream in every
// thread: dropped on another thread, the fake saw it dropped on that thread's stream, which its
// pending write was not ordered before (unrecorded_use). deallocate names its stream as the
// calling thread does, and stays reported there.
TEST_CASE("a per-thread stream's buffer dropped on another thread is dropped on its own stream") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  cudaStream_t other = fake.create_stream();

  SECTION("a PooledBuffer: nothing to report, and no other stream gets it early") {
    auto x = Bytes::alloc_async(*pool, 4096, cudaStreamPerThread);
    write_on(fake, cudaStreamPerThread, x);  // stays pending
    void* const x_ptr = x.data();
    std::thread([moved = std::move(x)]() mutable { moved.reset(); }).join();
    INFO(first_hazard(fake));
    CHECK(fake.hazards().empty());
    auto y = Bytes::alloc_async(*pool, 4096, other);
    write_on(fake, other, y);
    CHECK(static_cast<void*>(y.data()) != x_ptr);
    CHECK(fake.hazards().empty());
    // On its own stream it is reusable at once (stream order).
    auto again = Bytes::alloc_async(*pool, 4096, cudaStreamPerThread);
    CHECK(static_cast<void*>(again.data()) == x_ptr);
  }
  SECTION("deallocate on cudaStreamPerThread there names that thread's stream: reported") {
    void* p = pool->allocate(4096, cudaStreamPerThread);
    fake.launch(cudaStreamPerThread, {{p, 4096, true}});  // stays pending
    std::thread([&] { pool->deallocate(p, 4096, cudaStreamPerThread); }).join();
    const auto hazards = fake.hazards();
    REQUIRE(hazards.size() == 1);
    CHECK(hazards.front().kind == FakeDevice::Hazard::Kind::unrecorded_use);
  }
  fake.complete_all();
}

TEST_CASE("reset drops the memory at once and leaves the buffer empty") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  auto buffer = PooledBuffer<float>::alloc_async(*pool, 1000, s);
  float* const memory = buffer.data();
  buffer.reset();
  REQUIRE(buffer.is_empty());
  REQUIRE(buffer.data() == nullptr);
  REQUIRE(buffer.len() == 0);
  REQUIRE(buffer.stream() == nullptr);
  REQUIRE(pool->stats().live_allocations.current == 0);
  REQUIRE(pool->stats().requested_bytes.current == 0);

  SECTION("the memory is reusable on its stream at once") {
    auto again = PooledBuffer<float>::alloc_async(*pool, 1000, s);
    REQUIRE(again.data() == memory);
  }
  SECTION("reset of an empty buffer does nothing") {
    buffer.reset();
    REQUIRE(buffer.is_empty());
    REQUIRE(pool->stats().live_allocations.total == 1);
    REQUIRE(pool->stats().live_allocations.current == 0);
  }
}

TEST_CASE("record_stream on an empty buffer throws invalid_value") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  cudaStream_t other = pool.fake().create_stream();

  SECTION("default-constructed") {
    PooledBuffer<int> empty;
    REQUIRE(errc_thrown_by([&] { empty.record_stream(other); }) == Errc::invalid_value);
  }
  SECTION("moved from") {
    auto source = PooledBuffer<int>::alloc_async(*pool, 10, s);
    auto target = std::move(source);
    REQUIRE(errc_thrown_by([&] { source.record_stream(other); }) == Errc::invalid_value);
    REQUIRE_NOTHROW(target.record_stream(other));
  }
  SECTION("reset") {
    auto buffer = PooledBuffer<int>::alloc_async(*pool, 10, s);
    buffer.reset();
    REQUIRE(errc_thrown_by([&] { buffer.record_stream(other); }) == Errc::invalid_value);
  }
}

TEST_CASE("data() is 256-byte aligned, and live buffers never overlap, for every size") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  std::vector<std::size_t> sizes;
  for (std::size_t n = 1; n <= 5000; n += 37) sizes.push_back(n);
  for (std::size_t k = 8; k <= 23; ++k) {
    const std::size_t p = std::size_t{1} << k;
    sizes.insert(sizes.end(), {p - 1, p, p + 1, p + p / 3});
  }
  std::vector<Bytes> live;
  for (std::size_t n : sizes) {
    live.push_back(Bytes::alloc_async(*pool, n, s));
    CAPTURE(n);
    REQUIRE(address(live.back().data()) % 256 == 0);
    REQUIRE(live.back().byte_size() == n);
  }
  std::sort(live.begin(), live.end(),
            [](const Bytes& a, const Bytes& b) { return a.data() < b.data(); });
  for (std::size_t i = 1; i < live.size(); ++i) {
    REQUIRE(live[i - 1].data() + live[i - 1].byte_size() <= live[i].data());
  }
}

TEST_CASE("on a host-backed FakeDevice a buffer's memory can be written and read through data()") {
  PoolOnFake pool(test_options(), FakeDevice::Options{.host_backed = true});
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();

  SECTION("each buffer keeps what was written to it") {
    std::vector<PooledBuffer<std::uint32_t>> buffers;
    for (std::uint32_t i = 0; i < 40; ++i) {
      const std::size_t n = 1 + i * 977 + (i % 3 == 0 ? 300000 : 0);  // small and large
      buffers.push_back(PooledBuffer<std::uint32_t>::alloc_async(*pool, n, s));
      std::fill_n(buffers.back().data(), n, i);
    }
    for (std::uint32_t i = 0; i < buffers.size(); ++i) {
      const auto& b = buffers[i];
      REQUIRE(std::all_of(b.data(), b.data() + b.len(), [&](std::uint32_t v) { return v == i; }));
    }
  }
  SECTION("work on the stream writes it when it completes, as a kernel would") {
    auto buffer = PooledBuffer<int>::alloc_async(*pool, 256, s);
    std::fill_n(buffer.data(), 256, 0);
    int* const data = buffer.data();
    fake.launch(s, {{data, buffer.byte_size(), true}}, [data] { std::fill_n(data, 256, 7); });
    REQUIRE(data[255] == 0);
    fake.complete(s);
    REQUIRE(std::count(data, data + 256, 7) == 256);
  }
}

TEST_CASE("raw allocate and deallocate work as cudaMallocAsync and cudaFreeAsync") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t b = fake.create_stream();

  SECTION("allocate returns aligned memory, counted until it is deallocated") {
    void* p = pool->allocate(1000, a);
    REQUIRE(p != nullptr);
    REQUIRE(address(p) % 256 == 0);
    REQUIRE(pool->stats().live_allocations.current == 1);
    REQUIRE(pool->stats().requested_bytes.current == 1000);
    pool->deallocate(p, 1000, a);
    REQUIRE(pool->stats().live_allocations.current == 0);
    REQUIRE(pool->stats().requested_bytes.current == 0);
  }
  SECTION("memory deallocated on its own stream is reused there at once") {
    void* p = pool->allocate(4096, a);
    fake.launch(a, {{p, 4096, true}});
    pool->deallocate(p, 4096, a);
    const auto mallocs = fake.calls(FakeDevice::Call::malloc);
    void* q = pool->allocate(4096, a);
    REQUIRE(q == p);
    REQUIRE(fake.calls(FakeDevice::Call::malloc) == mallocs);
    fake.launch(a, {{q, 4096, true}});
    pool->deallocate(q, 4096, a);
  }
  for (std::size_t bytes : {std::size_t{4096}, 3 * MiB}) {
    DYNAMIC_SECTION("memory of " << bytes << " bytes deallocated on another stream is reusable "
                    "on that stream at once, and elsewhere only after a fence") {
      void* p = pool->allocate(bytes, a);
      fake.launch(a, {{p, bytes, true}});  // pending
      order_after(fake, b, a);             // the user orders B after A's use, then frees on B
      pool->deallocate(p, bytes, b);
      REQUIRE(pool->stats().live_allocations.current == 0);

      void* on_a = pool->allocate(bytes, a);  // B's free is not fenced: A must not get it
      REQUIRE(on_a != p);
      fake.launch(a, {{on_a, bytes, true}});

      void* on_b = pool->allocate(bytes, b);
      REQUIRE(on_b == p);
      fake.launch(b, {{on_b, bytes, true}});  // after A's write: ordered by the user's event
      REQUIRE(fake.hazards().empty());
      pool->deallocate(on_a, bytes, a);
      pool->deallocate(on_b, bytes, b);
    }
  }
  SECTION("under fence_every_free a deallocate on another stream records its fence too") {
    auto options = one_block_slabs();
    options.fence_every_free = true;
    PoolOnFake fenced(options);
    FakeDevice& f = fenced.fake();
    cudaStream_t x = f.create_stream();
    cudaStream_t y = f.create_stream();
    for (std::size_t bytes : {std::size_t{4096}, 3 * MiB}) {
      CAPTURE(bytes);
      void* p = fenced->allocate(bytes, x);
      order_after(f, y, x);
      const auto records = f.calls(FakeDevice::Call::event_record);
      fenced->deallocate(p, bytes, y);
      REQUIRE(f.calls(FakeDevice::Call::event_record) == records + 1);
    }
  }
  SECTION("allocate(0) throws invalid_value; try_allocate reports it through the code") {
    REQUIRE(errc_thrown_by([&] { pool->allocate(0, a); }) == Errc::invalid_value);
    std::error_code error;
    REQUIRE(pool->try_allocate(0, a, error) == nullptr);
    REQUIRE(error == Errc::invalid_value);
  }
  SECTION("try_allocate reports out_of_memory through the code, and clears it on success") {
    fake.set_capacity(64 * MiB);
    std::error_code error;
    REQUIRE(pool->try_allocate(100 * MiB, a, error) == nullptr);
    REQUIRE(error == Errc::out_of_memory);
    void* p = pool->try_allocate(100, a, error);
    REQUIRE(p != nullptr);
    REQUIRE_FALSE(error);
    pool->deallocate(p, 100, a);
  }
  SECTION("allocate throws out_of_memory when the device refuses") {
    fake.set_capacity(64 * MiB);
    REQUIRE(errc_thrown_by([&] { pool->allocate(100 * MiB, a); }) == Errc::out_of_memory);
  }
  SECTION("deallocate of a null pointer does nothing") {
    // (Of a pointer the pool did not allocate: pool_raw_api.cpp, per build.)
    void* p = pool->allocate(100, a);
    pool->deallocate(nullptr, 100, a);
    REQUIRE(pool->stats().live_allocations.current == 1);
    pool->deallocate(p, 100, a);
    REQUIRE(pool->stats().live_allocations.current == 0);
  }
  fake.complete_all();
}
