// Reading and writing traces. Speed matters (the bench reads traces of hundreds of thousands of
// events before every run), so the whole text is read at once and split by hand: one memchr per
// line, std::from_chars per number, no iostream per field.
#include "trace.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace streampool::bench {
namespace {

enum class Column : std::size_t { thread, time, action, pointer, size, stream };
constexpr std::size_t column_count = 6;
constexpr std::array<std::string_view, column_count> column_names = {
    "Thread", "Time", "Action", "Pointer", "Size", "Stream"};
constexpr std::string_view header_line = "Thread,Time,Action,Pointer,Size,Stream";

enum class Action : std::uint8_t { alloc, free, free_completed };
enum class Vocabulary : std::uint8_t { unknown, rmm, pytorch };

struct ActionName {
  std::string_view name;
  Action action;
  Vocabulary vocabulary;
};
constexpr std::array<ActionName, 5> action_names = {{
    {"allocate", Action::alloc, Vocabulary::rmm},
    {"free", Action::free, Vocabulary::rmm},
    {"alloc", Action::alloc, Vocabulary::pytorch},
    {"free_requested", Action::free, Vocabulary::pytorch},
    {"free_completed", Action::free_completed, Vocabulary::pytorch},
}};

std::string_view vocabulary_name(Vocabulary vocabulary) {
  return vocabulary == Vocabulary::rmm ? "RMM's (allocate, free)"
                                       : "PyTorch's (alloc, free_requested, free_completed)";
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    return lower(x) == lower(y);
  });
}

// The whole of `text` as an unsigned number in `base`; nothing else (no sign, no spaces).
std::optional<std::uint64_t> parse_digits(std::string_view text, int base) {
  std::uint64_t value = 0;
  if (text.empty()) return std::nullopt;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value, base);
  if (error != std::errc{} || stop != end) return std::nullopt;
  return value;
}

// Decimal, or hexadecimal with a 0x prefix where `hex_allowed`.
std::optional<std::uint64_t> parse_number(std::string_view text, bool hex_allowed) {
  if (hex_allowed && text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    return parse_digits(text.substr(2), 16);
  }
  return parse_digits(text, 10);
}

// Microseconds: a decimal count, or RMM's clock HH:MM:SS.ffffff (spdlog's "%H:%M:%S.%f"), read
// as microseconds since midnight.
std::optional<std::uint64_t> parse_time(std::string_view text) {
  const std::size_t first_colon = text.find(':');
  if (first_colon == std::string_view::npos) return parse_digits(text, 10);
  const std::size_t second_colon = text.find(':', first_colon + 1);
  if (second_colon == std::string_view::npos) return std::nullopt;
  std::string_view seconds_text = text.substr(second_colon + 1);
  std::string_view fraction_text;
  if (const std::size_t dot = seconds_text.find('.'); dot != std::string_view::npos) {
    fraction_text = seconds_text.substr(dot + 1);
    seconds_text = seconds_text.substr(0, dot);
    if (fraction_text.empty() || fraction_text.size() > 9) return std::nullopt;
  }
  const auto hours = parse_digits(text.substr(0, first_colon), 10);
  const auto minutes = parse_digits(text.substr(first_colon + 1, second_colon - first_colon - 1), 10);
  const auto seconds = parse_digits(seconds_text, 10);
  if (!hours || !minutes || !seconds || *hours > 23 || *minutes > 59 || *seconds > 59) {
    return std::nullopt;
  }
  std::uint64_t micros = 0;
  if (!fraction_text.empty()) {
    const auto fraction = parse_digits(fraction_text, 10);
    if (!fraction) return std::nullopt;
    micros = *fraction;
    for (std::size_t digits = fraction_text.size(); digits < 6; ++digits) micros *= 10;
    for (std::size_t digits = fraction_text.size(); digits > 6; --digits) micros /= 10;
  }
  return ((*hours * 60 + *minutes) * 60 + *seconds) * 1'000'000 + micros;
}

// Index of `value` in `values`, appended on first sight. Traces name a handful of streams and
// threads, so a linear search (starting from the last hit) beats a hash.
std::uint32_t intern(std::vector<std::uint64_t>& values, std::uint64_t value, std::uint32_t& last) {
  if (last < values.size() && values[last] == value) return last;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i] == value) return last = static_cast<std::uint32_t>(i);
  }
  values.push_back(value);
  return last = static_cast<std::uint32_t>(values.size() - 1);
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view where, std::string name)
      : text_(text), where_(where) {
    trace_.name = std::move(name);
  }

  Trace run() {
    read_header();
    const auto lines = static_cast<std::size_t>(std::count(text_.begin(), text_.end(), '\n'));
    trace_.events.reserve(lines * 2 / 3 + 16);  // PyTorch's traces: a third are free_completed
    std::string_view line;
    while (next_line(line)) {
      if (!line.empty()) parse_event(line);
    }
    finish();
    return std::move(trace_);
  }

 private:
  struct Allocation {
    std::uint64_t size;
    std::uint64_t line;  // where it was allocated, for error messages
    std::uint32_t stream;
  };
  // A PyTorch free whose free_completed has not been seen yet.
  struct PendingCompletion {
    std::size_t event;       // index of the free in trace_.events
    std::uint64_t ordinal;   // position of its line among the event lines
  };

  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> what, Args&&... args) const {
    throw TraceError(
        fmt::format("{}:{}: {}", where_, line_number_, fmt::format(what, std::forward<Args>(args)...)));
  }

  bool next_line(std::string_view& line) {
    if (position_ >= text_.size()) return false;
    const char* begin = text_.data() + position_;
    const auto* newline =
        static_cast<const char*>(std::memchr(begin, '\n', text_.size() - position_));
    const std::size_t length =
        newline == nullptr ? text_.size() - position_ : static_cast<std::size_t>(newline - begin);
    line = std::string_view(begin, length);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    position_ += length + 1;
    ++line_number_;
    return true;
  }

  void split(std::string_view line) {
    fields_.clear();
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = line.find(',', start);
      if (comma == std::string_view::npos) {
        fields_.push_back(line.substr(start));
        return;
      }
      fields_.push_back(line.substr(start, comma - start));
      start = comma + 1;
    }
  }

  void read_header() {
    std::string_view line;
    if (!next_line(line)) {
      line_number_ = 1;
      fail("empty: the header line ({}) is required", header_line);
    }
    if (line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);  // a UTF-8 byte order mark
    split(line);
    columns_.fill(no_column);
    for (std::size_t field = 0; field < fields_.size(); ++field) {
      for (std::size_t column = 0; column < column_count; ++column) {
        if (!equal_ignoring_case(trim(fields_[field]), column_names[column])) continue;
        if (columns_[column] != no_column) fail("column {} twice in the header", column_names[column]);
        columns_[column] = field;
      }
    }
    for (std::size_t column = 0; column < column_count; ++column) {
      if (columns_[column] == no_column) {
        fail("no {} column in the header '{}' (the header line {} is required, in any order)",
             column_names[column], line, header_line);
      }
    }
    field_count_ = fields_.size();
  }

  std::string_view field(Column column) const {
    return trim(fields_[columns_[static_cast<std::size_t>(column)]]);
  }

  std::uint64_t number(Column column, bool hex_allowed, std::string_view expected) const {
    const std::string_view text = field(column);
    const auto value = parse_number(text, hex_allowed);
    if (!value) {
      fail("bad {} '{}' ({})", column_names[static_cast<std::size_t>(column)], text, expected);
    }
    return *value;
  }

  void parse_event(std::string_view line) {
    split(line);
    if (fields_.size() != field_count_) {
      fail("{} fields where the header has {}", fields_.size(), field_count_);
    }
    const std::string_view action_text = field(Column::action);
    const auto* named = std::find_if(action_names.begin(), action_names.end(),
                                     [&](const ActionName& a) { return a.name == action_text; });
    if (named == action_names.end()) {
      fail("unknown action '{}' (RMM's are allocate and free; PyTorch's alloc, free_requested and "
           "free_completed)",
           action_text);
    }
    if (vocabulary_ == Vocabulary::unknown) {
      vocabulary_ = named->vocabulary;
      vocabulary_line_ = line_number_;
    } else if (named->vocabulary != vocabulary_) {
      fail("action '{}' is not in the vocabulary of line {}, {}", action_text, vocabulary_line_,
           vocabulary_name(vocabulary_));
    }

    const std::uint64_t thread = number(Column::thread, true, "a decimal or 0x... thread id");
    const std::string_view time_text = field(Column::time);
    const auto time = parse_time(time_text);
    if (!time) fail("bad Time '{}' (decimal microseconds, or HH:MM:SS.ffffff)", time_text);
    const std::uint64_t pointer = number(Column::pointer, true, "a 0x... or decimal address");
    const std::uint64_t size = number(Column::size, false, "a decimal byte count");
    const std::uint64_t stream = number(Column::stream, true, "a 0x... or decimal stream handle");
    ++ordinal_;

    switch (named->action) {
      case Action::alloc: return alloc(thread, *time, pointer, size, stream);
      case Action::free: return free(thread, *time, pointer, size, stream);
      case Action::free_completed: return complete(pointer);
    }
  }

  void alloc(std::uint64_t thread, std::uint64_t time, std::uint64_t pointer, std::uint64_t size,
             std::uint64_t stream) {
    if (size == 0) {  // left out, and its free (a Size 0 free that pairs with it)
      ++trace_.empty_allocations;
      ++empty_live_;
      return;
    }
    const std::uint64_t allocation = trace_.allocations;
    const auto [live, inserted] = live_.try_emplace(pointer, allocation);
    if (!inserted) {
      fail("allocation of {:#x}, which is live (allocated at line {} and not freed since)", pointer,
           allocations_[live->second].line);
    }
    // PyTorch reuses a block only after its free completed: the completion was not recorded.
    if (!pending_.empty()) pending_.erase(pointer);
    // The replay and peak_requested() sum live sizes in 63 bits.
    if (size > max_live_bytes - live_bytes_) {
      fail("allocation of {} bytes: the live allocations would hold more than 2^63 - 1 bytes",
           size);
    }
    live_bytes_ += size;
    const std::uint32_t stream_index = intern(trace_.streams, stream, last_stream_);
    allocations_.push_back({size, line_number_, stream_index});
    ++trace_.allocations;
    trace_.events.push_back({TraceEvent::Kind::alloc, intern(trace_.threads, thread, last_thread_),
                             stream_index, no_stream, allocation, size, time});
  }

  void free(std::uint64_t thread, std::uint64_t time, std::uint64_t pointer, std::uint64_t size,
            std::uint64_t stream) {
    const auto live = live_.find(pointer);
    if (live == live_.end() && size == 0 && empty_live_ > 0) {
      --empty_live_;  // a request of no bytes' free
      return;
    }
    if (live == live_.end()) {
      if (const auto freed = freed_.find(pointer); freed != freed_.end()) {
        fail("free of {:#x}, which this trace allocated and freed at line {} (a double free)",
             pointer, freed->second);
      }
      ++trace_.unmatched_frees;  // allocated before recording began
      return;
    }
    const std::uint64_t allocation = live->second;
    const Allocation& allocated = allocations_[allocation];
    if (size != allocated.size) {
      fail("free of {:#x} with Size {}, allocated with Size {} at line {}", pointer, size,
           allocated.size, allocated.line);
    }
    const std::uint32_t freeing_stream = intern(trace_.streams, stream, last_stream_);
    const std::uint32_t used_on = freeing_stream == allocated.stream ? no_stream : freeing_stream;
    live_.erase(live);
    live_bytes_ -= size;
    freed_[pointer] = line_number_;
    trace_.events.push_back({TraceEvent::Kind::free, intern(trace_.threads, thread, last_thread_),
                             allocated.stream, used_on, allocation, size, time});
    if (vocabulary_ == Vocabulary::pytorch) {
      pending_[pointer] = {trace_.events.size() - 1, ordinal_};
    }
  }

  void complete(std::uint64_t pointer) {
    ++trace_.completed_frees;
    if (live_.contains(pointer)) fail("free_completed of {:#x} before its free_requested", pointer);
    const auto pending = pending_.find(pointer);
    if (pending == pending_.end()) return;  // its free_requested came before recording began
    if (ordinal_ > pending->second.ordinal + 1) delayed_.push_back(pending->second.event);
    pending_.erase(pending);
  }

  void finish() {
    trace_.left_live = live_.size();
    // A free never completed, with events after it: still in use elsewhere when recording ended.
    // Only in a trace that records completions at all.
    if (trace_.completed_frees > 0) {
      for (const auto& [pointer, pending] : pending_) {
        if (pending.ordinal < ordinal_) delayed_.push_back(pending.event);
      }
    }
    // Two streams: the delay can only have been the other stream's use.
    if (trace_.streams.size() == 2) {
      for (const std::size_t index : delayed_) {
        TraceEvent& event = trace_.events[index];
        if (event.used_on == no_stream) event.used_on = 1 - event.stream;
      }
    }
  }

  static constexpr std::size_t no_column = ~std::size_t{0};

  std::string_view text_;
  std::string_view where_;
  std::size_t position_ = 0;
  std::uint64_t line_number_ = 0;
  std::uint64_t ordinal_ = 0;
  std::array<std::size_t, column_count> columns_{};
  std::size_t field_count_ = 0;
  std::vector<std::string_view> fields_;
  Vocabulary vocabulary_ = Vocabulary::unknown;
  std::uint64_t vocabulary_line_ = 0;
  std::uint32_t last_stream_ = 0;
  std::uint32_t last_thread_ = 0;

  Trace trace_;
  std::vector<Allocation> allocations_;                       // by allocation number
  std::unordered_map<std::uint64_t, std::uint64_t> live_;     // pointer -> allocation number
  // Pointers this trace allocated and freed -> the line of their last free (one allocated again
  // is found in live_ first).
  std::unordered_map<std::uint64_t, std::uint64_t> freed_;
  static constexpr std::uint64_t max_live_bytes = std::numeric_limits<std::int64_t>::max();
  std::uint64_t live_bytes_ = 0;  // the live allocations' sizes, at most max_live_bytes
  std::uint64_t empty_live_ = 0;  // requests of no bytes not yet freed (CUDA gives all one pointer)
  std::unordered_map<std::uint64_t, PendingCompletion> pending_;  // pointer -> its free
  std::vector<std::size_t> delayed_;  // frees completed only after other events
};

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

bool gzip_magic(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// The text of gzip data: one member or several one after another (as `cat a.gz b.gz` makes, and
// `gzip -d` reads), and nothing else. zlib's gzread passes over bytes after the last member that
// are no member, without a word; here they are an error.
std::string inflate_gzip(const std::string& path, std::string_view bytes) {
  const auto bad = [&path](std::string_view why) {
    return TraceError(fmt::format("{}: bad gzip data: {}", path, why));
  };
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) throw bad("zlib cannot start");  // gzip wrapper only
  const std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, inflateEnd);
  std::string text;
  std::size_t at = 0;  // bytes consumed
  constexpr std::size_t chunk = std::size_t{1} << 22;
  for (;;) {
    const std::size_t in = std::min<std::size_t>(bytes.size() - at, 1u << 30);
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data() + at));
    z.avail_in = static_cast<uInt>(in);
    const std::size_t used = text.size();
    text.resize(used + chunk);
    z.next_out = reinterpret_cast<Bytef*>(text.data() + used);
    z.avail_out = static_cast<uInt>(chunk);
    const int status = inflate(&z, Z_NO_FLUSH);
    text.resize(used + chunk - z.avail_out);
    at += in - z.avail_in;
    if (status == Z_STREAM_END) {
      if (at == bytes.size()) return text;
      if (!gzip_magic(bytes.substr(at))) {
        throw bad(fmt::format("{} bytes after the gzip data, which are no gzip member",
                              bytes.size() - at));
      }
      if (inflateReset(&z) != Z_OK) throw bad("zlib cannot go on to the next member");
      continue;
    }
    if (status == Z_BUF_ERROR && at == bytes.size()) throw bad("the data ends early");
    if (status != Z_OK && status != Z_BUF_ERROR) {
      throw bad(z.msg != nullptr ? z.msg : "inflate failed");
    }
  }
}

std::string read_file(const std::string& path) {
  const std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw TraceError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string bytes;
  constexpr std::size_t chunk = std::size_t{1} << 22;
  for (;;) {
    const std::size_t used = bytes.size();
    bytes.resize(used + chunk);
    const std::size_t read = std::fread(bytes.data() + used, 1, chunk, file.get());
    bytes.resize(used + read);
    if (read < chunk) break;
  }
  if (std::ferror(file.get())) throw TraceError(fmt::format("{}: cannot read", path));
  return gzip_magic(bytes) ? inflate_gzip(path, bytes) : bytes;
}

// "dir/gpt2_train.csv.gz" -> "gpt2_train".
std::string trace_name(std::string_view path) {
  if (const std::size_t slash = path.rfind('/'); slash != std::string_view::npos) {
    path.remove_prefix(slash + 1);
  }
  if (path.ends_with(".gz")) path.remove_suffix(3);
  if (path.ends_with(".csv")) path.remove_suffix(4);
  return std::string(path);
}

void append_number(std::string& out, std::uint64_t value, int base) {
  std::array<char, 24> digits{};
  const auto result = std::to_chars(digits.data(), digits.data() + digits.size(), value, base);
  out.append(digits.data(), result.ptr);
}

void append_hex(std::string& out, std::uint64_t value) {
  out += "0x";
  append_number(out, value, 16);
}

}  // namespace

std::uint64_t Trace::peak_requested() const {
  std::uint64_t live = 0;
  std::uint64_t peak = 0;
  for (const TraceEvent& event : events) {
    if (event.kind == TraceEvent::Kind::alloc) {
      live += event.size;
      peak = std::max(peak, live);
    } else {
      live -= event.size;
    }
  }
  return peak;
}

Trace parse_trace(std::istream& csv, const std::string& name) {
  std::ostringstream content;
  content << csv.rdbuf();
  const std::string text = std::move(content).str();
  return Parser(text, name, name).run();
}

Trace read_trace(const std::string& path) {
  const std::string text = read_file(path);
  return Parser(text, path, trace_name(path)).run();
}

void write_trace(std::ostream& out, const Trace& trace) {
  // Synthetic addresses: a bump pointer, 512-byte aligned, never reused, so no two allocations
  // (live or not) share one.
  constexpr std::uint64_t base_address = 0x7f0000000000;
  std::vector<std::uint64_t> addresses(trace.allocations);
  std::uint64_t next_address = base_address;

  std::string text;
  text.reserve(std::size_t{1} << 20);
  text.append(header_line).push_back('\n');
  for (const TraceEvent& event : trace.events) {
    std::uint64_t address = 0;
    std::uint32_t stream = event.stream;
    if (event.kind == TraceEvent::Kind::alloc) {
      address = addresses.at(event.allocation) = next_address;
      next_address += (std::max<std::uint64_t>(event.size, 1) + 511) / 512 * 512;
    } else {
      address = addresses.at(event.allocation);
      if (event.used_on != no_stream) stream = event.used_on;
    }
    append_number(text, trace.threads.at(event.thread), 10);
    text.push_back(',');
    append_number(text, event.time_us, 10);
    text.append(event.kind == TraceEvent::Kind::alloc ? ",allocate," : ",free,");
    append_hex(text, address);
    text.push_back(',');
    append_number(text, event.size, 10);
    text.push_back(',');
    append_hex(text, trace.streams.at(stream));
    text.push_back('\n');
    if (text.size() > (std::size_t{1} << 20) - 128) {
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      text.clear();
    }
  }
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace streampool::bench
