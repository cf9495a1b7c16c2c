// The observer: the pool's hook for a layer that watches its public calls (the trace recorder,
// lib/trace/). The pool core never calls it and knows nothing of what it does: it only keeps the
// pointer (PoolCore::observer()), so that the public entry points (memory_pool.cpp), which reach
// the core from a MemoryPool or from a block, can find it. Nothing under lib/pool/ but
// memory_pool.cpp calls these.
//
// Where the calls are made, and why there:
//   - allocated: after an allocation succeeded, before the caller gets the pointer, so that no
//     thread can free it (and see its free recorded) before its allocation is recorded;
//   - freeing, dropping: before the free, so that no thread can be handed the memory again (and record that
//     allocation) before this free is recorded;
//   - recorded_stream, releasing_stream: after the pool's own work on them succeeded.
// All calls of one pool may come from many threads at once; an observer does its own locking.
// None of them may make a device call (they run where calls_allowed() forbids some) or throw.
#pragma once

#include <streampool/device.hpp>

#include <cstddef>

namespace streampool::detail {

class Observer {
 public:
  virtual ~Observer() = default;

  // `bytes`: the size asked for. `stream`: the stream the allocation is ordered on.
  virtual void allocated(const void* ptr, std::size_t bytes, cudaStream_t stream) noexcept = 0;
  // A deallocate: `stream` is the stream the free is ordered on, as the calling thread names it.
  virtual void freeing(const void* ptr, cudaStream_t stream) noexcept = 0;
  // A buffer's drop, ordered on the buffer's own stream: the one its allocation was, which the
  // dropping thread may not be able to name (another thread's cudaStreamPerThread).
  virtual void dropping(const void* ptr) noexcept = 0;
  // PooledBuffer::record_stream(stream) of the buffer at `ptr`.
  virtual void recorded_stream(const void* ptr, cudaStream_t stream) noexcept = 0;
  // MemoryPool::release_stream(stream): its handle may name another stream from now on.
  virtual void releasing_stream(cudaStream_t stream) noexcept = 0;
  // The MemoryPool object is being destroyed (buffers may still be alive and dropped later).
  virtual void closing() noexcept = 0;
};

}  // namespace streampool::detail
