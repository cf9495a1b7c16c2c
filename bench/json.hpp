// A small JSON writer: enough for the bench's reports, with correct string escaping.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace streampool::bench {

class Json {
 public:
  Json& begin_object();
  Json& end_object();
  Json& begin_array();
  Json& end_array();
  Json& key(std::string_view name);
  Json& value(std::string_view text);
  Json& value(const char* text) { return value(std::string_view(text)); }
  Json& value(std::uint64_t number);
  Json& value(std::int64_t number);
  Json& value(double number);
  Json& value(bool flag);
  template <class T>
  Json& field(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }
  const std::string& str() const { return out_; }

 private:
  void separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace streampool::bench
