// The Device contract: behaviours observable on both FakeDevice and CudaDevice, checked by the
// same test bodies. A translation unit defines STREAMPOOL_CONTRACT_HARNESSES (a comma-separated
// list of harness types, see harnesses below) and includes this file.
//
// A harness provides:
//   Device& device();
//   cudaStream_t create_stream();  void destroy_stream(cudaStream_t);
//   void launch_blocked(cudaStream_t);  // work that stays pending until release()
//   void release();                     // lets all blocked work finish (does not wait for it)
//   void launch_short(cudaStream_t);    // work that finishes on its own
//   std::size_t refused_size();         // a malloc size the device cannot satisfy
//   bool wait_until(std::function<bool()>);  // polls up to a few seconds; false on timeout
//
// Tests tagged [blocking] need work that stays pending while the CPU goes on; compute-sanitizer
// serializes kernel launches, so its runs leave them out.
#pragma once

#include <streampool/device.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

#ifndef STREAMPOOL_CONTRACT_HARNESSES
#error "define STREAMPOOL_CONTRACT_HARNESSES before including device_contract.hpp"
#endif

using streampool::CaptureId;
using streampool::CaptureMode;
using streampool::CaptureStatus;
using streampool::Device;
using streampool::StreamId;

namespace contract {

inline const char* mode_name(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::global: return "global";
    case CaptureMode::thread_local_: return "thread_local";
    case CaptureMode::relaxed: return "relaxed";
  }
  return "?";
}

inline CaptureStatus status_of(Device& device, cudaStream_t stream) {
  CaptureStatus status = CaptureStatus::none;
  CaptureId id = 0;
  REQUIRE(device.capture_info(stream, &status, &id) == cudaSuccess);
  return status;
}

// Ends a capture and destroys whatever graph it produced; returns end_capture's status.
inline cudaError_t end_and_discard(Device& device, cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t status = device.end_capture(stream, &graph);
  if (graph != nullptr) REQUIRE(device.graph_destroy(graph) == cudaSuccess);
  return status;
}

}  // namespace contract

TEMPLATE_TEST_CASE("an event completes only when the work before its record has",
                   "[contract][blocking]", STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  auto& device = h.device();
  cudaStream_t stream = h.create_stream();
  cudaEvent_t event = nullptr;
  REQUIRE(device.event_create(&event) == cudaSuccess);

  SECTION("an event never recorded is complete") {
    REQUIRE(device.event_query(event) == cudaSuccess);
  }
  SECTION("an event recorded after pending work is not complete until that work finishes") {
    h.launch_blocked(stream);
    REQUIRE(device.event_record(event, stream) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaErrorNotReady);
    h.release();
    REQUIRE(device.event_synchronize(event) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaSuccess);
  }
  SECTION("work enqueued after the record does not hold the event back") {
    REQUIRE(device.event_record(event, stream) == cudaSuccess);
    h.launch_blocked(stream);
    REQUIRE(h.wait_until([&] { return device.event_query(event) == cudaSuccess; }));
    h.release();
  }
  SECTION("a stream synchronize returns once the stream's work has finished") {
    h.launch_blocked(stream);
    REQUIRE(device.event_record(event, stream) == cudaSuccess);
    h.release();
    REQUIRE(device.stream_synchronize(stream) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaSuccess);
  }
  REQUIRE(device.event_destroy(event) == cudaSuccess);
  h.destroy_stream(stream);
}

TEMPLATE_TEST_CASE("a stream waiting on an event runs later work only after the event's work",
                   "[contract][blocking]", STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  auto& device = h.device();
  cudaStream_t a = h.create_stream();
  cudaStream_t b = h.create_stream();
  cudaEvent_t on_a = nullptr;
  cudaEvent_t on_b = nullptr;
  REQUIRE(device.event_create(&on_a) == cudaSuccess);
  REQUIRE(device.event_create(&on_b) == cudaSuccess);

  h.launch_blocked(a);
  REQUIRE(device.event_record(on_a, a) == cudaSuccess);
  REQUIRE(device.stream_wait_event(b, on_a) == cudaSuccess);
  h.launch_short(b);
  REQUIRE(device.event_record(on_b, b) == cudaSuccess);
  REQUIRE(device.event_query(on_b) == cudaErrorNotReady);
  h.release();
  REQUIRE(device.stream_synchronize(b) == cudaSuccess);
  REQUIRE(device.event_query(on_a) == cudaSuccess);
  REQUIRE(device.event_query(on_b) == cudaSuccess);

  REQUIRE(device.event_destroy(on_a) == cudaSuccess);
  REQUIRE(device.event_destroy(on_b) == cudaSuccess);
  h.destroy_stream(a);
  h.destroy_stream(b);
}

TEMPLATE_TEST_CASE("stream ids tell streams apart where handles cannot", "[contract]",
                   STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  auto& device = h.device();

  SECTION("a destroyed stream's handle, given to a new stream, comes with a new id") {
    cudaStream_t first = h.create_stream();
    StreamId first_id = 0;
    REQUIRE(device.stream_id(first, &first_id) == cudaSuccess);
    h.destroy_stream(first);
    cudaStream_t second = h.create_stream();
    StreamId second_id = 0;
    REQUIRE(device.stream_id(second, &second_id) == cudaSuccess);
    REQUIRE(second_id != first_id);
    // CUDA reuses the handle at once (seen on the H200); the fake does the same.
    CHECK(second == first);
    h.destroy_stream(second);
  }
  SECTION("the per-thread default stream is a different stream in each thread") {
    StreamId here = 0;
    StreamId there = 0;
    REQUIRE(device.stream_id(cudaStreamPerThread, &here) == cudaSuccess);
    cudaError_t status = cudaErrorUnknown;
    std::thread([&] { status = device.stream_id(cudaStreamPerThread, &there); }).join();
    REQUIRE(status == cudaSuccess);
    REQUIRE(here != there);
  }
  SECTION("the legacy default stream is one stream in every thread") {
    StreamId here = 0;
    StreamId there = 0;
    REQUIRE(device.stream_id(cudaStreamLegacy, &here) == cudaSuccess);
    cudaError_t status = cudaErrorUnknown;
    std::thread([&] { status = device.stream_id(cudaStreamLegacy, &there); }).join();
    REQUIRE(status == cudaSuccess);
    REQUIRE(here == there);
  }
}

TEMPLATE_TEST_CASE("malloc beyond what the device has fails with cudaErrorMemoryAllocation",
                   "[contract]", STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  void* ptr = nullptr;
  REQUIRE(h.device().malloc(&ptr, h.refused_size()) == cudaErrorMemoryAllocation);
  REQUIRE(h.device().malloc(&ptr, 1000) == cudaSuccess);
  REQUIRE(reinterpret_cast<std::uintptr_t>(ptr) % 256 == 0);
  REQUIRE(h.device().free(ptr) == cudaSuccess);
}

TEMPLATE_TEST_CASE("virtual memory: reserve, create, map, set access, unmap, release, unreserve",
                   "[contract][vm]", STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  auto& device = h.device();
  std::size_t granule = 0;
  REQUIRE(device.vm_granularity(&granule) == cudaSuccess);
  REQUIRE(granule >= 4096);
  REQUIRE((granule & (granule - 1)) == 0);
  void* base = nullptr;
  REQUIRE(device.vm_reserve(&base, 8 * granule) == cudaSuccess);
  REQUIRE(reinterpret_cast<std::uintptr_t>(base) % granule == 0);
  auto* at = static_cast<std::byte*>(base);
  streampool::VmHandle one = 0;
  streampool::VmHandle two = 0;
  REQUIRE(device.vm_create(&one, granule) == cudaSuccess);
  REQUIRE(device.vm_create(&two, 2 * granule) == cudaSuccess);

  SECTION("mappings side by side, each made accessible, then unmapped and released") {
    REQUIRE(device.vm_map(at, granule, one) == cudaSuccess);
    REQUIRE(device.vm_map(at + granule, 2 * granule, two) == cudaSuccess);
    REQUIRE(device.vm_set_access(at, granule, device.own_access()) == cudaSuccess);
    REQUIRE(device.vm_set_access(at + granule, 2 * granule, device.own_access()) == cudaSuccess);
    REQUIRE(device.vm_unmap(at + granule, 2 * granule) == cudaSuccess);
    REQUIRE(device.vm_unmap(at, granule) == cudaSuccess);
    REQUIRE(device.vm_release(one) == cudaSuccess);
    REQUIRE(device.vm_release(two) == cudaSuccess);
  }
  SECTION("what the calls refuse") {
    REQUIRE(device.vm_map(at + granule / 2, granule, one) == cudaErrorInvalidValue);  // misaligned
    REQUIRE(device.vm_map(at, 2 * granule, one) == cudaErrorNotSupported);  // not the handle's size
    REQUIRE(device.vm_map(at, granule, two) == cudaErrorNotSupported);  // part of a handle
    REQUIRE(device.vm_map(at, granule, one) == cudaSuccess);
    REQUIRE(device.vm_map(at, 2 * granule, two) == cudaErrorInvalidValue);  // over a mapping
    REQUIRE(device.vm_map(at + granule, 2 * granule, two) == cudaSuccess);
    // Two mappings at once; not past them.
    REQUIRE(device.vm_set_access(at, 3 * granule, device.own_access()) == cudaSuccess);
    REQUIRE(device.vm_set_access(at, 4 * granule, device.own_access()) == cudaErrorInvalidValue);
    // A device that does not exist (tools/gpu-check.sh probes print what the GPU answers).
    CHECK(device.vm_set_access(at, granule, device.own_access() | (std::uint64_t{1} << 63)) !=
          cudaSuccess);
    cudaGetLastError();
    REQUIRE(device.vm_unmap(at + granule, granule) == cudaErrorInvalidValue);  // part of one
    REQUIRE(device.vm_unreserve(base, 8 * granule) == cudaErrorInvalidValue);  // mappings in it
    // Released while mapped: the memory stays until the unmap.
    REQUIRE(device.vm_release(one) == cudaSuccess);
    REQUIRE(device.vm_release(two) == cudaSuccess);
    REQUIRE(device.vm_unmap(at, 3 * granule) == cudaSuccess);  // two mappings at once
  }
  REQUIRE(device.vm_unreserve(base, 8 * granule) == cudaSuccess);
}

TEMPLATE_TEST_CASE("peer access to a device's own memory, or from one that does not exist, is "
                   "refused",
                   "[contract]", STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  auto& device = h.device();
  CHECK(device.enable_peer_access(device.ordinal()) == cudaErrorInvalidDevice);
  CHECK(device.enable_peer_access(63) == cudaErrorInvalidDevice);
  cudaGetLastError();
  // Refusals that leave the device as it was: memory is still there to take.
  void* p = nullptr;
  REQUIRE(device.malloc(&p, 1 << 20) == cudaSuccess);
  REQUIRE(device.free(p) == cudaSuccess);
}

TEMPLATE_TEST_CASE("virtual memory beyond what the device has fails with "
                   "cudaErrorMemoryAllocation",
                   "[contract][vm]", STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  auto& device = h.device();
  std::size_t granule = 0;
  REQUIRE(device.vm_granularity(&granule) == cudaSuccess);
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  REQUIRE(device.mem_get_info(&free_bytes, &total) == cudaSuccess);
  streampool::VmHandle handle = 0;
  REQUIRE(device.vm_create(&handle, (total / granule + 1) * granule) == cudaErrorMemoryAllocation);
}

TEMPLATE_TEST_CASE("the virtual memory calls are allowed during a capture of every mode, which "
                   "stays active",
                   "[contract][vm][capture]", STREAMPOOL_CONTRACT_HARNESSES) {
  using contract::end_and_discard;
  using contract::status_of;
  TestType h;
  auto& device = h.device();
  cudaStream_t stream = h.create_stream();
  std::size_t granule = 0;
  REQUIRE(device.vm_granularity(&granule) == cudaSuccess);
  void* base = nullptr;
  REQUIRE(device.vm_reserve(&base, 4 * granule) == cudaSuccess);
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("in " << contract::mode_name(mode) << " mode") {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      streampool::VmHandle handle = 0;
      const cudaError_t created = device.vm_create(&handle, granule);
      const cudaError_t mapped = device.vm_map(base, granule, handle);
      const cudaError_t accessible = device.vm_set_access(base, granule, device.own_access());
      const cudaError_t unmapped = device.vm_unmap(base, granule);
      const cudaError_t released = device.vm_release(handle);
      cudaError_t other_thread = cudaErrorUnknown;
      std::thread([&] {
        streampool::VmHandle mine = 0;
        other_thread = device.vm_create(&mine, granule);
        if (other_thread == cudaSuccess) device.vm_release(mine);
      }).join();
      const CaptureStatus status = status_of(device, stream);
      // End the capture before any REQUIRE can fail, so that no capture outlives the test.
      const cudaError_t ended = end_and_discard(device, stream);
      CHECK(created == cudaSuccess);
      CHECK(mapped == cudaSuccess);
      CHECK(accessible == cudaSuccess);
      CHECK(unmapped == cudaSuccess);
      CHECK(released == cudaSuccess);
      CHECK(other_thread == cudaSuccess);
      CHECK(status == CaptureStatus::active);
      CHECK(ended == cudaSuccess);
    }
  }
  REQUIRE(device.vm_unreserve(base, 4 * granule) == cudaSuccess);
  h.destroy_stream(stream);
}

TEMPLATE_TEST_CASE("capture refuses the calls CUDA refuses, in the modes CUDA refuses them",
                   "[contract][capture]", STREAMPOOL_CONTRACT_HARNESSES) {
  using contract::end_and_discard;
  using contract::status_of;
  TestType h;
  auto& device = h.device();
  cudaStream_t stream = h.create_stream();

  SECTION("capture_info reports an active capture with an id, and none after it ends") {
    REQUIRE(status_of(device, stream) == CaptureStatus::none);
    REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
    CaptureStatus status = CaptureStatus::none;
    CaptureId id = 0;
    REQUIRE(device.capture_info(stream, &status, &id) == cudaSuccess);
    REQUIRE(status == CaptureStatus::active);
    REQUIRE(id != 0);
    REQUIRE(end_and_discard(device, stream) == cudaSuccess);
    REQUIRE(status_of(device, stream) == CaptureStatus::none);
  }

  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("capture_info without an id reports the status alone in "
                    << contract::mode_name(mode) << " mode, and the capture survives it") {
      CaptureStatus before = CaptureStatus::active;
      REQUIRE(device.capture_info(stream, &before, nullptr) == cudaSuccess);
      REQUIRE(before == CaptureStatus::none);
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      CaptureStatus alone = CaptureStatus::none;
      const cudaError_t asked_alone = device.capture_info(stream, &alone, nullptr);
      CaptureStatus with_id = CaptureStatus::none;
      CaptureId id = 0;
      const cudaError_t asked_with_id = device.capture_info(stream, &with_id, &id);
      // Invalidated (asking the capturing stream's own id does it), and so reported by both forms;
      // an invalidated capture has no id.
      StreamId stream_id = 0;
      const cudaError_t asked_stream_id = device.stream_id(stream, &stream_id);
      CaptureStatus invalidated_alone = CaptureStatus::none;
      const cudaError_t asked_invalidated = device.capture_info(stream, &invalidated_alone, nullptr);
      CaptureStatus invalidated = CaptureStatus::none;
      CaptureId invalidated_id = 1;
      const cudaError_t asked_invalidated_id =
          device.capture_info(stream, &invalidated, &invalidated_id);
      // End the capture before any REQUIRE can fail, so that no capture outlives the test.
      const cudaError_t ended = end_and_discard(device, stream);
      CHECK(asked_alone == cudaSuccess);
      CHECK(alone == CaptureStatus::active);
      CHECK(asked_with_id == cudaSuccess);
      CHECK(with_id == CaptureStatus::active);
      CHECK(id != 0);
      CHECK(asked_stream_id != cudaSuccess);
      CHECK(asked_invalidated == cudaSuccess);
      CHECK(invalidated_alone == CaptureStatus::invalidated);
      CHECK(asked_invalidated_id == cudaSuccess);
      CHECK(invalidated == CaptureStatus::invalidated);
      CHECK(invalidated_id == 0);
      CHECK(ended == cudaErrorStreamCaptureInvalidated);
      CaptureStatus after = CaptureStatus::active;
      REQUIRE(device.capture_info(stream, &after, nullptr) == cudaSuccess);
      REQUIRE(after == CaptureStatus::none);
    }
  }

  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_}) {
    DYNAMIC_SECTION("malloc in " << contract::mode_name(mode)
                                 << " mode fails and invalidates the capture") {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      void* ptr = nullptr;
      REQUIRE(device.malloc(&ptr, 4096) == cudaErrorStreamCaptureUnsupported);
      REQUIRE(status_of(device, stream) == CaptureStatus::invalidated);
      REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
      REQUIRE(status_of(device, stream) == CaptureStatus::none);
    }
    DYNAMIC_SECTION("querying an event recorded outside the capture in "
                    << contract::mode_name(mode) << " mode fails and invalidates it") {
      cudaEvent_t event = nullptr;
      REQUIRE(device.event_create(&event) == cudaSuccess);
      cudaStream_t other = h.create_stream();
      REQUIRE(device.event_record(event, other) == cudaSuccess);
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(device.event_query(event) == cudaErrorStreamCaptureUnsupported);
      REQUIRE(status_of(device, stream) == CaptureStatus::invalidated);
      REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
      REQUIRE(device.event_destroy(event) == cudaSuccess);
      h.destroy_stream(other);
    }
  }

  // Seen on an H100 (test/gpu/probes.cpp, 2026-12-07): an invalidated capture that is not yet
  // ended refuses what an active one of its mode refuses (the fake took it as restricting nothing
  // more, and the pool counted a left capture over once it was no longer active); in every mode
  // it refuses a device synchronize and its own stream's id.
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("an invalidated capture not yet ended in " << contract::mode_name(mode)
                                                               << " mode still refuses what the "
                                                                  "mode refuses") {
      const bool restricting = mode != CaptureMode::relaxed;
      const cudaError_t refused_if_restricting =
          restricting ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
      cudaEvent_t event = nullptr;
      REQUIRE(device.event_create(&event) == cudaSuccess);
      cudaStream_t other = h.create_stream();
      REQUIRE(device.event_record(event, other) == cudaSuccess);
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      // Refused in every mode, and the capture is invalidated.
      REQUIRE(device.stream_synchronize(stream) == cudaErrorStreamCaptureUnsupported);
      REQUIRE(status_of(device, stream) == CaptureStatus::invalidated);
      void* ptr = nullptr;
      const cudaError_t malloc_again = device.malloc(&ptr, 4096);
      if (ptr != nullptr) REQUIRE(device.free(ptr) == cudaSuccess);
      const cudaError_t query = device.event_query(event);
      const cudaError_t other_sync = device.stream_synchronize(other);
      const cudaError_t device_sync = device.device_synchronize();
      StreamId id = 0;
      const cudaError_t id_asked = device.stream_id(stream, &id);
      const CaptureStatus still = status_of(device, stream);
      const cudaError_t ended = end_and_discard(device, stream);
      CHECK(malloc_again == refused_if_restricting);
      CHECK(query == refused_if_restricting);
      CHECK(other_sync == refused_if_restricting);
      CHECK(device_sync == cudaErrorStreamCaptureUnsupported);
      CHECK(id_asked == cudaErrorStreamCaptureUnsupported);
      CHECK(still == CaptureStatus::invalidated);
      CHECK(ended == cudaErrorStreamCaptureInvalidated);
      REQUIRE(device.device_synchronize() == cudaSuccess);  // ended: allowed again
      REQUIRE(device.event_destroy(event) == cudaSuccess);
      h.destroy_stream(other);
    }
  }

  SECTION("malloc and event query in relaxed mode succeed and the capture survives") {
    cudaEvent_t event = nullptr;
    REQUIRE(device.event_create(&event) == cudaSuccess);
    REQUIRE(device.event_record(event, cudaStreamPerThread) == cudaSuccess);
    REQUIRE(device.stream_synchronize(cudaStreamPerThread) == cudaSuccess);
    REQUIRE(device.begin_capture(stream, CaptureMode::relaxed) == cudaSuccess);
    void* ptr = nullptr;
    REQUIRE(device.malloc(&ptr, 4096) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaSuccess);
    REQUIRE(status_of(device, stream) == CaptureStatus::active);
    REQUIRE(end_and_discard(device, stream) == cudaSuccess);
    REQUIRE(device.free(ptr) == cudaSuccess);
    REQUIRE(device.event_destroy(event) == cudaSuccess);
  }

  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("synchronizing the capturing stream in " << contract::mode_name(mode)
                                                             << " mode fails") {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(device.stream_synchronize(stream) == cudaErrorStreamCaptureUnsupported);
      REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
    }
  }

  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("waiting on an event recorded outside the capture in "
                    << contract::mode_name(mode) << " mode fails and invalidates it") {
      cudaEvent_t event = nullptr;
      REQUIRE(device.event_create(&event) == cudaSuccess);
      cudaStream_t other = h.create_stream();
      REQUIRE(device.event_record(event, other) == cudaSuccess);
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(device.stream_wait_event(stream, event) == cudaErrorStreamCaptureIsolation);
      REQUIRE(status_of(device, stream) == CaptureStatus::invalidated);
      REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
      REQUIRE(device.event_destroy(event) == cudaSuccess);
      h.destroy_stream(other);
    }
  }

  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("waiting on an event captured by another capture in "
                    << contract::mode_name(mode) << " mode fails (a merge) and invalidates both") {
      cudaEvent_t event = nullptr;
      REQUIRE(device.event_create(&event) == cudaSuccess);
      cudaStream_t other = h.create_stream();
      REQUIRE(device.begin_capture(other, mode) == cudaSuccess);
      REQUIRE(device.event_record(event, other) == cudaSuccess);
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(device.stream_wait_event(stream, event) == cudaErrorStreamCaptureMerge);
      REQUIRE(status_of(device, stream) == CaptureStatus::invalidated);
      const CaptureStatus other_status = status_of(device, other);
      // Both ended before the check: a capture left open refuses the calls of later tests.
      REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
      REQUIRE(end_and_discard(device, other) == cudaErrorStreamCaptureInvalidated);
      REQUIRE(other_status == CaptureStatus::invalidated);
      REQUIRE(device.event_destroy(event) == cudaSuccess);
      h.destroy_stream(other);
    }
  }

  // Seen on an H100 (test/gpu/probes.cpp, 2026-12-07): destroying the stream that began a
  // capture, while a stream that joined it still captures, ends the capture on every stream of it
  // (the joined stream reports none; cudaMalloc is allowed again; its end is refused).
  SECTION("destroying a capture's origin while a stream joined it ends the capture there") {
    cudaStream_t origin = h.create_stream();
    cudaStream_t joined = h.create_stream();
    cudaEvent_t fork = nullptr;
    REQUIRE(device.event_create(&fork) == cudaSuccess);
    REQUIRE(device.begin_capture(origin, CaptureMode::global) == cudaSuccess);
    REQUIRE(device.event_record(fork, origin) == cudaSuccess);
    REQUIRE(device.stream_wait_event(joined, fork) == cudaSuccess);
    REQUIRE(status_of(device, joined) == CaptureStatus::active);
    h.destroy_stream(origin);
    CHECK(status_of(device, joined) == CaptureStatus::none);
    void* ptr = nullptr;
    CHECK(device.malloc(&ptr, 4096) == cudaSuccess);
    if (ptr != nullptr) REQUIRE(device.free(ptr) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    CHECK(device.end_capture(joined, &graph) != cudaSuccess);
    CHECK(graph == nullptr);
    if (graph != nullptr) device.graph_destroy(graph);
    REQUIRE(device.event_destroy(fork) == cudaSuccess);
    h.destroy_stream(joined);
  }

  // Seen on an H100 (test/gpu/probes.cpp, 2026-12-07): a stream that joined a capture may be
  // destroyed before the capture's end; the capture goes on at its origin, and its end succeeds
  // where the destroyed stream's work was joined back and is refused as unjoined where it was not.
  for (const bool joined_back : {false, true}) {
    DYNAMIC_SECTION("a stream that joined a capture destroyed before its end, "
                    << (joined_back ? "joined back" : "not joined back")) {
      cudaStream_t origin = h.create_stream();
      cudaStream_t joined = h.create_stream();
      cudaEvent_t fork = nullptr;
      cudaEvent_t back = nullptr;
      REQUIRE(device.event_create(&fork) == cudaSuccess);
      REQUIRE(device.event_create(&back) == cudaSuccess);
      REQUIRE(device.begin_capture(origin, CaptureMode::global) == cudaSuccess);
      REQUIRE(device.event_record(fork, origin) == cudaSuccess);
      REQUIRE(device.stream_wait_event(joined, fork) == cudaSuccess);
      h.launch_short(joined);
      if (joined_back) {
        REQUIRE(device.event_record(back, joined) == cudaSuccess);
        REQUIRE(device.stream_wait_event(origin, back) == cudaSuccess);
      }
      h.destroy_stream(joined);
      const CaptureStatus origin_status = status_of(device, origin);
      const cudaError_t ended = end_and_discard(device, origin);
      const CaptureStatus after = status_of(device, origin);
      CHECK(origin_status == CaptureStatus::active);
      CHECK(ended == (joined_back ? cudaSuccess : cudaErrorStreamCaptureUnjoined));
      CHECK(after == CaptureStatus::none);
      REQUIRE(device.device_synchronize() == cudaSuccess);
      REQUIRE(device.event_destroy(fork) == cudaSuccess);
      REQUIRE(device.event_destroy(back) == cudaSuccess);
      h.destroy_stream(origin);
    }
  }

  // A stream that waits on an event recorded in a capture joins that capture: it reports the
  // capture's status and id, its work is captured, and the capture ends only once the joined
  // stream is joined back (the stream that began it waits on an event recorded on the joined
  // stream after its work); only the stream that began a capture may end it (seen on an H100,
  // 2026-12-06).
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("a stream waiting on an event of a " << contract::mode_name(mode)
                                                          << " capture joins it") {
      cudaStream_t joined = h.create_stream();
      cudaEvent_t fork = nullptr;
      cudaEvent_t back = nullptr;
      REQUIRE(device.event_create(&fork) == cudaSuccess);
      REQUIRE(device.event_create(&back) == cudaSuccess);

      // Joined and joined back: one graph, and both streams leave the capture.
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(device.event_record(fork, stream) == cudaSuccess);
      const cudaError_t waited = device.stream_wait_event(joined, fork);
      CaptureStatus origin_status = CaptureStatus::none;
      CaptureId origin_id = 0;
      CaptureStatus joined_status = CaptureStatus::none;
      CaptureId joined_id = 0;
      const cudaError_t asked_origin = device.capture_info(stream, &origin_status, &origin_id);
      const cudaError_t asked_joined = device.capture_info(joined, &joined_status, &joined_id);
      h.launch_short(joined);
      REQUIRE(device.event_record(back, joined) == cudaSuccess);
      REQUIRE(device.stream_wait_event(stream, back) == cudaSuccess);
      cudaGraph_t graph = nullptr;
      const cudaError_t ended = device.end_capture(stream, &graph);
      if (graph != nullptr) REQUIRE(device.graph_destroy(graph) == cudaSuccess);
      const CaptureStatus joined_after = status_of(device, joined);

      // Not joined back: no graph, and both leave the capture.
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      REQUIRE(device.event_record(fork, stream) == cudaSuccess);
      REQUIRE(device.stream_wait_event(joined, fork) == cudaSuccess);
      h.launch_short(joined);
      const cudaError_t ended_unjoined = end_and_discard(device, stream);
      const CaptureStatus origin_after_unjoined = status_of(device, stream);
      const CaptureStatus joined_after_unjoined = status_of(device, joined);

      CHECK(waited == cudaSuccess);
      CHECK(asked_origin == cudaSuccess);
      CHECK(asked_joined == cudaSuccess);
      CHECK(origin_status == CaptureStatus::active);
      CHECK(joined_status == CaptureStatus::active);
      CHECK(joined_id == origin_id);
      CHECK(ended == cudaSuccess);
      CHECK(graph != nullptr);
      CHECK(joined_after == CaptureStatus::none);
      CHECK(ended_unjoined == cudaErrorStreamCaptureUnjoined);
      CHECK(origin_after_unjoined == CaptureStatus::none);
      CHECK(joined_after_unjoined == CaptureStatus::none);
      REQUIRE(device.stream_synchronize(joined) == cudaSuccess);
      REQUIRE(device.event_destroy(fork) == cudaSuccess);
      REQUIRE(device.event_destroy(back) == cudaSuccess);
      h.destroy_stream(joined);
    }
  }

  SECTION("a stream that joined a capture cannot end it") {
    cudaStream_t joined = h.create_stream();
    cudaEvent_t fork = nullptr;
    REQUIRE(device.event_create(&fork) == cudaSuccess);
    REQUIRE(device.begin_capture(stream, CaptureMode::relaxed) == cudaSuccess);
    REQUIRE(device.event_record(fork, stream) == cudaSuccess);
    REQUIRE(device.stream_wait_event(joined, fork) == cudaSuccess);
    const cudaError_t ended_by_joined = end_and_discard(device, joined);
    const CaptureStatus origin_status = status_of(device, stream);
    const cudaError_t ended = end_and_discard(device, stream);
    const CaptureStatus joined_after = status_of(device, joined);
    CHECK(ended_by_joined == cudaErrorStreamCaptureUnmatched);
    CHECK(origin_status == CaptureStatus::invalidated);
    CHECK(ended == cudaErrorStreamCaptureInvalidated);
    CHECK(joined_after == CaptureStatus::none);
    REQUIRE(device.event_destroy(fork) == cudaSuccess);
    h.destroy_stream(joined);
  }

  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_}) {
    DYNAMIC_SECTION("ending a " << contract::mode_name(mode)
                                << " capture from another thread fails and ends it") {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      cudaError_t status = cudaErrorUnknown;
      cudaGraph_t graph = nullptr;
      std::thread([&] { status = device.end_capture(stream, &graph); }).join();
      REQUIRE(status == cudaErrorStreamCaptureWrongThread);
      REQUIRE(graph == nullptr);
      REQUIRE(status_of(device, stream) == CaptureStatus::none);
    }
  }

  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("asking a capturing stream's id in " << contract::mode_name(mode)
                                                          << " mode fails and invalidates it") {
      cudaStream_t other = h.create_stream();
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      StreamId id = 0;
      REQUIRE(device.stream_id(other, &id) == cudaSuccess);  // another stream's: fine
      REQUIRE(status_of(device, stream) == CaptureStatus::active);
      REQUIRE(device.stream_id(stream, &id) == cudaErrorStreamCaptureUnsupported);
      REQUIRE(status_of(device, stream) == CaptureStatus::invalidated);
      REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
      h.destroy_stream(other);
    }
  }

  // The legacy default stream synchronizes with every blocking stream, cudaStreamPerThread
  // among them: while one captures, a call naming the legacy stream would make it depend on the
  // capture. CUDA refuses it with cudaErrorStreamCaptureImplicit in every mode, from any thread;
  // asking the legacy stream's capture status leaves the capture as it was, enqueueing on it
  // (a record, a wait) or synchronizing it invalidates the capture (seen on an H100, 2026-12-06).
  // A capturing non-blocking stream (the harness's) restricts the legacy stream no more than
  // any other.
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_, CaptureMode::relaxed}) {
    DYNAMIC_SECTION("calls naming the legacy stream while cudaStreamPerThread captures in "
                    << contract::mode_name(mode) << " mode are refused as implicit dependencies") {
      cudaEvent_t event = nullptr;
      REQUIRE(device.event_create(&event) == cudaSuccess);
      REQUIRE(device.event_record(event, stream) == cudaSuccess);
      REQUIRE(device.stream_synchronize(stream) == cudaSuccess);
      const auto legacy_status = [&](cudaError_t* error) {
        CaptureStatus status = CaptureStatus::none;
        *error = device.capture_info(cudaStreamLegacy, &status, nullptr);
        return status;
      };
      // Each call in a capture of its own, ended before any check.
      REQUIRE(device.begin_capture(cudaStreamPerThread, mode) == cudaSuccess);
      cudaError_t asked = cudaSuccess;
      legacy_status(&asked);
      cudaError_t asked_elsewhere = cudaSuccess;
      std::thread([&] { legacy_status(&asked_elsewhere); }).join();
      const CaptureStatus after_asking = status_of(device, cudaStreamPerThread);
      const cudaError_t ended_after_asking = end_and_discard(device, cudaStreamPerThread);

      REQUIRE(device.begin_capture(cudaStreamPerThread, mode) == cudaSuccess);
      const cudaError_t recorded = device.event_record(event, cudaStreamLegacy);
      const CaptureStatus after_record = status_of(device, cudaStreamPerThread);
      const cudaError_t ended_after_record = end_and_discard(device, cudaStreamPerThread);

      REQUIRE(device.begin_capture(cudaStreamPerThread, mode) == cudaSuccess);
      cudaError_t recorded_elsewhere = cudaSuccess;
      std::thread([&] { recorded_elsewhere = device.event_record(event, cudaStreamLegacy); }).join();
      const cudaError_t ended_after_record_elsewhere = end_and_discard(device, cudaStreamPerThread);

      REQUIRE(device.begin_capture(cudaStreamPerThread, mode) == cudaSuccess);
      const cudaError_t waited = device.stream_wait_event(cudaStreamLegacy, event);
      const cudaError_t ended_after_wait = end_and_discard(device, cudaStreamPerThread);

      REQUIRE(device.begin_capture(cudaStreamPerThread, mode) == cudaSuccess);
      const cudaError_t synchronized = device.stream_synchronize(cudaStreamLegacy);
      const cudaError_t ended_after_synchronize = end_and_discard(device, cudaStreamPerThread);

      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      cudaError_t asked_beside_non_blocking = cudaErrorUnknown;
      const CaptureStatus legacy_beside_non_blocking = legacy_status(&asked_beside_non_blocking);
      const cudaError_t recorded_beside_non_blocking = device.event_record(event, cudaStreamLegacy);
      const cudaError_t ended_non_blocking = end_and_discard(device, stream);

      CHECK(asked == cudaErrorStreamCaptureImplicit);
      CHECK(asked_elsewhere == cudaErrorStreamCaptureImplicit);
      CHECK(after_asking == CaptureStatus::active);
      CHECK(ended_after_asking == cudaSuccess);
      CHECK(recorded == cudaErrorStreamCaptureImplicit);
      CHECK(after_record == CaptureStatus::invalidated);
      CHECK(ended_after_record == cudaErrorStreamCaptureInvalidated);
      CHECK(recorded_elsewhere == cudaErrorStreamCaptureImplicit);
      CHECK(ended_after_record_elsewhere == cudaErrorStreamCaptureInvalidated);
      CHECK(waited == cudaErrorStreamCaptureImplicit);
      CHECK(ended_after_wait == cudaErrorStreamCaptureInvalidated);
      CHECK(synchronized == cudaErrorStreamCaptureImplicit);
      CHECK(ended_after_synchronize == cudaErrorStreamCaptureInvalidated);
      CHECK(asked_beside_non_blocking == cudaSuccess);
      CHECK(legacy_beside_non_blocking == CaptureStatus::none);
      CHECK(recorded_beside_non_blocking == cudaSuccess);
      CHECK(ended_non_blocking == cudaSuccess);
      REQUIRE(device.stream_synchronize(cudaStreamLegacy) == cudaSuccess);
      REQUIRE(device.event_destroy(event) == cudaSuccess);
    }
  }

  SECTION("the legacy default stream cannot be captured") {
    REQUIRE(device.begin_capture(cudaStreamLegacy, CaptureMode::global) ==
            cudaErrorStreamCaptureUnsupported);
    REQUIRE(device.begin_capture(nullptr, CaptureMode::relaxed) ==
            cudaErrorStreamCaptureUnsupported);
  }

  SECTION("an event recorded inside a capture cannot be queried, and the query invalidates it") {
    cudaEvent_t event = nullptr;
    REQUIRE(device.event_create(&event) == cudaSuccess);
    REQUIRE(device.begin_capture(stream, CaptureMode::relaxed) == cudaSuccess);
    h.launch_short(stream);
    REQUIRE(device.event_record(event, stream) == cudaSuccess);
    REQUIRE(device.event_query(event) == cudaErrorCapturedEvent);
    REQUIRE(status_of(device, stream) == CaptureStatus::invalidated);
    REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
    REQUIRE(device.event_destroy(event) == cudaSuccess);
  }

  SECTION("another thread's malloc fails during a global capture, not during a thread-local one") {
    for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_}) {
      REQUIRE(device.begin_capture(stream, mode) == cudaSuccess);
      cudaError_t status = cudaErrorUnknown;
      void* ptr = nullptr;
      std::thread([&] { status = device.malloc(&ptr, 4096); }).join();
      if (mode == CaptureMode::global) {
        REQUIRE(status == cudaErrorStreamCaptureUnsupported);
        REQUIRE(end_and_discard(device, stream) == cudaErrorStreamCaptureInvalidated);
      } else {
        REQUIRE(status == cudaSuccess);
        REQUIRE(end_and_discard(device, stream) == cudaSuccess);
        REQUIRE(device.free(ptr) == cudaSuccess);
      }
    }
  }

  h.destroy_stream(stream);
}

namespace contract {
inline std::atomic<int> user_objects_destroyed{0};
inline void count_destroyed(void*) { user_objects_destroyed.fetch_add(1); }
}  // namespace contract

TEMPLATE_TEST_CASE("a graph keeps a retained user object until it and its executables are gone",
                   "[contract][capture]", STREAMPOOL_CONTRACT_HARNESSES) {
  TestType h;
  auto& device = h.device();
  cudaStream_t stream = h.create_stream();
  contract::user_objects_destroyed = 0;

  REQUIRE(device.begin_capture(stream, CaptureMode::global) == cudaSuccess);
  h.launch_short(stream);
  cudaGraph_t graph = nullptr;
  REQUIRE(device.end_capture(stream, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);

  cudaUserObject_t object = nullptr;
  REQUIRE(device.user_object_create(&object, nullptr, contract::count_destroyed) == cudaSuccess);
  REQUIRE(device.graph_retain_user_object(graph, object) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(device.graph_instantiate(&exec, graph) == cudaSuccess);
  REQUIRE(device.graph_destroy(graph) == cudaSuccess);

  REQUIRE(device.graph_upload(exec, stream) == cudaSuccess);
  for (int i = 0; i < 3; ++i) REQUIRE(device.graph_launch(exec, stream) == cudaSuccess);
  REQUIRE(device.stream_synchronize(stream) == cudaSuccess);
  REQUIRE(contract::user_objects_destroyed == 0);  // the executable graph still holds it

  REQUIRE(device.graph_exec_destroy(exec) == cudaSuccess);
  REQUIRE(h.wait_until([] { return contract::user_objects_destroyed == 1; }));
  h.destroy_stream(stream);
}
