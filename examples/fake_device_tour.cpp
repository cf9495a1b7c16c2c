// A tour of FakeDevice: stream-ordered GPU code tested on a machine without a GPU. Two streams
// share a buffer; without an event between them the fake device reports the race, with one it
// does not.
#include <streampool/fake_device.hpp>

#include <fmt/format.h>

int main() {
  streampool::FakeDevice device;
  cudaStream_t producer = device.create_stream();
  cudaStream_t consumer = device.create_stream();

  void* buffer = nullptr;
  if (device.malloc(&buffer, 1 << 20) != cudaSuccess) return 1;

  // The producer writes the buffer; the consumer reads it with nothing ordering the two.
  device.launch(producer, {{buffer, 1 << 20, true}});
  device.launch(consumer, {{buffer, 1 << 20, false}});
  fmt::print("unordered: {} hazard(s)\n", device.hazards().size());
  for (const auto& hazard : device.hazards()) fmt::print("  {}\n", hazard.what);
  device.clear_hazards();
  device.device_synchronize();  // let both finish before the second round

  // The same, ordered by an event: the consumer waits for the producer's write.
  cudaEvent_t written = nullptr;
  if (device.event_create(&written) != cudaSuccess) return 1;
  device.launch(producer, {{buffer, 1 << 20, true}});
  device.event_record(written, producer);
  device.stream_wait_event(consumer, written);
  device.launch(consumer, {{buffer, 1 << 20, false}});
  fmt::print("ordered by an event: {} hazard(s)\n", device.hazards().size());

  device.device_synchronize();
  device.event_destroy(written);
  device.free(buffer);
  fmt::print("seam calls made: {}\n", device.total_calls());
  return device.hazards().empty() ? 0 : 1;
}
