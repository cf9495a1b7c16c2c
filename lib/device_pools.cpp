// DevicePools: a fixed table of slots, one per ordinal, each with its own lock.
//
// Why a lock per slot and not one for the table: threads working on different GPUs never meet,
// and making a pool (a CudaDevice, whose constructor asks the driver) holds only its device's
// slot. Why no lock-free read: a lookup hands out a shared_ptr, whose copy must not race with
// set() replacing it; a per-device mutex is the simplest thing that is correct, and lookups are
// not the allocation path (callers keep the pool).
#include <streampool/cuda_device.hpp>
#include <streampool/device_pools.hpp>
#include <streampool/error.hpp>

#include <string>
#include <utility>

namespace streampool {

DevicePools::DevicePools() : DevicePools(Hooks{}) {}

DevicePools::DevicePools(Hooks hooks)
    : hooks_(std::move(hooks)), slots_(std::make_unique<std::array<Slot, max_devices>>()) {
  if (!hooks_.make_pool) {
    hooks_.make_pool = [](int ordinal) {
      return std::make_shared<MemoryPool>(std::make_shared<CudaDevice>(ordinal));
    };
  }
  if (!hooks_.current_device) hooks_.current_device = [] { return CudaDevice::current(); };
}

DevicePools::~DevicePools() = default;

DevicePools::Slot& DevicePools::slot(int ordinal) const {
  if (ordinal < 0 || ordinal >= max_devices) {
    throw Error(Errc::no_device, "DevicePools: device " + std::to_string(ordinal) +
                                     " is outside 0.." + std::to_string(max_devices - 1));
  }
  return (*slots_)[static_cast<std::size_t>(ordinal)];
}

std::shared_ptr<MemoryPool> DevicePools::pool(int ordinal) {
  Slot& s = slot(ordinal);
  std::lock_guard lock(s.mutex);
  if (s.pool == nullptr) {
    std::shared_ptr<MemoryPool> made = hooks_.make_pool(ordinal);
    if (made == nullptr) {
      throw Error(Errc::no_device,
                  "DevicePools: no pool was made for device " + std::to_string(ordinal));
    }
    s.pool = std::move(made);
  }
  return s.pool;
}

std::shared_ptr<MemoryPool> DevicePools::current() { return pool(hooks_.current_device()); }

std::shared_ptr<MemoryPool> DevicePools::set(int ordinal, std::shared_ptr<MemoryPool> pool) {
  Slot& s = slot(ordinal);
  std::shared_ptr<MemoryPool> previous;
  {
    std::lock_guard lock(s.mutex);
    previous = std::exchange(s.pool, std::move(pool));
  }
  // Returned, so that the last reference (and the pool's destruction, which may synchronize the
  // device) goes wherever the caller drops it, outside the slot's lock.
  return previous;
}

std::shared_ptr<MemoryPool> DevicePools::find(int ordinal) const {
  Slot& s = slot(ordinal);
  std::lock_guard lock(s.mutex);
  return s.pool;
}

DevicePools& device_pools() {
  // Never destroyed: see the header.
  static DevicePools* const registry = new DevicePools();
  return *registry;
}

std::shared_ptr<MemoryPool> pool_for_device(int ordinal) { return device_pools().pool(ordinal); }

std::shared_ptr<MemoryPool> current_device_pool() { return device_pools().current(); }

std::shared_ptr<MemoryPool> set_pool_for_device(int ordinal, std::shared_ptr<MemoryPool> pool) {
  return device_pools().set(ordinal, std::move(pool));
}

}  // namespace streampool
