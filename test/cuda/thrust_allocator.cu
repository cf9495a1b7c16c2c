// ThrustAllocator (<streampool/thrust_allocator.hpp>) under nvcc, without a GPU: what thrust
// sees of the allocator is checked at compile time, the containers and algorithms the GPU tests
// run (test/gpu/thrust_gpu.cu) are instantiated here too, and the allocation paths thrust takes
// (allocator_traits for containers, get_temporary_buffer for an algorithm's temporaries) run on
// the fake device, where no kernel is needed.
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/thrust_allocator.hpp>

#include <thrust/device_vector.h>
#include <thrust/memory.h>
#include <thrust/sort.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <type_traits>

using streampool::ThrustAllocator;

namespace {

using Traits = thrust::detail::allocator_traits<ThrustAllocator<float>>;
static_assert(std::is_same_v<Traits::pointer, thrust::device_ptr<float>>);
static_assert(std::is_same_v<Traits::rebind_alloc<char>, ThrustAllocator<char>>);
static_assert(std::is_same_v<Traits::value_type, float>);
static_assert(!Traits::is_always_equal::value);
// thrust runs a container's element work with the allocator's system, the allocator's stream:
// that is what keeps a device_vector's own kernels on it.
using System = thrust::detail::allocator_system<ThrustAllocator<float>>;
static_assert(std::is_same_v<System::type, ThrustAllocator<float>::system_type>);
static_assert(std::is_same_v<System::get_result_type, ThrustAllocator<float>::system_type&>,
              "thrust must take the allocator's own system (its stream), not a default one");
using Vector = thrust::device_vector<int, ThrustAllocator<int>>;
static_assert(std::is_same_v<Vector::allocator_type, ThrustAllocator<int>>);
static_assert(std::is_nothrow_copy_constructible_v<ThrustAllocator<int>>);
static_assert(std::is_convertible_v<ThrustAllocator<int>, ThrustAllocator<char>>);

struct FakePool {
  std::shared_ptr<streampool::FakeDevice> fake = std::make_shared<streampool::FakeDevice>();
  streampool::MemoryPool pool{fake, [] {
                                streampool::PoolOptions options;
                                options.read_environment = false;
                                options.stats_granule = 0;
                                return options;
                              }()};
  cudaStream_t stream = fake->create_stream();
  cudaStream_t other = fake->create_stream();
  ~FakePool() {
    pool.release_stream(stream);
    pool.release_stream(other);
  }
};

}  // namespace

// Instantiated, never run here (they launch kernels): what test/gpu/thrust_gpu.cu runs, so that
// a change in thrust that breaks it fails the CPU build.
void thrust_allocator_compile_check(streampool::MemoryPool& pool, cudaStream_t stream) {
  ThrustAllocator<int> alloc(pool, stream);
  Vector v(1000, alloc);
  v.resize(5000, 7);
  v.push_back(3);
  Vector copy(v, alloc);
  ThrustAllocator<char> temporaries(pool, stream);
  thrust::sort(thrust::cuda::par_nosync(temporaries).on(stream), v.begin(), v.end());
  thrust::sort(thrust::cuda::par(temporaries).on(stream), copy.begin(), copy.end());
}

TEST_CASE("ThrustAllocator: thrust's container allocations are the pool's, on its stream") {
  FakePool f;
  ThrustAllocator<float> alloc(f.pool, f.stream);

  SECTION("allocate and deallocate through thrust's allocator_traits") {
    auto p = Traits::allocate(alloc, 1000);
    REQUIRE(p.get() != nullptr);
    CHECK(f.pool.stats().live_allocations.current == 1);
    CHECK(f.pool.stats().requested_bytes.current == 1000 * sizeof(float));
    Traits::deallocate(alloc, p, 1000);
    CHECK(f.pool.stats().live_allocations.current == 0);
    // Dropped on the allocator's stream: the next allocation there takes it back at once.
    auto q = alloc.allocate(1000);
    CHECK(q == p);
    alloc.deallocate(q, 1000);
  }
  SECTION("the allocation is on the allocator's stream, not another") {
    auto p = alloc.allocate(256);
    f.fake->launch(f.stream, {{p.get(), 256 * sizeof(float), true}});
    alloc.deallocate(p, 256);  // pending work on `stream` still writes it
    ThrustAllocator<float> elsewhere(f.pool, f.other);
    auto q = elsewhere.allocate(256);
    CHECK(q != p);  // not handed to `other` before the work completes
    elsewhere.deallocate(q, 256);
    f.fake->complete_all();
  }
  SECTION("0 elements is a null pointer; an overflowing count throws invalid_value") {
    CHECK(alloc.allocate(0).get() == nullptr);
    alloc.deallocate(thrust::device_ptr<float>(), 0);
    CHECK_THROWS_AS(alloc.allocate(std::size_t{1} << 63), streampool::Error);
    CHECK(f.pool.stats().live_allocations.total == 0);
  }
  SECTION("equal when pool and stream are the same, across element types") {
    ThrustAllocator<char> rebound(alloc);
    CHECK(rebound == alloc);
    CHECK(rebound.stream() == f.stream);
    CHECK(&rebound.pool() == &f.pool);
    CHECK(ThrustAllocator<float>(f.pool, f.other) != alloc);
    FakePool g;
    CHECK(ThrustAllocator<float>(g.pool, f.stream) != alloc);
    CHECK(get_stream(alloc.system()) == f.stream);  // thrust's own accessor, found by ADL
  }
}

TEST_CASE("ThrustAllocator: an algorithm's temporary storage comes from the pool") {
  FakePool f;
  ThrustAllocator<char> temporaries(f.pool, f.stream);
  auto policy = thrust::cuda::par_nosync(temporaries).on(f.stream);

  // What thrust::sort and the others call for their scratch space.
  const auto temporary = thrust::get_temporary_buffer<std::uint64_t>(policy, 4096);
  const auto buffer = temporary.first;
  const auto count = temporary.second;
  REQUIRE(buffer.get() != nullptr);
  CHECK(count == 4096);
  CHECK(f.pool.stats().live_allocations.current == 1);
  CHECK(f.pool.stats().requested_bytes.current == 4096 * sizeof(std::uint64_t));
  thrust::return_temporary_buffer(policy, buffer, count);
  CHECK(f.pool.stats().live_allocations.current == 0);
  CHECK(f.pool.stats().live_allocations.total == 1);
}
