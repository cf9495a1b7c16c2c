// The worked example, run: on the GPU where there is one, then on the fake device in each of its
// three versions, printing what the fake reports. Exits 1 when a result or a report is not what
// the version should give.
#include "producer_consumer.hpp"

#include <streampool/cuda_device.hpp>
#include <streampool/fake_device.hpp>
#include <streampool/memory_pool.hpp>

#include <fmt/format.h>

#include <memory>

namespace {

constexpr std::size_t n = std::size_t{1} << 16;

bool on_the_gpu() {
  auto device = std::make_shared<streampool::CudaDevice>(0);
  streampool::CudaStreamOps ops(device);
  streampool::MemoryPool pool(device);
  cudaStream_t producer = ops.create_stream("producer");
  cudaStream_t consumer = ops.create_stream("consumer");
  const float result = example::produce_and_consume(ops, pool, producer, consumer, n);
  ops.destroy_stream(consumer);
  ops.destroy_stream(producer);
  fmt::print("GPU: sum {} (expected {})\n", result, n);
  return result == static_cast<float>(n);
}

const char* name_of(example::Mistake mistake) {
  switch (mistake) {
    case example::Mistake::none: return "correct";
    case example::Mistake::no_event_wait: return "without the event wait";
    case example::Mistake::no_record_stream: return "without record_stream";
  }
  return "?";
}

bool on_the_fake(example::Mistake mistake) {
  streampool::FakeDevice::Options options;
  options.host_backed = true;  // the host bodies compute what the kernels would
  auto device = std::make_shared<streampool::FakeDevice>(options);
  streampool::FakeStreamOps ops(device);
  bool reported = false;
  {
    streampool::MemoryPool pool(device);
    cudaStream_t producer = ops.create_stream("producer");
    cudaStream_t consumer = ops.create_stream("consumer");
    const float result = example::produce_and_consume(ops, pool, producer, consumer, n, mistake);
    fmt::print("fake, {}: sum {}, {} hazard(s)\n", name_of(mistake), result,
               device->hazards().size());
    for (const auto& hazard : device->hazards()) {
      fmt::print("  {}: {}\n", streampool::FakeDevice::hazard_name(hazard.kind), hazard.what);
    }
    reported = !device->hazards().empty();
    ops.destroy_stream(consumer);
    ops.destroy_stream(producer);
  }
  return reported == (mistake != example::Mistake::none);
}

}  // namespace

int main() {
  bool ok = true;
  if (streampool::CudaDevice::count() > 0) ok = on_the_gpu() && ok;
  for (auto mistake : {example::Mistake::none, example::Mistake::no_event_wait,
                       example::Mistake::no_record_stream}) {
    ok = on_the_fake(mistake) && ok;
  }
  return ok ? 0 : 1;
}
