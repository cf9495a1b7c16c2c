// docs/guide.md, "Several devices": one pool per device through DevicePools. On the fake device
// (two FakeDevices of ordinals 0 and 1, the current device a variable of the test) it runs
// everywhere; the same lookups over real GPUs (current_device_pool) run where there is a GPU.
// Exits with 1 when the pools are not what the guide says they are.
#include <streampool/streampool.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>

using streampool::PooledBuffer;

namespace {

bool right = true;
void expect(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "several_devices: not as docs/guide.md says: %s\n", what);
  right = right && ok;
}

// On GPUs: the process's registry, each pool made on a CudaDevice on its first lookup.
void on_gpus() {
  // guide-begin several_devices_gpu
  const int devices = streampool::CudaDevice::count();
  for (int d = 0; d < devices; ++d) {
    cudaSetDevice(d);
    std::shared_ptr<streampool::MemoryPool> pool = streampool::current_device_pool();
    cudaStream_t stream = nullptr;  // a stream of device d, for device d's pool
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    {
      auto buffer = PooledBuffer<float>::alloc_async(*pool, 1 << 20, stream);
      // ... kernels on `stream` use buffer.data()
    }
    cudaStreamSynchronize(stream);
    pool->release_stream(stream);
    cudaStreamDestroy(stream);
  }
  // guide-end
  for (int d = 0; d < devices; ++d) {
    expect(streampool::pool_for_device(d)->device().ordinal() == d, "each pool on its device");
  }
}

}  // namespace

int main() {
  // guide-begin several_devices
  int current = 0;  // the test's current device: FakeDevice knows none
  std::shared_ptr<streampool::FakeDevice> fakes[2];  // kept: the pools' device() may wrap them
  streampool::DevicePools::Hooks hooks;
  hooks.make_pool = [&fakes](int ordinal) {
    streampool::FakeDevice::Options options;
    options.ordinal = ordinal;
    options.peers = ordinal == 0 ? 0b10 : 0b01;  // each may reach the other's memory
    fakes[ordinal] = std::make_shared<streampool::FakeDevice>(options);
    return std::make_shared<streampool::MemoryPool>(fakes[ordinal]);
  };
  hooks.current_device = [&current] { return current; };
  streampool::DevicePools pools(hooks);

  std::shared_ptr<streampool::MemoryPool> pool0 = pools.pool(0);  // made on this first lookup
  current = 1;
  std::shared_ptr<streampool::MemoryPool> pool1 = pools.current();  // device 1's
  cudaStream_t stream1 = fakes[1]->create_stream("device 1");
  auto on_1 = PooledBuffer<float>::alloc_async(*pool1, 1000, stream1);
  // guide-end
  cudaStream_t stream0 = fakes[0]->create_stream("device 0");
  auto on_0 = PooledBuffer<float>::alloc_async(*pool0, 1000, stream0);

  // guide-begin several_devices_peer
  pool0->grant_access(1);  // device 1's kernels may use pool0's memory, handed out or not yet
  auto shared = PooledBuffer<float>::alloc_async(*pool0, 1 << 20, stream0);
  // ... a kernel of device 1 may now read shared.data() and on_0.data()
  // guide-end
  expect(fakes[0]->accessible_from(shared.data(), 1) && fakes[0]->accessible_from(on_0.data(), 1),
         "device 1 reaches pool0's memory once granted");
  expect(!fakes[1]->accessible_from(on_1.data(), 0),
         "device 0 does not reach pool1's memory: not granted");
  shared.reset();

  expect(pool0->device().ordinal() == 0 && pool1->device().ordinal() == 1,
         "each pool on the fake of its ordinal");
  expect(pools.pool(1) == pool1 && pools.current() == pool1, "a lookup returns the same pool");
  expect(pools.find(2) == nullptr, "find makes no pool");
  // The fakes' address windows are 1 TiB apart, as GPUs share one address space.
  const auto at0 = reinterpret_cast<std::uintptr_t>(on_0.data());
  const auto at1 = reinterpret_cast<std::uintptr_t>(on_1.data());
  expect((at0 > at1 ? at0 - at1 : at1 - at0) >= (std::uintptr_t{1} << 40),
         "the two devices' addresses are 1 TiB apart or more");

  // guide-begin several_devices_set
  auto mine = std::make_shared<streampool::MemoryPool>(
      std::make_shared<streampool::FakeDevice>(), streampool::PoolOptions{});
  std::shared_ptr<streampool::MemoryPool> replaced = pools.set(0, mine);  // pool0, still alive
  // guide-end
  expect(replaced == pool0 && pools.pool(0) == mine, "set installs a pool and returns the old");

  on_0.reset();
  on_1.reset();
  fakes[0]->complete_all();
  fakes[1]->complete_all();
  fakes[0]->destroy_stream(stream0);
  fakes[1]->destroy_stream(stream1);
  expect(fakes[0]->hazards().empty() && fakes[1]->hazards().empty(), "no hazard");

  if (streampool::CudaDevice::count() > 0) on_gpus();
  return right ? 0 : 1;
}
