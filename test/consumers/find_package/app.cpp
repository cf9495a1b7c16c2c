// A consumer's program: links streampool::streampool alone (no FakeDevice), so it also shows that
// the main library needs nothing of the fake device's. Without a GPU it only checks what needs
// none, and says so.
#include <streampool/streampool.hpp>

#include <cstdio>
#include <string>

int main() {
  // The library the program runs with is the one its headers describe.
  if (streampool::version() != STREAMPOOL_VERSION_STRING) {
    std::fprintf(stderr, "version() %s, headers %s\n", std::string(streampool::version()).c_str(),
                 STREAMPOOL_VERSION_STRING);
    return 1;
  }
  // fmt reaches the consumer through the target: <streampool/format.hpp> and PoolStats.
  const std::string line = fmt::format("{}", streampool::PoolStats{});
  if (line.empty()) return 1;
  if (streampool::CudaDevice::count() == 0) {
    std::printf("streampool %s linked; no CUDA device, nothing allocated\n",
                std::string(streampool::version()).c_str());
    return 0;
  }
  streampool::MemoryPool pool(std::make_shared<streampool::CudaDevice>(0));
  void* memory = pool.allocate(1 << 20, cudaStreamPerThread);
  pool.deallocate(memory, 1 << 20, cudaStreamPerThread);
  std::printf("streampool %s: %s\n", std::string(streampool::version()).c_str(), line.c_str());
  return 0;
}
