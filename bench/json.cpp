#include "json.hpp"

#include <fmt/format.h>

#include <cmath>

namespace streampool::bench {

void Json::separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

Json& Json::begin_object() {
  separate();
  out_ += '{';
  first_.push_back(true);
  return *this;
}
Json& Json::end_object() {
  out_ += '}';
  first_.pop_back();
  return *this;
}
Json& Json::begin_array() {
  separate();
  out_ += '[';
  first_.push_back(true);
  return *this;
}
Json& Json::end_array() {
  out_ += ']';
  first_.pop_back();
  return *this;
}

Json& Json::key(std::string_view name) {
  value(name);
  out_ += ':';
  after_key_ = true;
  return *this;
}

Json& Json::value(std::string_view text) {
  separate();
  out_ += '"';
  for (char c : text) {
    switch (c) {
      case '"': out_ += "\\\""; break;
      case '\\': out_ += "\\\\"; break;
      case '\n': out_ += "\\n"; break;
      case '\t': out_ += "\\t"; break;
      case '\r': out_ += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out_ += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out_ += c;
        }
    }
  }
  out_ += '"';
  return *this;
}

Json& Json::value(std::uint64_t number) {
  separate();
  out_ += fmt::format("{}", number);
  return *this;
}
Json& Json::value(std::int64_t number) {
  separate();
  out_ += fmt::format("{}", number);
  return *this;
}
Json& Json::value(double number) {
  separate();
  out_ += std::isfinite(number) ? fmt::format("{}", number) : std::string("null");
  return *this;
}
Json& Json::value(bool flag) {
  separate();
  out_ += flag ? "true" : "false";
  return *this;
}

}  // namespace streampool::bench
