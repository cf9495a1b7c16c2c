// TraceRecorder: the pool's Observer (lib/pool/observer.hpp) that writes the trace
// <streampool/trace_recorder.hpp> describes. A layer above the pool: it includes lib/pool, the
// pool core knows only the Observer interface.
//
// One mutex guards everything below it: the file's order is the order the calls took it, with
// nothing to merge (per-thread buffers would need a sequence number per line and a merge at each
// flush). What it costs is measured in docs/design.md, "The trace recorder".
#pragma once

#include "../pool/observer.hpp"

#include <streampool/trace_recorder.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

namespace streampool::detail {

class PoolCore;

class TraceRecorder final : public Observer {
 public:
  explicit TraceRecorder(PoolCore& core) noexcept : core_(core) {}
  // Runs when the pool core is destroyed (its last buffer gone): writes the rest and closes.
  ~TraceRecorder() override;
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // Opens `path` (or its ".N" variant, when another recorder of the process holds it) and
  // publishes the recorder to the core. Throws Error(invalid_value) naming the path.
  void start(const std::string& path);
  TraceStatus stop() noexcept;
  void flush() noexcept;
  TraceStatus status() const;
  // At a normal exit of the process: writes the buffer out, and each line at once from then on
  // (statics destroyed after the exit handler drop buffers too). Nothing in a child of fork():
  // its copy of the buffer is the parent's to write.
  void exiting() noexcept;

  void allocated(const void* ptr, std::size_t bytes, cudaStream_t stream) noexcept override;
  void freeing(const void* ptr, cudaStream_t stream) noexcept override;
  void dropping(const void* ptr) noexcept override;
  void recorded_stream(const void* ptr, cudaStream_t stream) noexcept override;
  void releasing_stream(cudaStream_t stream) noexcept override;
  void closing() noexcept override;

  // Lines are buffered up to this many bytes before they are written.
  static constexpr std::size_t block_bytes = std::size_t{64} << 10;

 private:
  // A stream as the file tells streams apart: its handle, and for cudaStreamPerThread the thread
  // (another stream in each), named by its token (this_thread_token(): never another thread's,
  // as an exited thread's std::thread::id is); 0 for every other handle.
  using StreamKey = std::pair<cudaStream_t, std::uint64_t>;
  struct StreamKeyHash {
    std::size_t operator()(const StreamKey& key) const noexcept;
  };
  struct Live {
    std::size_t bytes;
    StreamKey key;          // the allocation's stream, as the file tells streams apart
    std::uint32_t stream;   // and its id then (a release_stream since gives the key a new one)
    std::uint32_t used_on;  // the last other stream record_stream named, or no_stream
  };
  static constexpr std::uint32_t no_stream = ~std::uint32_t{0};

  // All [mutex_].
  bool recording() const noexcept { return file_ != nullptr; }
  static StreamKey key_of(cudaStream_t stream) noexcept;
  std::uint32_t stream_id(const StreamKey& key);
  std::uint32_t thread_id();
  // The free of the live allocation at `ptr`, on the stream `key` names (none: its own).
  void write_free(const void* ptr, const std::optional<StreamKey>& key);
  void write_line(bool allocation, const void* ptr, std::size_t bytes, std::uint32_t stream);
  // Writes the buffer out; on failure, stops the recording with `what` and the OS's reason.
  void write_out() noexcept;
  void fail(std::string_view why, const char* reason = nullptr) noexcept;
  void close_file() noexcept;

  PoolCore& core_;
  mutable std::mutex mutex_;
  std::FILE* file_ = nullptr;  // open while recording
  TraceStatus status_;         // status_.recording mirrors file_ != nullptr
  std::string held_as_;        // the key the process's open paths hold the file under
  std::chrono::steady_clock::time_point start_;
  std::string buffer_;
  // The MemoryPool object is gone, or the process is exiting: each line is written at once.
  bool write_at_once_ = false;
  int pid_ = 0;  // the process that started the recording (a child of fork() writes none of it)
  std::unordered_map<const void*, Live> live_;
  std::unordered_map<StreamKey, std::uint32_t, StreamKeyHash> streams_;
  // By std::thread::id, which a thread that ended hands to a later one: the two get one number
  // (they never ran at once, and the replay runs their calls in order on one thread of its own).
  // A program that makes a thread per task would otherwise ask the replay for a thread each.
  std::unordered_map<std::thread::id, std::uint32_t> threads_;
};

}  // namespace streampool::detail
