// The raw-pointer API: allocate and deallocate as cudaMallocAsync and cudaFreeAsync. A free may
// name another stream than the allocation's: the memory is then reusable after the work enqueued
// on the freeing stream so far, and no sooner, on any stream.
#include "fake_helpers.hpp"
#include "pool_helpers.hpp"

using streampool::FakeDevice;
using Call = FakeDevice::Call;

// Issue 8, item 9: a free on another stream than the allocation's asks that stream's id; when
// the id cannot be read, the block goes back to the allocation's own stream for immediate reuse
// there, though its last use was on the freeing stream. It must wait for that stream's work, as
// a retired stream's blocks do.
TEST_CASE("a raw free on a stream whose id cannot be read is reused only after that stream's "
          "work") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t c = fake.create_stream();
  void* p = pool->allocate(4096, a);
  fake_test::order_after(fake, c, a);  // C uses p after A
  fake.launch(c, {{p, 4096, true}});
  fake.fail_next(Call::stream_id);
  pool->deallocate(p, 4096, c);  // freed on C, while C's write is pending

  void* q = pool->allocate(4096, a);
  fake.launch(a, {{q, 4096, true}});
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
  pool->deallocate(q, 4096, a);
}
