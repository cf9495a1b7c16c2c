// A probe: are some pool objects slower than others with the same code and settings?
//
// Two whole compares on H100s (bench/results/h100-c5a6381.md, h100-compare-07f1792.md) timed the
// first two streampool pools about twice as slow as the two after them on a same-stream pair up
// to 64 KiB, whose path is the same in all four; three others did not. This probe makes P pools
// of the same options, each with its own CudaDevice as compare's peers have, all on one stream,
// and times a PooledBuffer pair of B bytes on each in turn, R rounds (a slow spell of the host
// falls on every pool alike). It prints each pool's median and where its hot objects lie: the
// PoolCore, the stream's state, its free lists, the block a pair gets and the MemoryPool object,
// each as the address, its offset in a 4 KiB page and in a 64-byte line, so that a slow pool can
// be matched to a layout (a line another thread writes, or two hot addresses 4 KiB apart).
//
// `warm` first creates CUDA's context (cudaFree(0)) and two pools that are then destroyed, so
// that the pools timed are not the first objects made beside the context's own.
//
// Not built by default: `cmake --build BUILD --target streampool-probe-objects`, then
//
//   BUILD/bench/streampool-probe-objects [P=8] [B=256] [R=7] [checks=none|full] [warm]
//
// First run: bench/results/h100-compare-7a4bb3c.md (a host where no pool was slow).
#include "pool_core.hpp"
#include "stream_registry.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/pooled_buffer.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double time_pairs(streampool::MemoryPool& pool, std::size_t bytes, cudaStream_t stream) {
  for (int i = 0; i < 64; ++i) streampool::PooledBuffer<std::byte>::alloc_async(pool, bytes, stream);
  for (std::size_t n = 1024;; n *= 2) {
    const auto start = Clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      streampool::PooledBuffer<std::byte>::alloc_async(pool, bytes, stream);
    }
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (s >= 0.05) return s * 1e9 / double(n);
  }
}

void where(const char* what, const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::printf("  %s %p (page +%4lu, line +%2lu)", what, p, static_cast<unsigned long>(a % 4096),
              static_cast<unsigned long>(a % 64));
}

}  // namespace

int main(int argc, char** argv) {
  int pools = 8;
  std::size_t bytes = 256;
  int rounds = 7;
  bool warm = false;
  streampool::StreamChecks checks = streampool::StreamChecks::none;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "warm") {
      warm = true;
    } else if (arg == "checks=none") {
      checks = streampool::StreamChecks::none;
    } else if (arg == "checks=full") {
      checks = streampool::StreamChecks::full;
    } else if (positional == 0) {
      pools = std::atoi(arg.c_str()), ++positional;
    } else if (positional == 1) {
      bytes = std::strtoull(arg.c_str(), nullptr, 10), ++positional;
    } else if (positional == 2) {
      rounds = std::atoi(arg.c_str()), ++positional;
    } else {
      std::fprintf(stderr, "usage: %s [P] [B] [R] [checks=none|full] [warm]\n", argv[0]);
      return 2;
    }
  }
  if (pools < 1 || rounds < 1 || bytes == 0) {
    std::fprintf(stderr, "P, B and R must be positive\n");
    return 2;
  }
  streampool::PoolOptions options;
  options.read_environment = false;
  options.stream_checks = checks;
  if (warm) {
    cudaFree(nullptr);
    for (int i = 0; i < 2; ++i) {
      streampool::MemoryPool scratch(std::make_shared<streampool::CudaDevice>(0), options);
    }
  }
  std::vector<std::unique_ptr<streampool::MemoryPool>> made;
  for (int p = 0; p < pools; ++p) {
    made.push_back(std::make_unique<streampool::MemoryPool>(
        std::make_shared<streampool::CudaDevice>(0), options));
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "no stream\n");
    return 1;
  }
  std::vector<std::vector<double>> ns(static_cast<std::size_t>(pools));
  for (int r = 0; r < rounds; ++r) {
    for (int p = 0; p < pools; ++p) ns[std::size_t(p)].push_back(time_pairs(*made[std::size_t(p)], bytes, stream));
  }
  std::printf("%d pools, %zu B, checks=%s%s, %d rounds; ns per pair, median (min-max)\n", pools,
              bytes, checks == streampool::StreamChecks::none ? "none" : "full",
              warm ? ", warm" : "", rounds);
  for (int p = 0; p < pools; ++p) {
    auto& v = ns[std::size_t(p)];
    std::sort(v.begin(), v.end());
    streampool::MemoryPool& pool = *made[std::size_t(p)];
    streampool::detail::PoolCore& core = pool.core();
    std::error_code error;
    streampool::detail::Block* block = streampool::detail::allocate_block(pool, bytes, stream, error);
    const streampool::detail::StreamState* state = core.registry().first();
    std::printf("pool %d: %.1f (%.1f-%.1f)\n", p, v[v.size() / 2], v.front(), v.back());
    where("core", &core);
    std::printf(" size %zu\n", sizeof(core));
    where("state", state);
    where("lists", state != nullptr ? state->free.get() : nullptr);
    std::printf("\n");
    where("block", block);
    where("pool", &pool);
    std::printf("\n");
    if (block != nullptr) streampool::detail::release_block(block, stream);
  }
  made.clear();
  cudaStreamDestroy(stream);
  return 0;
}
