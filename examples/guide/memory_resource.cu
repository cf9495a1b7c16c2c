// docs/guide.md, "thrust and cuda::mr": a MemoryPool as a CCCL memory resource. The resource's
// calls need no kernel, so this runs on the fake device on any machine where nvcc (which brings
// CCCL's headers) builds it. Exits with 1 when the pool does not see what the guide says.
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>
#include <streampool/memory_resource.hpp>

#include <cstddef>
#include <cstdio>

namespace {

bool right = true;
void expect(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "memory_resource: not as docs/guide.md says: %s\n", what);
  right = right && ok;
}

// guide-begin stream_ordered_ref
// CCCL renamed its references in 3.1: the stream-ordered one was async_resource_ref before.
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
using DeviceResourceRef = cuda::mr::async_resource_ref<cuda::mr::device_accessible>;
#else
using DeviceResourceRef = cuda::mr::resource_ref<cuda::mr::device_accessible>;
#endif
// guide-end

// Code written against CCCL's interface, knowing nothing of streampool.
void* allocate_through(DeviceResourceRef ref, cuda::stream_ref stream, std::size_t bytes) {
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
  return ref.allocate_async(bytes, 256, stream);
#else
  return ref.allocate(stream, bytes, 256);
#endif
}
void deallocate_through(DeviceResourceRef ref, cuda::stream_ref stream, void* ptr,
                        std::size_t bytes) {
#if STREAMPOOL_CCCL_EXPERIMENTAL_MR
  ref.deallocate_async(ptr, bytes, 256, stream);
#else
  ref.deallocate(stream, ptr, bytes, 256);
#endif
}

}  // namespace

int main() {
  auto device = std::make_shared<streampool::FakeDevice>();
  streampool::MemoryPool pool(device);
  cudaStream_t stream = device->create_stream("main");
  const std::size_t bytes = 1 << 16;

  // guide-begin memory_resource
  streampool::PoolResource resource(pool);  // the pool must outlive it
  void* p = resource.allocate(stream, bytes, 256);  // stream-ordered: MemoryPool::allocate
  resource.deallocate(stream, p, bytes, 256);       // MemoryPool::deallocate on `stream`

  DeviceResourceRef ref(resource);  // for code written against cuda::mr
  void* q = allocate_through(ref, stream, bytes);
  deallocate_through(ref, stream, q, bytes);
  // guide-end
  expect(p == q, "the second allocation reused the first's block, on the same stream");
  expect(pool.stats().live_allocations.total == 2, "both allocations were the pool's");

  bool refused = false;
  try {
    // guide-begin memory_resource_alignment
    resource.allocate(stream, bytes, 4096);  // Error(Errc::invalid_value): over 256 B
    // guide-end
  } catch (const streampool::Error& e) {
    refused = e.errc() == streampool::Errc::invalid_value;
  }
  expect(refused, "an alignment over PoolResource::guaranteed_alignment is refused");

  device->complete_all();
  device->destroy_stream(stream);
  expect(device->hazards().empty(), "no hazard");
  return right ? 0 : 1;
}
