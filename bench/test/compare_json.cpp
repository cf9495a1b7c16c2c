// compare --json: valid JSON on stdout and nothing else there; the tables' figures as numbers.
#include "cli_helpers.hpp"
#include "temp_dir.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

using namespace streampool::bench::testing;
using Catch::Matchers::Contains;

TEST_CASE("compare --json prints valid JSON on stdout, messages on stderr", "[compare][cli]") {
  const TempDir dir;
  write_text(dir.file("torch_summary.json"),
             R"([{"name": "random", "reserved_bytes.all.peak": 2000,
                  "requested_bytes.all.peak": 1000}])");
  const BenchRun run = run_bench({"compare", "--fake", "--workload", "random", "--torch-summary",
                                  dir.file("torch_summary.json"), "--json"});
  REQUIRE(run.status == 0);
  CHECK_THAT(run.err, Contains("no GPU"));
  const nlohmann::json tables = nlohmann::json::parse(run.out);  // throws on anything else
  REQUIRE(tables.is_array());
  REQUIRE(tables.size() == 1);
  const nlohmann::json& table = tables[0];
  CHECK(table.at("title").is_string());
  REQUIRE(table.at("header").size() == 5);
  const nlohmann::json& row = table.at("rows").at(0);
  REQUIRE(row.size() == 5);
  CHECK(row[0] == "random");
  for (std::size_t i = 1; i < row.size(); ++i) {
    CAPTURE(i, row[i]);
    CHECK(row[i].is_number());
  }
  CHECK(row[4] == 2.0);  // PyTorch's ratio, read from the summary
}
