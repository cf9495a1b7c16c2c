// The gate: the pool's one interface to stream capture. The capture layer (lib/capture/) sits
// above the pool and implements it; nothing else under lib/pool/ knows that captures exist.
//
// What the pool asks of it:
//   - which device calls this thread may make now: CUDA refuses some calls while a capture is
//     under way, and invalidates the capture (docs/design.md, and the comments of
//     device_calls.def); each is made under a permit (CallPermit), so that no capture begins
//     between the decision and the call;
//   - a gate on allocation and drop: a stream the capture layer has bound to a capture (its
//     state's `gated` attention bit), or a stream CUDA reports capturing, sends its allocations
//     to Gate::allocate; a drop on a bound stream, or of memory a layer above owns
//     (Block::keeper), goes to Gate::take_drop, and so does every drop while the gate is busy
//     (PoolCore::gate_busy_begins: a capture with a pool under way, which any stream may join by
//     waiting on an event recorded in it);
//   - a stream's capture status, asked without ever asking a capturing stream's id (CUDA refuses
//     that too, and invalidates the capture);
//   - a safe point: the pool calls it where no lock is held and nothing it does could be refused,
//     so that the layer completes what it deferred (graph releases).
#pragma once

#include "block.hpp"
#include "failure.hpp"

#include <streampool/device.hpp>
#include <streampool/error.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace streampool::detail {

struct StreamState;

// Calls a capture under way may refuse.
enum class Restricted {
  malloc,        // cudaMalloc: refused by a global capture anywhere, or a thread-local one here
                 // (cudaDeviceEnablePeerAccess, of MemoryPool::grant_access, taken as alike)
  event_wait,    // cudaEventQuery, cudaEventSynchronize on outside events: likewise
  stream_sync,   // cudaStreamSynchronize of a stream not capturing: likewise
  free,          // cudaFree: it synchronizes the device, so never during any capture
  device_sync,   // cudaDeviceSynchronize: any capture, relaxed ones included (seen on the H200)
  // An event record on, a wait of, or a synchronize of the legacy stream: while a blocking
  // stream captures, in any mode, CUDA refuses each from any thread and invalidates that capture
  // (cudaErrorStreamCaptureImplicit, seen on an H100). Taken as a free (any capture): a blocking
  // stream may join a capture of any stream (a wait on an event recorded in it) unseen by the
  // library, and restricts the legacy stream from then on (found in review, 2026-12-08).
  legacy_stream,
  // cuMemCreate, cuMemMap, cuMemSetAccess (and cuMemUnmap, cuMemRelease of what a failed growth
  // mapped): allowed during a capture of every mode, from any thread, and the capture stays
  // active (the device contract asserts it, on the H200 too). Not the reservation of addresses
  // nor the granularity query: the probes saw them allowed as well, but the contract does not
  // assert them, and a reservation first asks cudaMemGetInfo, whose answer during a capture no
  // result records; the pool makes them only where it makes cudaMalloc.
  vm_map,
};

// Defined by the capture layer (capture_guard.cpp), over the captures begun through the library.
// Whether `call` would be allowed now: for a plan only. A call itself is made under a CallPermit.
bool calls_allowed(Restricted call) noexcept;

// Taken for a restricted call before it is decided and held until the call has returned: a
// capture's begin, once counted (so that every later check sees it), waits until the permits
// given before it are returned, so that no capture begins between a check and its call (found
// in review, 2026-12-07: a global capture begun while another thread's growth was past its check
// was invalidated by that thread's cudaMalloc). Refused where calls_allowed(call) is false. A
// permit is never held across a wait for something a capture's begin holds (no lock is held by
// a begin while it waits), nor across code of the caller's (it could begin a capture) but for
// the Device's own methods: a Device of the user's must not begin a capture, nor wait for a
// thread that does. Nested permits on one thread are allowed. A begin waits only for the
// permits of calls its mode refuses (capture_guard.cpp).
std::atomic<int>* take_permit(Restricted call) noexcept;  // the slot taken, or null
void return_permit(std::atomic<int>* slot) noexcept;
class CallPermit {
 public:
  CallPermit() noexcept = default;  // refused
  explicit CallPermit(Restricted call) noexcept : slot_(take_permit(call)) {}
  CallPermit(CallPermit&& other) noexcept : slot_(std::exchange(other.slot_, nullptr)) {}
  CallPermit& operator=(CallPermit&& other) noexcept {
    if (this != &other) {
      release();
      slot_ = std::exchange(other.slot_, nullptr);
    }
    return *this;
  }
  CallPermit(const CallPermit&) = delete;
  CallPermit& operator=(const CallPermit&) = delete;
  ~CallPermit() { release(); }
  explicit operator bool() const noexcept { return slot_ != nullptr; }
  // Returned before the end of its scope (a wait follows that needs no permit).
  void release() noexcept {
    if (slot_ != nullptr) return_permit(std::exchange(slot_, nullptr));
  }

 private:
  std::atomic<int>* slot_ = nullptr;
};

// The legacy default stream: a null handle, or cudaStreamLegacy.
inline bool is_legacy_stream(cudaStream_t stream) noexcept {
  return stream == nullptr || stream == cudaStreamLegacy;
}
// For a call on `stream` that a blocking stream's capture refuses where `stream` is the legacy one
// (an event record, a wait, a synchronize: Restricted::legacy_stream): a permit on the legacy
// stream, whose own look decides (that stream never captures itself); no other stream's calls
// are restricted by another stream's capture, and its own capture is its gate's. True when the
// call may be made; held until it returns.
class LegacyPermit {
 public:
  explicit LegacyPermit(cudaStream_t stream) noexcept
      : needed_(is_legacy_stream(stream)),
        permit_(needed_ ? CallPermit(Restricted::legacy_stream) : CallPermit()) {}
  explicit operator bool() const noexcept { return !needed_ || static_cast<bool>(permit_); }

 private:
  bool needed_;
  CallPermit permit_;
};
// For a synchronize of `stream`: refused where the capture's mode refuses cudaStreamSynchronize
// (Restricted::stream_sync), and on the legacy stream where a blocking stream captures.
class SyncPermit {
 public:
  explicit SyncPermit(cudaStream_t stream) noexcept
      : sync_(Restricted::stream_sync), legacy_(stream) {}
  explicit operator bool() const noexcept {
    return static_cast<bool>(sync_) && static_cast<bool>(legacy_);
  }

 private:
  CallPermit sync_;
  LegacyPermit legacy_;
};

// The capture layer counts over each capture it left under way (capture_guard.hpp) that CUDA
// now says is over; then, once no thread is still asking CUDA about a left capture's stream, says
// whether none is left on `stream` (true for the per-thread and legacy streams, which are never
// destroyed). release_stream
// calls it: the caller's way to have a capture left on a stream seen over before destroying that
// stream (a settle asks the status of a stream it remembers, and CUDA's query of a destroyed
// stream's handle crashed the process on an H100).
bool settled_here(cudaStream_t stream) noexcept;
// Throws (capture_forbids_call) unless settled_here(stream): `call` cannot be the caller's last
// step before destroying the stream.
inline void refuse_if_left(cudaStream_t stream, const char* call) {
  if (settled_here(stream)) return;
  throw Error(Errc::capture_forbids_call,
              std::string(call) + ": a capture given up before its end is still counted on the "
                                  "stream (CUDA has not said it ended): end it, then call " +
                  call + " again before destroying the stream");
}

// Captures with a pool under way anywhere in the program (the gate is "engaged"). While there is
// one, every stream lookup asks the capture status before the id. Inline: the identity
// strategy's allocation reads it (one load of a line written only when a capture begins or
// ends).
extern std::atomic<int> gate_engagements;
inline bool gate_engaged() noexcept {
  return gate_engagements.load(std::memory_order_acquire) != 0;
}

// A stream's capture status (cudaStreamIsCapturing, then cudaStreamGetCaptureInfo for the id of
// a capture under way: both allowed during capture in every mode).
struct GateStatus {
  cudaError_t error = cudaSuccess;
  CaptureStatus status = CaptureStatus::none;
  CaptureId id = 0;
  bool capturing() const noexcept { return error == cudaSuccess && status != CaptureStatus::none; }
  bool ordinary() const noexcept { return error == cudaSuccess && status == CaptureStatus::none; }
  bool invalidated() const noexcept { return status == CaptureStatus::invalidated; }
  // Capture `of` (0: any) is active on the stream (the id asked too: the capture layer's
  // capture_now). An invalidated capture is not: it records nothing more.
  bool active(CaptureId of = 0) const noexcept {
    return error == cudaSuccess && status == CaptureStatus::active && (of == 0 || id == of);
  }
  // Capture `of` (0: any) may still refuse calls: it is active, or a capture of the stream is
  // invalidated and not yet ended (it has no id: it may be `of`; CUDA refuses what an active one
  // refuses until its end, seen on an H100), or CUDA could not tell. A capture let go now stays
  // counted as under way.
  bool restricting(CaptureId of = 0) const noexcept {
    return error != cudaSuccess || invalidated() || active(of);
  }
};
// The status alone first: every checked allocation asks it, and almost always there is no
// capture (the status alone costs 15-20 ns on the H200, with the id 18-27; a same-stream pair
// showed no difference beyond the host's noise: bench/results/h200-capture-status-ab-7832406.md).
// A capture that ended or began between the two questions is seen as the second one says.
inline GateStatus gate_status_after(Device& device, cudaStream_t stream,
                                    GateStatus first) noexcept;
// The status alone: gate_status's first question, for a caller that asks the rest
// (gate_status_after) only where the answer is not ordinary().
inline GateStatus gate_status_first(Device& device, cudaStream_t stream) noexcept {
  GateStatus s;
  s.error = device.capture_info(stream, &s.status, nullptr);
  return s;
}
inline GateStatus gate_status(Device& device, cudaStream_t stream) noexcept {
  return gate_status_after(device, stream, gate_status_first(device, stream));
}
// gate_status, once the status alone was asked (`first`).
inline GateStatus gate_status_after(Device& device, cudaStream_t stream,
                                    GateStatus first) noexcept {
  if (first.error == cudaSuccess && first.status == CaptureStatus::active) {
    first.error = device.capture_info(stream, &first.status, &first.id);
  }
  return first;
}
// The failure of a status query that did not answer (status.error != cudaSuccess).
inline Failure gate_status_failure(const GateStatus& status) noexcept {
  return Failure::of(status.error, "cudaStreamGetCaptureInfo");
}

// The error of a request that needs a call a capture under way forbids.

inline Errc forbidden_now() noexcept { return Errc::capture_forbids_call; }
// The error of a call on a stream being captured that no gate serves, and its message.
inline Errc ungated() noexcept { return Errc::capture_without_pool; }
inline std::string ungated_message(const char* call) {
  return std::string(call) + " on a stream being captured without a pool";
}
// The error of an allocation on a stream whose capture was invalidated.
inline Errc gate_invalidated() noexcept { return Errc::capture_invalidated; }

// Throws when `stream` is capturing (or its status cannot be asked): `call` cannot be made on it
// now, and asking its id would invalidate the capture.
inline void refuse_if_gated(Device& device, cudaStream_t stream, const char* call) {
  const GateStatus status = gate_status(device, stream);
  throw_on_cuda_error(status.error, std::string(call) + ": cudaStreamGetCaptureInfo");
  if (status.capturing()) {
    throw Error(Errc::capture_forbids_call,
                std::string(call) + ": the stream is capturing; call it after the capture ends");
  }
}

class Gate {
 public:
  virtual ~Gate() = default;

  // An allocation on `stream`, which `status` says is capturing (or whose state is gated).
  // Returns a block counted live on the stream's state (PoolCore::count_allocation), or null with
  // `error` set.
  virtual Block* allocate(std::size_t bytes, cudaStream_t stream, const GateStatus& status,
                          Failure& error) noexcept = 0;
  // A drop of `block` on `stream`, whose still-pending uses are `uses` (PoolCore::drop). True
  // when the gate took it (memory it owns, or a drop into a capture); the block is then the
  // gate's, and still counted live until the gate calls PoolCore::count_drop.
  virtual bool take_drop(Block* block, cudaStream_t stream,
                         UseSpan uses) noexcept = 0;
  // The state of `stream` when it is being captured with this pool (begun there, or joined),
  // found without asking its id (a joined stream's capture status is asked); null otherwise.
  virtual StreamState* bound_state(cudaStream_t stream) noexcept = 0;
  // A safe point (see above).
  virtual void safe_point() noexcept = 0;
  // The MemoryPool object is going: complete everything deferred for it.
  virtual void closing() noexcept = 0;
};

}  // namespace streampool::detail
