// The pool on the H200: real kernels, real fences. Every buffer is filled by a kernel that first
// sleeps, then checked by a kernel that runs after a further sleep on the same stream; a block
// handed to another stream before the previous owner's fill had finished would be overwritten
// between the new owner's fill and its check, and counted. Thousands of buffers, several streams,
// every policy.
#include "kernels.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <string>

namespace {

using streampool::PoolOptions;
using streampool::PooledBuffer;
using streampool::StreamChecks;

int iterations() {
  const char* env = std::getenv("STREAMPOOL_GPU_ITERATIONS");
  return env != nullptr ? std::atoi(env) : 3000;
}

struct Policy {
  const char* name;
  PoolOptions options;
};

std::vector<Policy> policies() {
  PoolOptions base;
  base.read_environment = false;
  base.slab_bytes = 256 << 10;  // few blocks per slab: streams must trade blocks
  std::vector<Policy> all;
  all.push_back({"default", base});
  auto every = base;
  every.fence_every_free = true;
  all.push_back({"fence_every_free", every});
  auto wait = base;
  wait.cross_stream_wait = true;
  all.push_back({"cross_stream_wait", wait});
  auto wait_every = wait;
  wait_every.fence_every_free = true;
  all.push_back({"cross_stream_wait+fence_every_free", wait_every});
  auto none = base;
  none.stream_checks = StreamChecks::none;
  all.push_back({"stream_checks=none", none});
  auto identity = base;
  identity.stream_checks = StreamChecks::identity;
  all.push_back({"stream_checks=identity", identity});
  return all;
}

}  // namespace

TEST_CASE("no block reaches another stream while its previous owner's kernels may still run",
          "[pool][gpu]") {
  auto device = std::make_shared<streampool::CudaDevice>(0);
  unsigned long long* mismatches = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&mismatches), sizeof(unsigned long long)) == cudaSuccess);

  for (const Policy& policy : policies()) {
    DYNAMIC_SECTION(policy.name) {
      REQUIRE(cudaMemset(mismatches, 0, sizeof(unsigned long long)) == cudaSuccess);
      streampool::MemoryPool pool(device, policy.options);
      constexpr int stream_count = 3;
      cudaStream_t streams[stream_count];
      for (auto& s : streams) REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);

      // Phases: one stream allocates a few buffers of one size, uses them, drops them. Sizes
      // change from phase to phase, so a stream seldom finds the size in its own cache and must
      // take blocks other streams dropped: the hand-off under test.
      std::mt19937 random(7);
      std::deque<PooledBuffer<std::uint32_t>> kept[stream_count];
      std::map<void*, int> last_stream;  // address -> stream that last had it
      std::size_t handoffs = 0;
      constexpr int per_phase = 8;
      for (int i = 0; i < iterations(); i += per_phase) {
        const int s = (i / per_phase) % stream_count;
        const std::size_t n = 1024 * (1 + random() % 24);
        for (int j = 0; j < per_phase; ++j) {
          auto buffer = PooledBuffer<std::uint32_t>::alloc_async(pool, n, streams[s]);
          auto [seen, fresh] = last_stream.emplace(buffer.data(), s);
          if (!fresh && seen->second != s) ++handoffs;
          seen->second = s;
          const std::uint32_t pattern = 0x9e3779b9u * static_cast<std::uint32_t>(i + j + 1);
          REQUIRE(gpu_test::launch_delayed_fill(streams[s], buffer.data(), n, pattern,
                                                20'000 + random() % 80'000) == cudaSuccess);
          REQUIRE(gpu_test::launch_sleep(streams[s], 50'000) == cudaSuccess);
          REQUIRE(gpu_test::launch_count_mismatches(streams[s], buffer.data(), n, pattern,
                                                    mismatches) == cudaSuccess);
          kept[s].push_back(std::move(buffer));
        }
        kept[s].clear();  // drops, stream-ordered: the kernels above may still be running
        // Now and then let every stream catch up, so that fences have completed when the next
        // phases look: hand-offs then happen under every policy, not only when timing allows.
        if ((i / per_phase) % 16 == 15) REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      }
      for (auto& k : kept) k.clear();
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      unsigned long long found = ~0ull;
      REQUIRE(cudaMemcpy(&found, mismatches, sizeof found, cudaMemcpyDeviceToHost) == cudaSuccess);
      const auto stats = pool.stats();
      INFO(policy.name << ": " << handoffs << " cross-stream hand-offs, " << stats.fences_recorded
                       << " fences, " << stats.cross_stream_reuses << " cross-stream reuses");
      REQUIRE(found == 0);
      REQUIRE(handoffs > 0);  // the hazard was exercised, not avoided
      WARN(policy.name << ": " << handoffs << " hand-offs, " << stats.fences_recorded
                       << " fences, reserved peak " << stats.reserved_bytes.peak);
      for (auto& s : streams) {
        pool.release_stream(s);
        REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
      }
    }
  }
  cudaFree(mismatches);
}

TEST_CASE("a stream created with a destroyed stream's handle never gets its pending blocks",
          "[pool][gpu]") {
  auto device = std::make_shared<streampool::CudaDevice>(0);
  unsigned long long* mismatches = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&mismatches), sizeof(unsigned long long)) == cudaSuccess);
  REQUIRE(cudaMemset(mismatches, 0, sizeof(unsigned long long)) == cudaSuccess);
  for (StreamChecks checks : {StreamChecks::identity, StreamChecks::full}) {
    PoolOptions options;
    options.read_environment = false;
    options.stream_checks = checks;
    streampool::MemoryPool pool(device, options);
    int reused_handles = 0;
    for (int i = 0; i < 200; ++i) {
      cudaStream_t a = nullptr;
      REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
      {
        auto x = PooledBuffer<std::uint32_t>::alloc_async(pool, 4096, a);
        REQUIRE(gpu_test::launch_delayed_fill(a, x.data(), 4096, 0xdeadbeef, 200'000) ==
                cudaSuccess);
      }
      REQUIRE(cudaStreamDestroy(a) == cudaSuccess);  // its fill still pending
      cudaStream_t b = nullptr;
      REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
      reused_handles += b == a;
      auto y = PooledBuffer<std::uint32_t>::alloc_async(pool, 4096, b);
      const std::uint32_t pattern = 0x1000u + static_cast<std::uint32_t>(i);
      REQUIRE(gpu_test::launch_delayed_fill(b, y.data(), 4096, pattern, 0) == cudaSuccess);
      REQUIRE(gpu_test::launch_sleep(b, 400'000) == cudaSuccess);
      REQUIRE(gpu_test::launch_count_mismatches(b, y.data(), 4096, pattern, mismatches) ==
              cudaSuccess);
      y.reset();
      pool.release_stream(b);
      REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    WARN("handles reused at once: " << reused_handles << " of 200");
    REQUIRE(reused_handles > 0);
  }
  unsigned long long found = ~0ull;
  REQUIRE(cudaMemcpy(&found, mismatches, sizeof found, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(found == 0);
  cudaFree(mismatches);
}
