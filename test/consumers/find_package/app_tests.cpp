// A consumer's unit test on the fake device (streampool::fake_device): the pool, a PooledBuffer,
// the race detector and an Error thrown inside the library and caught here.
#include <streampool/streampool.hpp>

#include <cstdio>

#define EXPECT(condition)                                                          \
  do {                                                                             \
    if (!(condition)) {                                                            \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #condition); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

int main() {
  auto device = std::make_shared<streampool::FakeDevice>();
  streampool::MemoryPool pool(device);
  const cudaStream_t stream = device->create_stream();
  {
    auto buffer = streampool::PooledBuffer<float>::alloc_async(pool, 1024, stream);
    EXPECT(buffer.len() == 1024);
    device->launch(stream, {{buffer.data(), buffer.byte_size(), true}});
  }
  // Reused on its own stream while the work is pending: stream order makes that safe.
  auto again = streampool::PooledBuffer<float>::alloc_async(pool, 1024, stream);
  EXPECT(pool.stats().cache_hits == 1);
  again.reset();
  device->complete_all();
  EXPECT(device->hazards().empty());

  bool thrown = false;
  try {
    (void)pool.allocate(0, stream);
  } catch (const streampool::Error& error) {
    thrown = error.errc() == streampool::Errc::invalid_value;
  }
  EXPECT(thrown);

  pool.release_stream(stream);
  device->destroy_stream(stream);
  std::printf("streampool %s on the fake device: %s\n", std::string(streampool::version()).c_str(),
              streampool::to_string(pool.stats()).c_str());
  return 0;
}
