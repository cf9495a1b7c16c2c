// streampool_torch_record_stream, Tensor.record_stream's hook: memory used on a second stream
// is recycled only after that stream's work.
#include "torch_helpers.hpp"

using streampool::FakeDevice;

TEST_CASE("record_stream keeps memory from reuse until the other stream's work completes") {
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t copy = fake.create_stream();
  cudaStream_t compute = fake.create_stream();
  // The copy stream fills a buffer and the compute stream reads it, as a prefetching loader
  // does; the tensor is freed on its own stream while the read is pending.
  void* p = streampool_torch_alloc(4096, 0, copy);
  REQUIRE(p != nullptr);
  fake.launch(copy, {{p, 4096, true}});
  cudaEvent_t filled = nullptr;  // the compute stream is ordered after the copy, as a loader does
  REQUIRE(fake.event_create(&filled) == cudaSuccess);
  REQUIRE(fake.event_record(filled, copy) == cudaSuccess);
  REQUIRE(fake.stream_wait_event(compute, filled) == cudaSuccess);
  fake.complete(copy);
  fake.launch(compute, {{p, 4096, false}});  // pending

  SECTION("recorded: the next allocation on the copy stream gets other memory") {
    REQUIRE(streampool_torch_record_stream(p, compute) == 0);
    streampool_torch_free(p, 4096, 0, copy);
    void* q = streampool_torch_alloc(4096, 0, copy);
    REQUIRE(q != p);
    fake.launch(copy, {{q, 4096, true}});
    REQUIRE(fake.hazards().empty());
    streampool_torch_free(q, 4096, 0, copy);
    SECTION("once the read completes, nothing is held back: trim returns it all") {
      fake.complete_all();
      REQUIRE(streampool_torch_trim(0) == 0);
      REQUIRE(fake.live_bytes() == 0);
    }
  }
  SECTION("not recorded (the hook missing): the same memory comes back at once, a race") {
    streampool_torch_free(p, 4096, 0, copy);
    void* q = streampool_torch_alloc(4096, 0, copy);
    REQUIRE(q == p);
    fake.launch(copy, {{q, 4096, true}});
    REQUIRE_FALSE(fake.hazards().empty());
    fake.clear_hazards();
    streampool_torch_free(q, 4096, 0, copy);
  }
  fake.complete_all();
  REQUIRE(fake.event_destroy(filled) == cudaSuccess);
  REQUIRE(torch.stats(0).live_allocations_current == 0);
}

TEST_CASE("record_stream of a pointer not handed out fails and changes nothing; of null (an "
          "empty tensor) it does nothing") {
  TorchOnFakes torch;
  FakeDevice& fake = torch.fake(0);
  cudaStream_t s = fake.create_stream();
  int not_ours = 0;
  REQUIRE(streampool_torch_record_stream(&not_ours, s) == -1);
  REQUIRE(streampool_torch_record_stream(nullptr, s) == 0);
  void* p = streampool_torch_alloc(256, 0, s);
  streampool_torch_free(p, 256, 0, s);
  REQUIRE(streampool_torch_record_stream(p, s) == -1);  // freed already
}
