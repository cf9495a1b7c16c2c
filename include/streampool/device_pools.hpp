// DevicePools: one MemoryPool per device, and the pool of the device that is current.
//
//   cudaSetDevice(1);
//   auto pool = streampool::current_device_pool();   // device 1's pool, made on first use
//   auto buffer = streampool::PooledBuffer<float>::alloc_async(*pool, n, stream_on_device_1);
//
// A MemoryPool serves one device (its Device); a process that uses several GPUs needs one pool
// each, and code far from where the pools are made needs a way to find them. The process's
// registry is device_pools(); the free functions below are shorthands for it. A pool is made on
// the first lookup of its device, on a CudaDevice of that ordinal with default options (and
// STREAMPOOL_CONF), unless one was installed for it first with set_pool_for_device.
//
// Which device is current: what CudaDevice::current() says (cudaGetDevice), for the calling
// thread. Looking a pool up never changes the current device, nor does any call of the pool
// (CudaDevice makes its own device current around each CUDA call and restores the caller's).
// Streams belong to a device: allocate from a pool only on streams of that pool's device.
//
// Lifetime: a lookup returns a shared_ptr, so a pool stays alive while anyone holds it, even
// after set_pool_for_device replaced it. The process's registry itself is never destroyed (pools
// may be used from other static destructors; the driver takes device memory back at exit), so
// its pools live until the process ends unless replaced or removed (set_pool_for_device(d,
// nullptr)). A lookup takes the device's own lock and copies a shared_ptr: hold on to the pool
// in a loop instead of looking it up per allocation.
//
// Tests build a DevicePools of their own, with hooks that make pools over FakeDevices and say
// which device is current (FakeDevice knows no current device).
//
// Thread-safe: every member may be called from any thread.
#pragma once

#include <streampool/export.hpp>
#include <streampool/memory_pool.hpp>

#include <array>
#include <functional>
#include <memory>
#include <mutex>

namespace streampool {

class STREAMPOOL_API DevicePools {
 public:
  // Ordinals 0 .. max_devices - 1; others are Error(Errc::no_device).
  static constexpr int max_devices = 64;

  // Hooks may be called from several threads at once; make_pool runs under the device's lock,
  // so it must not look up that device in the same registry.
  struct Hooks {
    // Makes the pool of a device on its first lookup; may throw (the lookup then throws the
    // same, and a later lookup tries again). Default: MemoryPool(CudaDevice(ordinal)).
    std::function<std::shared_ptr<MemoryPool>(int ordinal)> make_pool;
    // The calling thread's current device. Default: CudaDevice::current().
    std::function<int()> current_device;
  };

  // The hooks left empty take their defaults.
  DevicePools();
  explicit DevicePools(Hooks hooks);
  ~DevicePools();
  DevicePools(const DevicePools&) = delete;
  DevicePools& operator=(const DevicePools&) = delete;

  // The pool of device `ordinal`, made now if it has none. Throws Error(Errc::no_device) for an
  // ordinal out of range, and whatever making the pool throws (no_device without that GPU).
  std::shared_ptr<MemoryPool> pool(int ordinal);
  // The pool of the calling thread's current device.
  std::shared_ptr<MemoryPool> current();
  // Installs `pool` (null: none, and the next lookup makes one) for device `ordinal` and returns
  // the one it replaces (null if none). The registry does not check that the pool's device has
  // that ordinal: a FakeDevice's ordinal is whatever its options say. Throws Error(no_device)
  // for an ordinal out of range.
  std::shared_ptr<MemoryPool> set(int ordinal, std::shared_ptr<MemoryPool> pool);
  // The pool of device `ordinal` if it has one, without making one (null otherwise).
  std::shared_ptr<MemoryPool> find(int ordinal) const;

 private:
  struct Slot {
    mutable std::mutex mutex;  // guards `pool`; held while the pool is made, so it is made once
    std::shared_ptr<MemoryPool> pool;
  };
  Slot& slot(int ordinal) const;

  Hooks hooks_;
  std::unique_ptr<std::array<Slot, max_devices>> slots_;
};

// The process's registry.
STREAMPOOL_API DevicePools& device_pools();

// device_pools().pool(ordinal), .current() and .set(ordinal, pool).
STREAMPOOL_API std::shared_ptr<MemoryPool> pool_for_device(int ordinal);
STREAMPOOL_API std::shared_ptr<MemoryPool> current_device_pool();
STREAMPOOL_API std::shared_ptr<MemoryPool> set_pool_for_device(int ordinal,
                                                              std::shared_ptr<MemoryPool> pool);

}  // namespace streampool
