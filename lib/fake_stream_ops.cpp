// FakeStreamOps: StreamOps on the fake device (fake_device.hpp).
#include <streampool/fake_device.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace streampool {

FakeStreamOps::FakeStreamOps(std::shared_ptr<FakeDevice> device)
    : StreamOps(device), fake_(std::move(device)) {}

cudaStream_t FakeStreamOps::create_stream(std::string_view name) {
  return fake_->create_stream(std::string(name));
}

void FakeStreamOps::destroy_stream(cudaStream_t stream) { fake_->destroy_stream(stream); }

void FakeStreamOps::copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                         cudaStream_t stream, std::string_view label) {
  std::vector<MemoryAccess> accesses;
  if (kind != CopyKind::host_to_device) accesses.push_back(reads(src, bytes));
  if (kind != CopyKind::device_to_host) accesses.push_back(writes(dst, bytes));
  std::function<void()> body;
  // Without host backing the device side has no bytes behind it: only the accesses count.
  if (fake_->options().host_backed) body = [=] { std::memcpy(dst, src, bytes); };
  fake_->launch(stream, accesses, std::move(body), label.empty() ? "copy" : label);
}

void FakeStreamOps::set(void* dst, int value, std::size_t bytes, cudaStream_t stream,
                        std::string_view label) {
  std::function<void()> body;
  if (fake_->options().host_backed) body = [=] { std::memset(dst, value, bytes); };
  fake_->launch(stream, {writes(dst, bytes)}, std::move(body), label.empty() ? "set" : label);
}

void FakeStreamOps::enqueue_work(cudaStream_t stream, std::string_view label,
                                 std::span<const MemoryAccess> accesses, LaunchRef,
                                 std::function<void()> host_body) {
  fake_->launch(stream, std::vector<MemoryAccess>(accesses.begin(), accesses.end()),
                std::move(host_body), label);
}

}  // namespace streampool
