// The bench's peers on a real device: what each may claim of the memory it held.
#include "peers.hpp"

#include <catch2/catch.hpp>

// Found in review (2026-12-06): the cudaMalloc peer reported the bytes requested of it as its peak
// reserved memory, so compare showed cudaMalloc at exactly 1.000 reserved per requested byte on
// every trace. What cudaMalloc takes for a request (whole pages from the driver, shared among
// small allocations) is not known to its caller: the peer says it cannot tell (0, printed n/a).
TEST_CASE("the cudaMalloc peer does not report the requested bytes as memory it reserved") {
  const auto peer = streampool::bench::make_cuda_malloc_peer();
  peer->reset_peak();
  void* p = peer->allocate(100, nullptr);
  REQUIRE(p != nullptr);
  CHECK(peer->peak_reserved() == 0);
  peer->deallocate(p, 100, nullptr);
}
