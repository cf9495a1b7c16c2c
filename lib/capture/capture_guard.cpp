#include "capture_guard.hpp"

#include "../pool/gate.hpp"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace streampool::detail {

std::atomic<int> gate_engagements{0};

namespace {

std::atomic<int> global_captures{0};
std::atomic<int> thread_local_captures{0};

// Thread-local-mode captures per thread that began them. Kept here rather than in thread_local
// storage because the capture may be ended (or abandoned) from another thread.
struct PerThread {
  std::mutex mutex;
  std::unordered_map<std::thread::id, int> count;
};
PerThread& per_thread() {
  static PerThread* instance = new PerThread;  // never destroyed: used until the very end
  return *instance;
}

}  // namespace

void note_capture_begin(CaptureMode mode, std::thread::id thread) {
  if (mode == CaptureMode::thread_local_) {
    std::lock_guard<std::mutex> lock(per_thread().mutex);
    ++per_thread().count[thread];
    thread_local_captures.fetch_add(1);
  } else if (mode == CaptureMode::global) {
    global_captures.fetch_add(1);
  }
  gate_engagements.fetch_add(1, std::memory_order_acq_rel);
}

void note_capture_end(CaptureMode mode, std::thread::id thread) noexcept {
  gate_engagements.fetch_sub(1, std::memory_order_acq_rel);
  if (mode == CaptureMode::global) {
    global_captures.fetch_sub(1);
  } else if (mode == CaptureMode::thread_local_) {
    std::lock_guard<std::mutex> lock(per_thread().mutex);
    auto found = per_thread().count.find(thread);
    if (found != per_thread().count.end() && --found->second == 0) per_thread().count.erase(found);
    thread_local_captures.fetch_sub(1);
  }
}

bool calls_allowed(Restricted call) noexcept {
  if (call == Restricted::vm_map) return true;  // in every mode (gate.hpp)
  if (call == Restricted::device_sync || call == Restricted::free) {
    return gate_engagements.load(std::memory_order_acquire) == 0;
  }
  if (global_captures.load(std::memory_order_acquire) != 0) return false;
  if (thread_local_captures.load(std::memory_order_acquire) == 0) return true;
  std::lock_guard<std::mutex> lock(per_thread().mutex);
  return per_thread().count.find(std::this_thread::get_id()) == per_thread().count.end();
}

}  // namespace streampool::detail
