// Cache lines: what one stream's fast path writes shares no line with what another's writes.
// A slab's blocks go to different streams, whose threads write their bookkeeping on every
// allocation and drop; two blocks on one line made 4 threads slower than 2 on the H200
// (bench/results/h200-threads-false-sharing.md). Each block (128 bytes) starts a line of its own.
#include "pool_helpers.hpp"

#include <cstdint>
#include <system_error>
#include <utility>
#include <vector>

using streampool::FakeDevice;

TEST_CASE("every block handed out on any stream and of any size starts a cache line") {
  PoolOnFake pool;
  FakeDevice& fake = pool.fake();
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(fake.create_stream());
  std::vector<std::pair<streampool::detail::Block*, cudaStream_t>> held;
  for (std::size_t bytes : {std::size_t{512}, std::size_t{4096}, std::size_t{65536},
                            std::size_t{3} << 20}) {
    for (int round = 0; round < 8; ++round) {
      for (cudaStream_t s : streams) {
        std::error_code error;
        streampool::detail::Block* b = streampool::detail::allocate_block(*pool, bytes, s, error);
        REQUIRE(b != nullptr);
        CHECK(reinterpret_cast<std::uintptr_t>(b) % 64 == 0);
        held.emplace_back(b, s);
      }
    }
  }
  for (auto [b, s] : held) streampool::detail::release_block(b, s);
  fake.complete_all();
}
