// docs/guide.md's table of PoolOptions defaults is the defaults of the header: every row's value,
// parsed as its key, gives PoolOptions{} back, and the table has a row for every key that
// PoolOptions::to_conf() writes, and no other.
//
//   streampool_guide_defaults docs/guide.md
//
// The table is the rows between the lines <!-- defaults-begin --> and <!-- defaults-end -->,
// after its header: | `key` | `field` | `value` | what it does |.
#include <streampool/error.hpp>
#include <streampool/pool_options.hpp>

#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The text between the first two backticks of a table cell, or nothing: the header and the
// separator have none, the rows have them in every cell the check reads.
std::optional<std::string> code_of(const std::string& cell) {
  const auto open = cell.find('`');
  const auto close = open == std::string::npos ? open : cell.find('`', open + 1);
  if (close == std::string::npos) return std::nullopt;
  return cell.substr(open + 1, close - open - 1);
}

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream stream(row);
  std::string cell;
  std::getline(stream, cell, '|');  // what precedes the first '|'
  while (std::getline(stream, cell, '|')) out.push_back(cell);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s GUIDE.md\n", argv[0]);
    return 2;
  }
  std::ifstream guide(argv[1]);
  if (!guide) {
    std::fprintf(stderr, "guide_defaults: cannot read %s\n", argv[1]);
    return 2;
  }
  bool in_table = false;
  bool found = false;
  int rows = 0;
  bool right = true;
  std::set<std::string> keys;
  const streampool::PoolOptions defaults;
  for (std::string line; std::getline(guide, line);) {
    if (line == "<!-- defaults-begin -->") {
      in_table = found = true;
      continue;
    }
    if (line == "<!-- defaults-end -->") in_table = false;
    if (!in_table || line.empty() || line[0] != '|') continue;
    const std::vector<std::string> row = cells(line);
    if (row.size() < 3) continue;
    const std::optional<std::string> key = code_of(row[0]);
    const std::optional<std::string> value = code_of(row[2]);
    if (!key) continue;  // the header or the separator
    if (!value) {
      std::fprintf(stderr, "guide_defaults: the row of %s gives no `value`\n", key->c_str());
      right = false;
      continue;
    }
    ++rows;
    keys.insert(*key);
    const std::string item = *key + "=" + *value;
    try {
      if (!(streampool::PoolOptions::parse(item) == defaults)) {
        std::fprintf(stderr, "guide_defaults: the guide says %s, which is not the default (%s)\n",
                     item.c_str(), defaults.to_conf().c_str());
        right = false;
      }
    } catch (const streampool::Error& e) {
      std::fprintf(stderr, "guide_defaults: the guide's %s does not parse: %s\n", item.c_str(),
                   e.what());
      right = false;
    }
  }
  if (!found || rows == 0) {
    std::fprintf(stderr, "guide_defaults: no table between the defaults markers in %s\n", argv[1]);
    return 1;
  }
  // Every key to_conf writes, and only those.
  std::set<std::string> conf_keys;
  std::stringstream conf(defaults.to_conf());
  for (std::string item; std::getline(conf, item, ',');) {
    conf_keys.insert(item.substr(0, item.find('=')));
  }
  for (const std::string& key : conf_keys) {
    if (keys.count(key) == 0) {
      std::fprintf(stderr, "guide_defaults: the guide's table lacks the key %s\n", key.c_str());
      right = false;
    }
  }
  for (const std::string& key : keys) {
    if (conf_keys.count(key) == 0) {
      std::fprintf(stderr, "guide_defaults: the guide's table names %s, which to_conf() does not\n",
                   key.c_str());
      right = false;
    }
  }
  if (right) std::printf("guide_defaults: %d defaults of %s, each the header's\n", rows, argv[1]);
  return right ? 0 : 1;
}
