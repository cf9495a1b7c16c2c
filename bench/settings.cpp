#include "settings.hpp"

#include <streampool/error.hpp>

#include <cstdlib>

namespace streampool::bench {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<ConfItem> conf_items(std::string_view conf) {
  std::vector<ConfItem> items;
  while (!conf.empty()) {
    const std::size_t comma = conf.find(',');
    const std::string_view item = trim(conf.substr(0, comma));
    conf = comma == std::string_view::npos ? std::string_view() : conf.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    ConfItem next{std::string(trim(item.substr(0, eq))),
                  eq == std::string_view::npos ? std::string() : std::string(trim(item.substr(eq + 1)))};
    items = merge_items(std::move(items), {next});
  }
  return items;
}

std::string conf_line(const std::vector<ConfItem>& items) {
  std::string line;
  for (const ConfItem& item : items) {
    if (!line.empty()) line += ',';
    line.append(item.key).append("=").append(item.value);
  }
  return line;
}

std::vector<ConfItem> merge_items(std::vector<ConfItem> base, const std::vector<ConfItem>& changes) {
  for (const ConfItem& change : changes) {
    bool replaced = false;
    for (ConfItem& item : base) {
      if (item.key == change.key) {
        item.value = change.value;
        replaced = true;
      }
    }
    if (!replaced) base.push_back(change);
  }
  return base;
}

std::vector<ConfItem> changed_items(const PoolOptions& from, const PoolOptions& to) {
  const std::vector<ConfItem> before = conf_items(from.to_conf());
  std::vector<ConfItem> changed;
  for (const ConfItem& item : conf_items(to.to_conf())) {
    bool same = false;
    for (const ConfItem& old : before) same = same || old == item;
    if (!same) changed.push_back(item);
  }
  return changed;
}

std::string Settings::origin() const {
  std::string text;
  if (!environment.empty()) text = "STREAMPOOL_CONF=" + environment;
  if (!config.empty()) text += (text.empty() ? "" : ", then ") + std::string("--config ") + config;
  return text.empty() ? "the defaults" : text;
}

Settings user_settings(const std::string& config) {
  Settings s;
  if (const char* env = std::getenv("STREAMPOOL_CONF"); env != nullptr) s.environment = env;
  s.config = config;
  try {
    s.options = PoolOptions::parse(s.environment);
  } catch (const Error& e) {
    throw SettingsError(std::string("the environment's STREAMPOOL_CONF: ") + e.what());
  }
  try {
    s.options = PoolOptions::parse(config, s.options);
  } catch (const Error& e) {
    throw SettingsError(std::string("--config: ") + e.what());
  }
  s.options.read_environment = false;
  // The bench's pools record no trace: a replay would write over the trace it reads (with
  // STREAMPOOL_CONF=trace_file=app.csv still exported from recording the application), and
  // tune's many pools each a file. Nor does the line tune recommends name one.
  s.options.trace_file.clear();
  s.items = merge_items(conf_items(s.environment), conf_items(config));
  std::erase_if(s.items, [](const ConfItem& item) { return item.key == "trace_file"; });
  return s;
}

}  // namespace streampool::bench
