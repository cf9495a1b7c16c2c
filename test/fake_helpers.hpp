// Small helpers shared by the FakeDevice tests (fake_device_*.cpp).
#pragma once

#include <streampool/fake_device.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace fake_test {

using streampool::CaptureId;
using streampool::CaptureMode;
using streampool::CaptureStatus;
using streampool::FakeDevice;
using streampool::StreamId;
using Call = FakeDevice::Call;
using HazardKind = FakeDevice::Hazard::Kind;

inline std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

inline const std::byte* offset(const void* ptr, std::size_t bytes) {
  return static_cast<const std::byte*>(ptr) + bytes;
}

// "0x7f0000000100": how hazard messages write addresses.
inline std::string hex(std::uintptr_t value) { return fmt::format("{:#x}", value); }

inline FakeDevice::Access write_of(const void* ptr, std::size_t bytes) {
  return {ptr, bytes, true};
}
inline FakeDevice::Access read_of(const void* ptr, std::size_t bytes) {
  return {ptr, bytes, false};
}

inline void* must_malloc(FakeDevice& device, std::size_t bytes) {
  void* ptr = nullptr;
  REQUIRE(device.malloc(&ptr, bytes) == cudaSuccess);
  REQUIRE(ptr != nullptr);
  return ptr;
}

inline cudaEvent_t must_create_event(FakeDevice& device) {
  cudaEvent_t event = nullptr;
  REQUIRE(device.event_create(&event) == cudaSuccess);
  return event;
}

// An event recorded on `stream` now.
inline cudaEvent_t recorded_event(FakeDevice& device, cudaStream_t stream) {
  cudaEvent_t event = must_create_event(device);
  REQUIRE(device.event_record(event, stream) == cudaSuccess);
  return event;
}

// Makes work launched on `waiter` from now on follow the work enqueued on `awaited` so far.
inline void order_after(FakeDevice& device, cudaStream_t waiter, cudaStream_t awaited) {
  cudaEvent_t event = recorded_event(device, awaited);
  REQUIRE(device.stream_wait_event(waiter, event) == cudaSuccess);
  REQUIRE(device.event_destroy(event) == cudaSuccess);
}

inline StreamId id_of(FakeDevice& device, cudaStream_t stream) {
  StreamId id = 0;
  REQUIRE(device.stream_id(stream, &id) == cudaSuccess);
  return id;
}

inline CaptureStatus capture_status(FakeDevice& device, cudaStream_t stream) {
  CaptureStatus status = CaptureStatus::none;
  REQUIRE(device.capture_info(stream, &status, nullptr) == cudaSuccess);
  return status;
}

inline std::vector<FakeDevice::Hazard> hazards_of(const FakeDevice& device, HazardKind kind) {
  std::vector<FakeDevice::Hazard> found = device.hazards();
  std::erase_if(found, [&](const FakeDevice::Hazard& h) { return h.kind != kind; });
  return found;
}

// A body that appends `n` to `log` when its work completes.
inline std::function<void()> note(std::vector<int>& log, int n) {
  return [&log, n] { log.push_back(n); };
}

// Runs `call` on a thread of its own and returns what it returned.
template <class F>
auto on_other_thread(F call) {
  decltype(call()) result{};
  std::thread([&] { result = call(); }).join();
  return result;
}

inline const char* mode_name(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::global: return "global";
    case CaptureMode::thread_local_: return "thread-local";
    case CaptureMode::relaxed: return "relaxed";
  }
  return "?";
}

// Ends the capture on `stream`, expecting `expected`, and destroys any graph it produced.
inline void end_and_discard(FakeDevice& device, cudaStream_t stream, cudaError_t expected) {
  cudaGraph_t graph = nullptr;
  REQUIRE(device.end_capture(stream, &graph) == expected);
  if (graph != nullptr) REQUIRE(device.graph_destroy(graph) == cudaSuccess);
}

}  // namespace fake_test
