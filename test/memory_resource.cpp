// PoolResource (<streampool/memory_resource.hpp>): the pool as a CCCL memory resource. The
// concepts are checked at compile time, for the toolkit's CCCL and, through concepts written
// here after CCCL 3.1's, for the renamed members; every member then runs on the fake device.
#include "pool_helpers.hpp"

#include <streampool/error.hpp>
#include <streampool/memory_resource.hpp>

#include <catch2/catch.hpp>

#include <concepts>
#include <cstdint>

using streampool::Errc;
using streampool::FakeDevice;
using streampool::PoolResource;

namespace {

// CCCL >= 3.1's requirements, spelled out (the toolkit's CCCL may be older): a synchronous
// resource has allocate_sync/deallocate_sync, a resource adds the stream-ordered pair with the
// stream first, and both are equality comparable.
template <class R>
concept synchronous_resource_3_1 = requires(R& r, void* p, std::size_t n, std::size_t a) {
  { r.allocate_sync(n, a) } -> std::same_as<void*>;
  { r.deallocate_sync(p, n, a) } -> std::same_as<void>;
  requires std::equality_comparable<R>;
};
template <class R>
concept resource_3_1 =
    synchronous_resource_3_1<R> &&
    requires(R& r, void* p, std::size_t n, std::size_t a, cuda::stream_ref s) {
      { r.allocate(s, n, a) } -> std::same_as<void*>;
      { r.deallocate(s, p, n, a) } -> std::same_as<void>;
    };

}  // namespace

// Resources that must fail the checks, so that the checks are seen to discriminate (outside the
// anonymous namespace: their unused operators would be warned about there).
namespace mr_test {
struct NoProperty {  // the 3.0 members, but no device_accessible
  void* allocate(std::size_t, std::size_t) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t) noexcept {}
  void* allocate_async(std::size_t, std::size_t, cuda::stream_ref) { return nullptr; }
  void deallocate_async(void*, std::size_t, std::size_t, cuda::stream_ref) noexcept {}
  friend bool operator==(const NoProperty&, const NoProperty&) = default;
};
struct StreamLast {  // the 3.0 order of arguments only
  void* allocate_sync(std::size_t, std::size_t) { return nullptr; }
  void deallocate_sync(void*, std::size_t, std::size_t) noexcept {}
  void* allocate(std::size_t, std::size_t, cuda::stream_ref) { return nullptr; }
  void deallocate(void*, std::size_t, std::size_t, cuda::stream_ref) noexcept {}
  friend bool operator==(const StreamLast&, const StreamLast&) = default;
};
}  // namespace mr_test

namespace {
using mr_test::NoProperty;
using mr_test::StreamLast;

// --- the toolkit's concepts ---------------------------------------------------------------
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
// CCCL 3.0: `resource` is the synchronous concept, `async_resource` the stream-ordered one.
static_assert(cuda::mr::resource<PoolResource>);
static_assert(cuda::mr::async_resource<PoolResource>);
static_assert(cuda::mr::resource_with<PoolResource, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<PoolResource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::async_resource_with<PoolResource, cuda::mr::host_accessible>);
static_assert(cuda::mr::async_resource<NoProperty>);
static_assert(!cuda::mr::async_resource_with<NoProperty, cuda::mr::device_accessible>);
static_assert(!cuda::mr::async_resource<StreamLast>);
// What type-erased users take.
static_assert(std::is_constructible_v<cuda::mr::resource_ref<cuda::mr::device_accessible>,
                                      PoolResource&>);
static_assert(std::is_constructible_v<cuda::mr::async_resource_ref<cuda::mr::device_accessible>,
                                      PoolResource&>);
static_assert(!std::is_constructible_v<cuda::mr::async_resource_ref<cuda::mr::host_accessible>,
                                       PoolResource&>);
static_assert(!std::is_constructible_v<cuda::mr::async_resource_ref<cuda::mr::device_accessible>,
                                       NoProperty&>);
using SyncRef = cuda::mr::resource_ref<cuda::mr::device_accessible>;
using StreamRef = cuda::mr::async_resource_ref<cuda::mr::device_accessible>;
#else
// CCCL >= 3.1: `synchronous_resource` is the blocking concept, `resource` the stream-ordered one.
static_assert(cuda::mr::synchronous_resource<PoolResource>);
static_assert(cuda::mr::resource<PoolResource>);
static_assert(cuda::mr::synchronous_resource_with<PoolResource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<PoolResource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<PoolResource, cuda::mr::host_accessible>);
static_assert(cuda::mr::resource<StreamLast> == false);
static_assert(std::is_constructible_v<
              cuda::mr::synchronous_resource_ref<cuda::mr::device_accessible>, PoolResource&>);
static_assert(
    std::is_constructible_v<cuda::mr::resource_ref<cuda::mr::device_accessible>, PoolResource&>);
using SyncRef = cuda::mr::synchronous_resource_ref<cuda::mr::device_accessible>;
using StreamRef = cuda::mr::resource_ref<cuda::mr::device_accessible>;
#endif

// --- CCCL 3.1's spelling, whatever the toolkit's version ------------------------------------
static_assert(resource_3_1<PoolResource>);
static_assert(!resource_3_1<NoProperty>);
static_assert(!resource_3_1<StreamLast>);
static_assert(std::is_nothrow_copy_constructible_v<PoolResource>);
// Deallocation never throws, in either spelling.
static_assert(noexcept(std::declval<PoolResource&>().deallocate(cuda::stream_ref(cudaStreamLegacy),
                                                                nullptr, 1, 256)));
static_assert(noexcept(std::declval<PoolResource&>().deallocate(nullptr, 1, 256)));
static_assert(noexcept(std::declval<PoolResource&>().deallocate_sync(nullptr, 1, 256)));
static_assert(noexcept(std::declval<PoolResource&>().deallocate_async(
    nullptr, 1, 256, cuda::stream_ref(cudaStreamLegacy))));

bool aligned(const void* ptr, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(ptr) % alignment == 0;
}

}  // namespace

TEST_CASE("PoolResource: stream-ordered allocations are the pool's, on the stream named") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  const cudaStream_t stream = fake.create_stream();
  PoolResource resource(*pool);

  SECTION("allocate(stream, bytes, alignment) and deallocate(stream, ...): CCCL >= 3.1") {
    void* p = resource.allocate(stream, 1000, 256);
    REQUIRE(p != nullptr);
    CHECK(aligned(p, 256));
    CHECK(pool->stats().live_allocations.current == 1);
    CHECK(pool->stats().requested_bytes.current == 1000);
    resource.deallocate(stream, p, 1000, 256);
    CHECK(pool->stats().live_allocations.current == 0);
    // Dropped on `stream`: the next allocation there takes it back at once.
    void* q = resource.allocate(stream, 1000);
    CHECK(q == p);
    resource.deallocate(stream, q, 1000);
  }
  SECTION("allocate_async(bytes, alignment, stream) and deallocate_async: CCCL 3.0") {
    void* p = resource.allocate_async(5 << 20, 128, stream);  // a large block
    REQUIRE(p != nullptr);
    CHECK(aligned(p, 256));
    CHECK(pool->stats().requested_bytes.current == 5 << 20);
    resource.deallocate_async(p, 5 << 20, 128, stream);
    CHECK(pool->stats().live_allocations.current == 0);
    CHECK(resource.allocate_async(5 << 20, 128, stream) == p);
    resource.deallocate_async(p, 5 << 20, 128, stream);
  }
  SECTION("an allocation does not wait for the stream") {
    fake.launch(stream);
    void* p = resource.allocate(stream, 4096);
    CHECK(fake.pending_work() == 1);
    CHECK(fake.calls(FakeDevice::Call::stream_synchronize) == 0);
    resource.deallocate(stream, p, 4096);
    fake.complete_all();
  }
  pool->release_stream(stream);
  fake.destroy_stream(stream);
}

TEST_CASE("PoolResource: synchronous allocations are idle when they return") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  const cudaStream_t other = fake.create_stream();

  SECTION("allocate_sync synchronizes the resource's stream, so no earlier use is pending") {
    PoolResource resource(*pool);  // the legacy default stream
    // A block dropped on the legacy stream while work there still writes it...
    void* p = pool->allocate(4096, cudaStreamLegacy);
    fake.launch(cudaStreamLegacy, {{p, 4096, true}});
    pool->deallocate(p, 4096, cudaStreamLegacy);
    const auto synchronizes = fake.calls(FakeDevice::Call::stream_synchronize);
    void* q = resource.allocate_sync(4096, 256);
    CHECK(q == p);  // ...comes back at once (same-stream reuse needs no fence)...
    CHECK(fake.calls(FakeDevice::Call::stream_synchronize) == synchronizes + 1);
    CHECK(fake.pending_work() == 0);  // ...but idle: another stream may write it now
    fake.launch(other, {{q, 4096, true}});
    INFO(first_hazard(fake));
    CHECK(fake.hazards().empty());
    fake.complete_all();
    CHECK(pool->stats().live_allocations.current == 1);
    resource.deallocate_sync(q, 4096, 256);
    CHECK(pool->stats().live_allocations.current == 0);
  }
  SECTION("the 3.0 spelling, allocate(bytes, alignment), is the same call") {
    PoolResource resource(*pool, other);
    fake.launch(other);
    void* p = resource.allocate(3000, 64);
    CHECK(fake.pending_work() == 0);
    CHECK(pool->stats().requested_bytes.current == 3000);
    resource.deallocate(p, 3000, 64);
    CHECK(pool->stats().live_allocations.current == 0);
    CHECK(resource.sync_stream() == other);
  }
  SECTION("a failed synchronize returns the block and throws CUDA's error") {
    PoolResource resource(*pool, other);
    fake.fail_next(FakeDevice::Call::stream_synchronize);
    try {
      (void)resource.allocate_sync(4096);
      FAIL("allocate_sync did not throw");
    } catch (const streampool::Error& error) {
      CHECK(error.cuda_error() == cudaErrorLaunchFailure);
    }
    CHECK(pool->stats().live_allocations.current == 0);
  }
  pool->release_stream(other);
  fake.destroy_stream(other);
}

TEST_CASE("PoolResource: alignment is honoured up to what the pool guarantees, refused beyond") {
  PoolOnFake pool;
  const cudaStream_t stream = pool.fake().create_stream();
  PoolResource resource(*pool);

  SECTION("every power of two up to 256 B is honoured, in every member") {
    for (std::size_t alignment = 1; alignment <= PoolResource::guaranteed_alignment;
         alignment *= 2) {
      void* a = resource.allocate(stream, 24, alignment);
      void* b = resource.allocate_sync(24, alignment);
      CHECK(aligned(a, alignment));
      CHECK(aligned(b, alignment));
      resource.deallocate(stream, a, 24, alignment);
      resource.deallocate_sync(b, 24, alignment);
    }
    CHECK(pool->stats().live_allocations.current == 0);
  }
  SECTION("a larger alignment, or one not a power of two, is refused and allocates nothing") {
    for (const std::size_t alignment : {std::size_t{512}, std::size_t{4096}, std::size_t{0},
                                        std::size_t{3}, std::size_t{96}}) {
      INFO("alignment " << alignment);
      CHECK_THROWS_MATCHES(resource.allocate(stream, 1024, alignment), streampool::Error,
                           Catch::Matchers::Predicate<streampool::Error>(
                               [](const streampool::Error& e) {
                                 return e.errc() == Errc::invalid_value;
                               },
                               "Errc::invalid_value"));
      CHECK_THROWS_WITH(resource.allocate_sync(1024, alignment),
                        Catch::Contains("alignment of " + std::to_string(alignment)));
      CHECK_THROWS_AS(resource.allocate(1024, alignment), streampool::Error);
      CHECK_THROWS_AS(resource.allocate_async(1024, alignment, stream), streampool::Error);
    }
    CHECK(pool->stats().live_allocations.total == 0);
  }
  pool->release_stream(stream);
  pool.fake().destroy_stream(stream);
}

TEST_CASE("PoolResource: empty allocations and failures") {
  PoolOnFake pool;
  const cudaStream_t stream = pool.fake().create_stream();
  PoolResource resource(*pool);

  SECTION("0 bytes gives nullptr and allocates nothing; deallocating nullptr does nothing") {
    CHECK(resource.allocate(stream, 0) == nullptr);
    CHECK(resource.allocate_sync(0) == nullptr);
    resource.deallocate(stream, nullptr, 0);
    resource.deallocate_sync(nullptr, 0);
    CHECK(pool->stats().live_allocations.total == 0);
  }
  SECTION("the pool's out-of-memory error comes through as it is") {
    pool.fake().set_capacity(1 << 20);
    CHECK_THROWS_MATCHES(resource.allocate(stream, std::size_t{64} << 20), streampool::Error,
                         Catch::Matchers::Predicate<streampool::Error>(
                             [](const streampool::Error& e) {
                               return e.errc() == Errc::out_of_memory;
                             },
                             "Errc::out_of_memory"));
  }
  pool->release_stream(stream);
  pool.fake().destroy_stream(stream);
}

TEST_CASE("PoolResource: equal when the pool is the same, through resource_ref too") {
  PoolOnFake first;
  PoolOnFake second;
  PoolResource a(*first);
  PoolResource a_too(*first, reinterpret_cast<cudaStream_t>(0x1000));
  PoolResource b(*second);

  SECTION("equality is the pool's identity, not the synchronous stream's") {
    CHECK(a == a_too);
    CHECK_FALSE(a != a_too);
    CHECK(a != b);
    CHECK(&a_too.pool() == &*first);
  }
  SECTION("type-erased references compare as their resources and reach the pool") {
    StreamRef ref_a(a);
    StreamRef ref_a_too(a_too);
    StreamRef ref_b(b);
    CHECK(ref_a == ref_a_too);
    CHECK(ref_a != ref_b);
    const cudaStream_t stream = first.fake().create_stream();
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
    void* p = ref_a.allocate_async(2048, 256, cuda::stream_ref(stream));
#else
    void* p = ref_a.allocate(cuda::stream_ref(stream), 2048, 256);
#endif
    CHECK(first->stats().live_allocations.current == 1);
    CHECK(second->stats().live_allocations.total == 0);
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
    ref_a.deallocate_async(p, 2048, 256, cuda::stream_ref(stream));
#else
    ref_a.deallocate(cuda::stream_ref(stream), p, 2048, 256);
#endif
    CHECK(first->stats().live_allocations.current == 0);

    SyncRef sync_ref(b);
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
    void* q = sync_ref.allocate(512, 256);
#else
    void* q = sync_ref.allocate_sync(512, 256);
#endif
    CHECK(second->stats().live_allocations.current == 1);
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
    sync_ref.deallocate(q, 512, 256);
#else
    sync_ref.deallocate_sync(q, 512, 256);
#endif
    CHECK(second->stats().live_allocations.current == 0);
    first->release_stream(stream);
    first.fake().destroy_stream(stream);
  }
}
