// docs/guide.md, "Tuning on your own trace": the trace recorder writing what a program allocates,
// for `streampool-bench replay` and `tune` (which CTest runs on the file this writes).
//
//   streampool-guide-trace PATH                        records a window of the run with start_trace
//   streampool-guide-trace --from-environment PATH     expects STREAMPOOL_CONF=trace_file=PATH
//
// Exits with 1 when the recording is not what the guide says it is.
#include <streampool/streampool.hpp>

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

using streampool::PooledBuffer;

namespace {

bool right = true;
void expect(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "trace: not as docs/guide.md says: %s\n", what);
  right = right && ok;
}

// A stand-in for an application's step: buffers of a few sizes, small and large, dropped in
// reverse order. 5 allocations.
void step(streampool::MemoryPool& pool, cudaStream_t stream) {
  std::vector<PooledBuffer<std::byte>> live;
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{100} << 10, std::size_t{3} << 20,
                            std::size_t{512}, std::size_t{40} << 20}) {
    live.push_back(PooledBuffer<std::byte>::alloc_async(pool, bytes, stream));
  }
  while (!live.empty()) live.pop_back();
}

std::string first_line(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// Lines of the file that name `action` (",allocate," or ",free,").
int count_lines(const std::string& path, std::string_view action) {
  std::ifstream file(path);
  int count = 0;
  for (std::string line; std::getline(file, line);) count += line.find(action) != std::string::npos;
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  const bool from_environment = argc == 3 && std::string_view(argv[1]) == "--from-environment";
  if (argc != 2 && !from_environment) {
    std::fprintf(stderr, "usage: %s [--from-environment] PATH\n", argv[0]);
    return 2;
  }
  const std::string path = argv[argc - 1];
  streampool::FakeDevice::Options fake;
  fake.auto_complete = true;
  auto device = std::make_shared<streampool::FakeDevice>(fake);
  cudaStream_t stream = device->create_stream("main");

  if (from_environment) {
    {
      streampool::MemoryPool pool(device);  // reads STREAMPOOL_CONF: recording from here on
      const streampool::TraceStatus status = streampool::trace_status(pool);
      expect(status.recording && status.path == path, "STREAMPOOL_CONF=trace_file=PATH records");
      for (int i = 0; i < 3; ++i) step(pool, stream);
    }  // the pool's destruction writes the rest of the file
  } else {
    streampool::MemoryPool pool(device);
    step(pool, stream);  // before the window: not recorded
    // guide-begin trace_window
    streampool::start_trace(pool, path);  // every allocation and free of `pool` from here on
    for (int i = 0; i < 3; ++i) step(pool, stream);
    const streampool::TraceStatus status = streampool::stop_trace(pool);  // the file is complete
    std::printf("%s: %llu allocations, %llu frees\n", status.path.c_str(),
                static_cast<unsigned long long>(status.allocations),
                static_cast<unsigned long long>(status.frees));
    // guide-end
    expect(status.allocations == 15 && status.frees == 15, "15 allocations and 15 frees");
    expect(status.error_message.empty(), "no write error");
  }
  expect(first_line(path) == "Thread,Time,Action,Pointer,Size,Stream", "the bench's CSV header");
  expect(count_lines(path, ",allocate,") == 15 && count_lines(path, ",free,") == 15,
         "the file holds the 15 allocations and 15 frees of the three steps");
  device->destroy_stream(stream);
  return right ? 0 : 1;
}
