// The user's pool settings, as the bench takes them: the pool's defaults, then STREAMPOOL_CONF
// from the environment (as a MemoryPool reads it), then the command line's --config, each on top
// of the one before, so that --config wins over the environment key by key. The bench then gives
// its pools these options with read_environment off, so that STREAMPOOL_CONF is applied once and
// --config keeps the last word.
//
// A STREAMPOOL_CONF line is a list of "key=value" items separated by commas (PoolOptions::parse);
// the helpers here work on that text, so that tune can recommend the keys it changed on top of
// the user's own items without losing one of them (a memory limit, a stream_checks choice).
#pragma once

#include <streampool/pool_options.hpp>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace streampool::bench {

struct ConfItem {
  std::string key;
  std::string value;
  friend bool operator==(const ConfItem&, const ConfItem&) = default;
};

// The items of a conf line in order, spaces around keys and values trimmed, empty items left
// out; a key given twice keeps its first place and its later value (as parse() takes it). Does
// not validate: PoolOptions::parse does.
std::vector<ConfItem> conf_items(std::string_view conf);
// "key=value,..." of the items.
std::string conf_line(const std::vector<ConfItem>& items);
// `base` with each of `changes` replacing the item of its key in place, or appended.
std::vector<ConfItem> merge_items(std::vector<ConfItem> base, const std::vector<ConfItem>& changes);
// The items of `to.to_conf()` whose value differs from `from.to_conf()`'s, in to_conf()'s order.
std::vector<ConfItem> changed_items(const PoolOptions& from, const PoolOptions& to);

struct Settings {
  std::string environment;        // STREAMPOOL_CONF as set ("" when it is not)
  std::string config;             // --config as given
  std::vector<ConfItem> items;    // the user's items: the environment's, then --config's
  PoolOptions options;            // the defaults with `items` applied; read_environment off

  // The user's items as one line ("" for the defaults), which parse() turns into `options`.
  std::string line() const { return conf_line(items); }
  // "STREAMPOOL_CONF=..., --config ..." or "the defaults": where the settings came from.
  std::string origin() const;
};

// A setting the pool refuses; the message names where it came from.
class SettingsError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Reads STREAMPOOL_CONF and applies `config` on top, except trace_file (the bench's pools record
// nothing). Throws SettingsError ("the environment's STREAMPOOL_CONF: ..." or "--config: ..."
// and the pool's reason) when either is refused.
Settings user_settings(const std::string& config);

}  // namespace streampool::bench
