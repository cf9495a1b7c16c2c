// StreamOps: stream-ordered code written once, run on a GPU in production and on the fake device
// in a unit test.
//
//   void scale(streampool::StreamOps& ops, streampool::PooledBuffer<float>& x, cudaStream_t s) {
//     ops.enqueue(s, "scale", {streampool::reads(x), streampool::writes(x)},
//                 [&](cudaStream_t on) { scale_kernel<<<blocks, threads, 0, on>>>(x.data()); },
//                 [&] { for (float& v : host_view(x)) v *= 2; });  // the fake's stand-in
//   }
//
// A function written against StreamOps creates and destroys streams and events, records and
// waits, copies and sets memory and enqueues work, without knowing which device it runs on:
//   CudaStreamOps (cuda_device.hpp)  the CUDA runtime: the launch is the real kernel launch, the
//                                    accesses are not looked at, the host body never runs;
//   FakeStreamOps (fake_device.hpp)  the fake device: the launch is never called, the accesses
//                                    go to its race detector and block checks, and the host body
//                                    (if any) runs when the work completes, so that a test with
//                                    host-backed memory sees the results a kernel would leave.
// This is a layer for users' code, above the Device seam (which stays the calls the pool makes);
// events, records and waits go through the seam, so the fake counts them and can fail them.
//
// Errors: every member throws streampool::Error carrying CUDA's error when a call fails (on the
// fake, an injected fault or a misuse CUDA would refuse).
#pragma once

#include <streampool/device.hpp>
#include <streampool/export.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>

namespace streampool {

// A range of device memory that a unit of work reads or writes.
struct MemoryAccess {
  const void* ptr = nullptr;
  std::size_t bytes = 0;
  bool write = true;
};

inline MemoryAccess reads(const void* ptr, std::size_t bytes) noexcept {
  return {ptr, bytes, false};
}
inline MemoryAccess writes(const void* ptr, std::size_t bytes) noexcept {
  return {ptr, bytes, true};
}
// The whole of a buffer (a PooledBuffer<T>, or anything with data() and byte_size()).
template <class Buffer>
  requires requires(const Buffer& b) {
    b.data();
    { b.byte_size() } -> std::convertible_to<std::size_t>;
  }
MemoryAccess reads(const Buffer& buffer) noexcept {
  return {buffer.data(), buffer.byte_size(), false};
}
template <class Buffer>
  requires requires(const Buffer& b) {
    b.data();
    { b.byte_size() } -> std::convertible_to<std::size_t>;
  }
MemoryAccess writes(const Buffer& buffer) noexcept {
  return {buffer.data(), buffer.byte_size(), true};
}

// The direction of a copy, as cudaMemcpyKind names it: which side is device memory.
enum class CopyKind { host_to_device, device_to_host, device_to_device };

class STREAMPOOL_API StreamOps {
 public:
  virtual ~StreamOps() = default;
  StreamOps(const StreamOps&) = delete;
  StreamOps& operator=(const StreamOps&) = delete;

  // The device the operations run on: give it to the MemoryPool the code allocates from.
  const std::shared_ptr<Device>& device() const noexcept { return device_; }

  // A new stream (cudaStreamNonBlocking on a GPU). `name` is how the fake's hazard messages call
  // it. Destroy it only once every buffer used on it is dropped (memory_pool.hpp).
  virtual cudaStream_t create_stream(std::string_view name = {}) = 0;
  virtual void destroy_stream(cudaStream_t stream) = 0;

  // Events without timing (cudaEventDisableTiming), recorded and waited on as CUDA's are.
  cudaEvent_t create_event();
  void destroy_event(cudaEvent_t event);
  // cudaEventRecord: `event` completes when the work enqueued on `stream` so far has.
  void record(cudaEvent_t event, cudaStream_t stream);
  // cudaStreamWaitEvent: work enqueued on `stream` from now on waits for `event`.
  void wait(cudaStream_t stream, cudaEvent_t event);
  // Work enqueued on `waiter` from now on follows the work enqueued on `awaited` so far: an event
  // created, recorded on `awaited`, waited on by `waiter` and destroyed.
  void order_after(cudaStream_t waiter, cudaStream_t awaited);
  // cudaStreamSynchronize: the host waits for the work enqueued on `stream` so far.
  void synchronize(cudaStream_t stream);

  // cudaMemcpyAsync / cudaMemsetAsync on `stream`. On the fake the device side is checked like
  // any access, and the bytes move (when the fake backs its memory with host memory) as the work
  // completes: host memory must stay valid until then, as with a GPU.
  virtual void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                    cudaStream_t stream, std::string_view label = {}) = 0;
  virtual void set(void* dst, int value, std::size_t bytes, cudaStream_t stream,
                   std::string_view label = {}) = 0;

  // Enqueues one unit of work on `stream` that touches `accesses`: on a GPU, `launch(stream)`
  // (a kernel launch, say), then a check of the launch's error; on the fake, the accesses are
  // checked and `host_body`, if given, runs when the work completes. `label` names the work in
  // the fake's hazard messages. `launch` is called before enqueue returns, or not at all.
  template <class Launch>
    requires std::is_invocable_v<Launch&, cudaStream_t>
  void enqueue(cudaStream_t stream, std::string_view label,
               std::initializer_list<MemoryAccess> accesses, Launch&& launch,
               std::function<void()> host_body = {}) {
    enqueue_work(stream, label, std::span<const MemoryAccess>(accesses.begin(), accesses.size()),
                 LaunchRef{&call_launch<std::remove_reference_t<Launch>>,
                           static_cast<const void*>(std::addressof(launch))},
                 std::move(host_body));
  }
  template <class Launch>
    requires std::is_invocable_v<Launch&, cudaStream_t>
  void enqueue(cudaStream_t stream, std::string_view label, std::span<const MemoryAccess> accesses,
               Launch&& launch, std::function<void()> host_body = {}) {
    enqueue_work(stream, label, accesses,
                 LaunchRef{&call_launch<std::remove_reference_t<Launch>>,
                           static_cast<const void*>(std::addressof(launch))},
                 std::move(host_body));
  }

 protected:
  // Requires a non-null device.
  explicit StreamOps(std::shared_ptr<Device> device) noexcept : device_(std::move(device)) {}

  // A launch, not owned: valid for the call it is passed to.
  struct LaunchRef {
    void (*call)(const void* launch, cudaStream_t stream);
    const void* launch;
    void operator()(cudaStream_t stream) const { call(launch, stream); }
  };
  virtual void enqueue_work(cudaStream_t stream, std::string_view label,
                            std::span<const MemoryAccess> accesses, LaunchRef launch,
                            std::function<void()> host_body) = 0;

 private:
  template <class Launch>
  static void call_launch(const void* launch, cudaStream_t stream) {
    // Launch keeps the caller's constness: the cast only undoes the erasure.
    (*static_cast<Launch*>(const_cast<void*>(launch)))(stream);
  }

  std::shared_ptr<Device> device_;
};

}  // namespace streampool
