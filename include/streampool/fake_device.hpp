// FakeDevice: a simulated GPU behind the Device seam, for tests on machines without one.
//
// It is part of the product: link streampool::fake_device (a library of its own beside
// streampool::streampool), build a FakeDevice, hand it to a MemoryPool (or use it directly) and
// unit-test stream-ordered GPU code on any machine. It simulates, faithfully where the correctness
// of stream-ordered allocation depends on it:
//
//   memory   addresses in a simulated device address space, 256-byte aligned and never reused,
//            in a window of its own for each ordinal (1 TiB apart, as GPUs share one address
//            space, so two fakes of different ordinals never give the same address), not backed
//            by host memory; or, with Options::host_backed, host mappings of the process's own
//            (so any two fakes' addresses differ too); a capacity past which malloc fails with
//            cudaErrorMemoryAllocation.
//   virtual  the cuMem* calls: reservations of addresses, physical memory counted against the
//   memory   capacity from creation to release-and-unmap, mappings that become accessible once
//            their access is set; every precondition of device_calls.def checked (alignment to
//            the granularity, mapping only where nothing is, unmapping whole mappings, freeing
//            a reservation only when nothing is mapped in it: cudaErrorInvalidValue otherwise).
//            Options::virtual_memory = false makes them cudaErrorNotSupported, as a device
//            without virtual memory management does. Host-backed contents belong to the
//            mapping, not to the physical memory: a handle mapped twice does not share them
//            (the pool maps each handle once).
//   work     launch(stream) enqueues a unit of work that stays pending until complete(stream),
//            complete_all(), or a synchronize that covers it (or at once with auto-complete).
//            Work completes in stream order; waiting on an event makes later work of a stream
//            depend on the work the event covers.
//   events   complete when the work enqueued on their stream before the record has completed.
//   capture  the three modes, with the calls CUDA refuses during capture refused the same way
//            (and the capture invalidated; an invalidated capture refuses them too until it
//            ends); captured work replays when the graph is launched. A
//            stream that waits on an event recorded in a capture joins it, and the capture ends
//            only once the stream is joined back (cudaErrorStreamCaptureUnjoined otherwise).
//   faults   fail_next(call) makes the next calls of a kind fail with CUDA's error for it;
//            calls(call) counts them.
//   hazards  a launch may name the memory it reads and writes; two accesses to the same bytes,
//            at least one a write, from work that stream order and events do not order (the
//            earlier one still pending when the later is launched), are a race, recorded in
//            hazards(). So is an access outside any live allocation, and a CUDA call from inside
//            a user object's destructor.
//   blocks   a pool over the fake tells it which of its blocks are live (the notifications of
//            device_calls.def), so that every access to pool memory is checked against them,
//            whatever completed and whether or not the pool reuses anything: out of bounds of
//            the block, use after its drop, an access on another stream that neither stream
//            order, event waits nor host synchronization orders after the allocation and the
//            block's earlier conflicting accesses, a use on a stream the drop does not cover
//            (neither the drop's stream, nor named by record_stream, nor waited for by the drop's
//            stream), and a stream destroyed while a block allocated or recorded on it is live.
//            Hazard::Kind lists them; docs/testing-your-code.md says what each means.
//
// Streams are identified as in CUDA: handles of destroyed streams are reused at once by the next
// create_stream(); stream ids never are. cudaStreamPerThread names a different stream in each
// thread, a blocking one; create_stream() makes non-blocking streams (as cudaStreamNonBlocking
// does); 0 and cudaStreamLegacy name the legacy default stream. While a blocking stream captures,
// calls naming the legacy stream are refused with cudaErrorStreamCaptureImplicit, as CUDA refuses
// them (a record, a wait, a synchronize or a launch on it also invalidates the capture; so does a
// graph launch or upload there, by analogy; stream_id is answered, not having been probed). Not
// simulated: the legacy stream waiting on an event recorded in a capture (it neither joins nor is
// refused), the legacy default stream's implicit synchronization with blocking streams (the
// fake orders it with no other stream, which can only report more hazards, never fewer), timing,
// a current device and
// peer access beyond its bookkeeping (each fake is one device of its ordinal: Options::peers
// names the devices that may reach its memory, vm_set_access and enable_peer_access record them
// for accessible_from, and only its own kernels run), and the order inside a
// graph (its work replays in the order it was captured, whichever stream of the capture it was
// launched on).
//
// Thread-safe: every member may be called from any thread.
#pragma once

#include <streampool/device.hpp>
#include <streampool/export.hpp>
#include <streampool/stream_ops.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace streampool {

class STREAMPOOL_API FakeDevice final : public Device {
 public:
  struct Options {
    // 0 to 63 (a mask of devices has a bit for each, as for vm_set_access); the constructor
    // throws std::invalid_argument for others.
    int ordinal = 0;
    // Device memory capacity in bytes; malloc fails past it.
    std::size_t capacity = std::size_t{80} << 30;
    // Back each allocation with host memory, so that tests (and work bodies) can read and write
    // it through the returned address. Off by default: a replay of tens of GB then costs nothing.
    bool host_backed = false;
    // Work completes as soon as it is launched.
    bool auto_complete = false;
    // The virtual memory calls work (with this granularity), or say cudaErrorNotSupported.
    bool virtual_memory = true;
    std::size_t vm_granularity = std::size_t{2} << 20;
    // The other devices whose kernels can reach this device's memory (cudaDeviceCanAccessPeer
    // says yes), bit d for device d: vm_set_access and enable_peer_access take them, and refuse
    // any other device with cudaErrorInvalidDevice. None by default.
    std::uint64_t peers = 0;
  };

  // One kind per seam call.
  enum class Call {
#define STREAMPOOL_DEVICE_CALL(name, params, args) name,
#include <streampool/device_calls.def>
  };
  static constexpr int call_kinds = 0
#define STREAMPOOL_DEVICE_CALL(name, params, args) +1
#include <streampool/device_calls.def>
      ;

  // A range of device memory that a unit of work reads or writes (stream_ops.hpp).
  using Access = MemoryAccess;

  // A race or misuse the simulation saw. `what` says which accesses conflicted: the streams (by
  // handle, and the name given at creation), the bytes, the block and its size where the memory
  // is a pool's, and the label each access's work was launched with.
  struct Hazard {
    enum class Kind {
      // Two accesses to the same bytes, one a write, the earlier still pending when the later
      // was launched, that no stream order or event wait orders.
      race,
      // Not inside one live allocation; for a pool's memory, not inside one live block.
      out_of_bounds,
      // A CUDA call from a user object's destructor, where CUDA forbids them.
      call_in_user_object_destructor,
      // Pool memory touched by work launched after the block's drop.
      use_after_drop,
      // An access to a live pool block that is not ordered after the allocation, or after an
      // earlier access to the same bytes in the block's life, one of the two a write: stream
      // order, event waits and host synchronization count, completion does not.
      unordered_access,
      // A block dropped while work on a stream other than the drop's used it, and neither
      // record_stream named that stream nor did the drop's stream wait for that work.
      unrecorded_use,
      // A stream destroyed while a live block was allocated on it or recorded on it.
      destroyed_stream,
      // Memory unmapped (vm_unmap) while work that reads or writes it is still pending: on a
      // GPU that work faults or touches whatever is mapped there next. The fake keeps the
      // bytes readable until the end, so the work still runs.
      unmapped_in_use,
      // A device call named a destroyed stream's handle that no stream has taken since: on an
      // H100 CUDA's capture-status query of one crashed the process (test/gpu/probes.cpp,
      // 2026-12-07). The fake answers cudaErrorInvalidResourceHandle, and reports it.
      destroyed_handle,
    };
    Kind kind;
    std::string what;
    // The base of the pool block the hazard is about (the block in `what`): set for every kind
    // that names one (out_of_bounds past a block's end, use_after_drop, unordered_access,
    // unrecorded_use, destroyed_stream), null otherwise.
    const void* block = nullptr;
  };
  // "race", "out_of_bounds", ...: the enumerator's name.
  static const char* hazard_name(Hazard::Kind kind) noexcept;

  FakeDevice();
  explicit FakeDevice(Options options);
  // Drops pending work without running its bodies, and runs the destructors of the user objects
  // still alive, so that nothing they own leaks.
  ~FakeDevice() override;
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  // --- the simulation's controls (not seam calls: never counted, never failed) ------------
  // Naming an unknown or destroyed stream in a control is a bug in the test: it throws
  // std::invalid_argument.

  // `name`, if given, is how hazard messages call the stream, beside its handle.
  cudaStream_t create_stream(std::string name = {});
  // Destroys a stream: its pending work stays pending (and completes when completed), and its
  // handle goes to the next create_stream(), as CUDA does. The stream that began a capture ends
  // it on every stream that joined it (seen on an H100).
  void destroy_stream(cudaStream_t stream);

  // Enqueues a unit of work on `stream` touching `accesses`; `body`, if given, runs when the work
  // completes (on the thread that completes it), so it can write host-backed memory like a
  // kernel would. The work is complete once its body has returned: while the body runs, the
  // work, the events recorded after it and the work waiting for it are pending, as a kernel's
  // are until it finishes. On a capturing stream the work is captured instead and runs on each
  // launch of the graph. Bodies run in stream order with no lock of the fake held, so they may
  // call it; completions are serialized, so a body must not wait for another thread that
  // completes work, and work of its own stream or waiting for it cannot complete inside it: a
  // synchronize there that waits for it returns cudaErrorNotPermitted.
  // `label` says in hazard messages where the work was enqueued (a kernel's name, say).
  // On the legacy default stream while a blocking stream (cudaStreamPerThread) captures, it
  // throws streampool::Error with cudaErrorStreamCaptureImplicit and invalidates that capture,
  // as CUDA refuses such a launch.
  void launch(cudaStream_t stream, std::initializer_list<Access> accesses = {},
              std::function<void()> body = {}, std::string_view label = {});
  void launch(cudaStream_t stream, const std::vector<Access>& accesses,
              std::function<void()> body = {}, std::string_view label = {});
  // Completes the work enqueued on `stream` so far (and, first, whatever it waits on).
  void complete(cudaStream_t stream);
  // Completes all pending work.
  void complete_all();
  void set_auto_complete(bool on);
  // The number of units of work enqueued and not yet complete, on all streams.
  std::size_t pending_work() const;

  void set_capacity(std::size_t bytes);
  std::size_t live_bytes() const;
  std::size_t live_allocations() const;
  // Virtual memory: handles created and not yet released, and reservations not yet freed.
  std::size_t live_vm_handles() const;
  std::size_t live_reservations() const;
  // Graphs and executable graphs made and not yet destroyed.
  std::size_t live_graphs() const;
  // Whether kernels of device `device` could use the byte at `ptr`: memory from malloc for this
  // device and the peers enable_peer_access named, a mapping for the devices vm_set_access gave
  // it (a fake launches as its own device only; this is how tests see what a peer could reach).
  bool accessible_from(const void* ptr, int device) const;

  // The next `count` calls of `call` fail with `error` (by default, the error CUDA gives for
  // that call when it runs out of resources: cudaErrorMemoryAllocation for malloc, creation and
  // instantiation, cudaErrorLaunchFailure for the rest). A failed call has no effect.
  void fail_next(Call call, int count = 1);
  void fail_next(Call call, int count, cudaError_t error);
  // How many calls of this kind were made (failed ones included).
  std::uint64_t calls(Call call) const;
  std::uint64_t total_calls() const;
  // Launches of this executable graph so far.
  std::uint64_t graph_launches(cudaGraphExec_t exec) const;
  // User objects whose destructor has not run yet.
  std::size_t live_user_objects() const;
  // Events created and not yet destroyed.
  std::size_t live_events() const;

  std::vector<Hazard> hazards() const;
  void clear_hazards();
  const Options& options() const noexcept;

  static const char* call_name(Call call) noexcept;

  // --- the seam ---------------------------------------------------------------------------

  int ordinal() const noexcept override;
  // Yes: the fake checks accesses against the pool's live blocks.
  bool wants_notifications() const noexcept override { return true; }
#define STREAMPOOL_DEVICE_CALL(name, params, args) cudaError_t name params noexcept override;
#define STREAMPOOL_DEVICE_NOTE(name, params, args) void name params noexcept override;
#include <streampool/device_calls.def>

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// StreamOps (stream_ops.hpp) on a FakeDevice: streams are the fake's, with their names; work is a
// launch of the fake with the accesses, the label and the host body (the launch itself is never
// called); a copy or set checks its device side and, on a host-backed fake, moves the bytes when
// it completes.
class STREAMPOOL_API FakeStreamOps final : public StreamOps {
 public:
  // Requires a non-null device.
  explicit FakeStreamOps(std::shared_ptr<FakeDevice> device);

  FakeDevice& fake() const noexcept { return *fake_; }

  cudaStream_t create_stream(std::string_view name = {}) override;
  void destroy_stream(cudaStream_t stream) override;
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind, cudaStream_t stream,
            std::string_view label = {}) override;
  void set(void* dst, int value, std::size_t bytes, cudaStream_t stream,
           std::string_view label = {}) override;

 private:
  void enqueue_work(cudaStream_t stream, std::string_view label,
                    std::span<const MemoryAccess> accesses, LaunchRef launch,
                    std::function<void()> host_body) override;

  std::shared_ptr<FakeDevice> fake_;
};

}  // namespace streampool
