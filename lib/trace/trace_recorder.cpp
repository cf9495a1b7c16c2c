// The trace recorder (<streampool/trace_recorder.hpp>): its file, its ids, and the public calls
// that start and stop it.
#include "trace_recorder.hpp"

#include "../pool/pool_core.hpp"
#include "../pool/stream_state.hpp"

#include <streampool/error.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <new>
#include <set>

namespace streampool::detail {
namespace {

// The files the process's recorders hold, each under file_key(): a second pool given one of
// them gets another name rather than truncating the first pool's file.
struct OpenPaths {
  std::mutex mutex;
  std::set<std::string> held;
};
OpenPaths& open_paths() {
  static OpenPaths* instance = new OpenPaths;  // never destroyed: recorders close at exit too
  return *instance;
}

// The file a path names, however it is spelled: absolute, without "." or "..", through symbolic
// links ("dir/./run.csv", a relative path and an absolute one). The path itself where the file
// system cannot say.
std::string file_key(const std::string& path) {
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  if (error) return path;
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(absolute, error);
  return error ? absolute.string() : canonical.string();
}

// The recorders alive in the process, whose buffered lines are written out at a normal exit: a
// pool that lives until then (the registry's, device_pools.hpp, is never destroyed) would
// otherwise lose up to a block of them. Lock order: this mutex, then a recorder's; a recorder
// takes it holding nothing (start, before its own; its destructor, before its own).
struct LiveRecorders {
  std::mutex mutex;
  std::set<TraceRecorder*> recorders;
};
LiveRecorders& live_recorders() {
  static LiveRecorders* instance = new LiveRecorders;  // never destroyed: used at exit
  return *instance;
}

void flush_at_exit() noexcept {
  LiveRecorders& live = live_recorders();
  std::lock_guard<std::mutex> lock(live.mutex);
  for (TraceRecorder* recorder : live.recorders) recorder->exiting();
}

// "dir/trace.csv" -> "dir/trace.2.csv" for n = 2; "trace" -> "trace.2".
std::string numbered(const std::string& path, unsigned n) {
  const std::size_t slash = path.rfind('/');
  const std::size_t dot = path.rfind('.');
  const bool has_extension =
      dot != std::string::npos && dot != 0 && (slash == std::string::npos || dot > slash + 1);
  if (!has_extension) return fmt::format("{}.{}", path, n);
  return fmt::format("{}.{}{}", path.substr(0, dot), n, path.substr(dot));
}

void release_path(const std::string& path) noexcept {
  std::lock_guard<std::mutex> lock(open_paths().mutex);
  open_paths().held.erase(path);
}

constexpr std::string_view header = "Thread,Time,Action,Pointer,Size,Stream\n";

}  // namespace

std::size_t TraceRecorder::StreamKeyHash::operator()(const StreamKey& key) const noexcept {
  return std::hash<const void*>()(key.first) ^ (std::hash<std::uint64_t>()(key.second) << 1);
}

TraceRecorder::~TraceRecorder() {
  {
    LiveRecorders& live = live_recorders();
    std::lock_guard<std::mutex> lock(live.mutex);
    live.recorders.erase(this);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  close_file();
}

void TraceRecorder::start(const std::string& path) {
  {
    static std::once_flag registered;
    std::call_once(registered, [] {
      if (std::atexit(flush_at_exit) != 0) throw std::bad_alloc();
    });
    LiveRecorders& live = live_recorders();
    std::lock_guard<std::mutex> lock(live.mutex);
    live.recorders.insert(this);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (recording()) {
    throw Error(Errc::invalid_value, fmt::format("trace_file '{}': the pool is recording to '{}' "
                                                 "already",
                                                 path, status_.path));
  }
  std::string chosen = path;
  std::string key = file_key(chosen);
  {
    std::lock_guard<std::mutex> paths(open_paths().mutex);
    for (unsigned n = 2; open_paths().held.contains(key); ++n) {
      chosen = numbered(path, n);
      key = file_key(chosen);
    }
    errno = 0;
    file_ = std::fopen(chosen.c_str(), "wb");
    if (file_ == nullptr) {
      const int why = errno;
      throw Error(Errc::invalid_value,
                  fmt::format("trace_file '{}': cannot open it for writing: {}", chosen,
                              why != 0 ? std::strerror(why) : "unknown reason"));
    }
    open_paths().held.insert(key);
  }
  // The buffer is ours; the file's own would only copy it once more.
  std::setvbuf(file_, nullptr, _IONBF, 0);
  // The header now, so that a file that cannot be written (a full disk) fails here, and a
  // recording with no calls yet is already a trace.
  errno = 0;
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size()) {
    const int why = errno;
    std::fclose(std::exchange(file_, nullptr));
    release_path(key);
    throw Error(Errc::invalid_value,
                fmt::format("trace_file '{}': cannot write to it: {}", chosen,
                            why != 0 ? std::strerror(why) : "short write"));
  }
  status_ = TraceStatus{};
  status_.recording = true;
  status_.path = chosen;
  held_as_ = std::move(key);
  pid_ = ::getpid();
  live_.clear();
  streams_.clear();
  threads_.clear();
  buffer_.clear();
  buffer_.reserve(block_bytes + 256);
  start_ = std::chrono::steady_clock::now();
  core_.observing(true);
}

TraceStatus TraceRecorder::stop() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  close_file();
  // A copy of the strings needs host memory, which a noexcept call cannot fail for: without it,
  // the counts alone.
  TraceStatus out;
  out.recording = status_.recording;
  out.allocations = status_.allocations;
  out.frees = status_.frees;
  out.unseen_frees = status_.unseen_frees;
  out.streams = status_.streams;
  out.threads = status_.threads;
  try {
    out.path = status_.path;
    out.error_message = status_.error_message;
  } catch (const std::bad_alloc&) {
  }
  return out;
}

void TraceRecorder::flush() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (recording()) write_out();
}

void TraceRecorder::exiting() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pid_ != ::getpid()) return;
  write_at_once_ = true;
  if (recording()) write_out();
}

TraceStatus TraceRecorder::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

void TraceRecorder::allocated(const void* ptr, std::size_t bytes, cudaStream_t stream) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording()) return;
  try {
    const StreamKey key = key_of(stream);
    const std::uint32_t id = stream_id(key);
    live_.insert_or_assign(ptr, Live{bytes, key, id, no_stream});
    write_line(true, ptr, bytes, id);
    ++status_.allocations;
  } catch (const std::bad_alloc&) {
    fail("no memory to record an allocation");
  }
}

void TraceRecorder::freeing(const void* ptr, cudaStream_t stream) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording()) return;
  try {
    write_free(ptr, key_of(stream));
  } catch (const std::bad_alloc&) {
    fail("no memory to record a free");
  }
}

void TraceRecorder::dropping(const void* ptr) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording()) return;
  try {
    write_free(ptr, std::nullopt);
  } catch (const std::bad_alloc&) {
    fail("no memory to record a free");
  }
}

void TraceRecorder::write_free(const void* ptr, const std::optional<StreamKey>& key) {
  const auto found = live_.find(ptr);
  if (found == live_.end()) {
    ++status_.unseen_frees;  // allocated before the recording started (or not this pool's)
    return;
  }
  const Live live = found->second;
  live_.erase(found);
  // On its own stream (a buffer's drop always is, `key` none): the allocation's id, which a
  // release_stream of the handle since does not change; then the last stream record_stream
  // named, if any.
  std::uint32_t id = !key || *key == live.key ? live.stream : stream_id(*key);
  if (id == live.stream && live.used_on != no_stream) id = live.used_on;
  write_line(false, ptr, live.bytes, id);
  ++status_.frees;
}

void TraceRecorder::recorded_stream(const void* ptr, cudaStream_t stream) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording()) return;
  const auto found = live_.find(ptr);
  if (found == live_.end()) return;
  try {
    const StreamKey key = key_of(stream);
    if (key != found->second.key) found->second.used_on = stream_id(key);
  } catch (const std::bad_alloc&) {
    fail("no memory to record a record_stream");
  }
}

void TraceRecorder::releasing_stream(cudaStream_t stream) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording()) return;
  streams_.erase(key_of(stream));
}

void TraceRecorder::closing() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  write_at_once_ = true;
  if (recording()) write_out();
}

TraceRecorder::StreamKey TraceRecorder::key_of(cudaStream_t stream) noexcept {
  // 0 and cudaStreamLegacy name one stream, the legacy default stream, as the pool sees it.
  if (stream == nullptr) stream = cudaStreamLegacy;
  return {stream, stream == cudaStreamPerThread ? this_thread_token() : 0};
}

std::uint32_t TraceRecorder::stream_id(const StreamKey& key) {
  const auto [it, inserted] =
      streams_.try_emplace(key, static_cast<std::uint32_t>(status_.streams));
  if (inserted) ++status_.streams;
  return it->second;
}

std::uint32_t TraceRecorder::thread_id() {
  const auto [it, inserted] = threads_.try_emplace(std::this_thread::get_id(),
                                                   static_cast<std::uint32_t>(status_.threads));
  if (inserted) ++status_.threads;
  return it->second;
}

void TraceRecorder::write_line(bool allocation, const void* ptr, std::size_t bytes,
                               std::uint32_t stream) {
  // Under the mutex: the times never decrease down the file.
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - start_)
                          .count();
  // By hand with to_chars: fmt::format_to into the string cost about a microsecond a line.
  const auto put = [this](std::uint64_t value, int base) {
    std::array<char, 24> digits;
    const auto result = std::to_chars(digits.data(), digits.data() + digits.size(), value, base);
    buffer_.append(digits.data(), result.ptr);
  };
  put(thread_id(), 10);
  buffer_.push_back(',');
  put(static_cast<std::uint64_t>(micros), 10);
  buffer_.append(allocation ? ",allocate,0x" : ",free,0x");
  put(reinterpret_cast<std::uintptr_t>(ptr), 16);
  buffer_.push_back(',');
  put(bytes, 10);
  buffer_.push_back(',');
  put(stream, 10);
  buffer_.push_back('\n');
  if (buffer_.size() >= block_bytes || write_at_once_) write_out();
}

void TraceRecorder::write_out() noexcept {
  if (buffer_.empty()) return;
  errno = 0;
  const std::size_t written = std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
  if (written != buffer_.size()) {
    const int why = errno;
    fail("writing it failed", why != 0 ? std::strerror(why) : "short write");
    return;
  }
  buffer_.clear();
}

void TraceRecorder::fail(std::string_view why, const char* reason) noexcept {
  try {
    status_.error_message = fmt::format(
        "trace_file '{}': {}{}{}; the recording stopped after {} allocations and {} frees (the "
        "file is incomplete)",
        status_.path, why, reason != nullptr ? ": " : "", reason != nullptr ? reason : "",
        status_.allocations, status_.frees);
    std::fprintf(stderr, "streampool: %s\n", status_.error_message.c_str());
  } catch (...) {
    std::fprintf(stderr, "streampool: trace_file: %.*s%s%s\n", static_cast<int>(why.size()),
                 why.data(), reason != nullptr ? ": " : "", reason != nullptr ? reason : "");
  }
  buffer_.clear();
  close_file();
}

void TraceRecorder::close_file() noexcept {
  if (file_ == nullptr) return;
  core_.observing(false);  // calls in flight find the file closed and write nothing
  write_out();             // may fail, and come back here with nothing left to write
  if (file_ == nullptr) return;
  std::FILE* file = std::exchange(file_, nullptr);
  status_.recording = false;
  errno = 0;
  if (std::fclose(file) != 0 && status_.error_message.empty()) {
    const int why = errno;
    const char* reason = why != 0 ? std::strerror(why) : "unknown reason";
    try {
      status_.error_message =
          fmt::format("trace_file '{}': closing it failed: {}", status_.path, reason);
      std::fprintf(stderr, "streampool: %s\n", status_.error_message.c_str());
    } catch (...) {
      std::fprintf(stderr, "streampool: trace_file: closing it failed: %s\n", reason);
    }
  }
  release_path(held_as_);
}

}  // namespace streampool::detail

namespace streampool {
namespace {

detail::TraceRecorder& recorder_of(MemoryPool& pool) {
  detail::PoolCore& core = pool.core();
  auto& observer = core.install_observer(std::make_unique<detail::TraceRecorder>(core));
  // The trace recorder is the only observer there is.
  return static_cast<detail::TraceRecorder&>(observer);
}

}  // namespace

void start_trace(MemoryPool& pool, const std::string& path) { recorder_of(pool).start(path); }

TraceStatus stop_trace(MemoryPool& pool) noexcept {
  detail::Observer* observer = pool.core().installed_observer();
  if (observer == nullptr) return {};
  return static_cast<detail::TraceRecorder*>(observer)->stop();
}

void flush_trace(MemoryPool& pool) noexcept {
  if (detail::Observer* observer = pool.core().installed_observer()) {
    static_cast<detail::TraceRecorder*>(observer)->flush();
  }
}

TraceStatus trace_status(const MemoryPool& pool) {
  detail::Observer* observer = pool.core().installed_observer();
  if (observer == nullptr) return {};
  return static_cast<detail::TraceRecorder*>(observer)->status();
}

}  // namespace streampool
