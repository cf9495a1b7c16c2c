// compare --json: valid JSON on stdout and nothing else there; the tables' figures as numbers.
#include "cli_helpers.hpp"
#include "compare.hpp"
#include "peers.hpp"
#include "temp_dir.hpp"
#include "trace_helpers.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <memory>
#include <vector>

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

namespace {
// A peer on the host's heap: the trace table's arithmetic, without a GPU.
class HeapPeer final : public streampool::bench::Peer {
 public:
  std::string name() const override { return "heap"; }
  void* allocate(std::size_t bytes, cudaStream_t) override { return std::malloc(bytes); }
  void deallocate(void* p, std::size_t, cudaStream_t) override { std::free(p); }
};
}  // namespace

// Found in review (2026-12-06): the trace table divided the replay's time by its number of events,
// so a trace with none printed "inf" or "nan" where a time goes.
TEST_CASE("compare's trace table gives a trace of no events n/a per event (not nan or inf)",
          "[compare]") {
  std::vector<std::unique_ptr<streampool::bench::Peer>> peers;
  peers.push_back(std::make_unique<HeapPeer>());
  const streampool::bench::Trace empty =
      streampool::bench::testing::parse("Thread,Time,Action,Pointer,Size,Stream\n", "empty");
  const streampool::bench::Table table = streampool::bench::trace_table(peers, {empty});
  REQUIRE(table.rows.size() == 1);
  CHECK(table.rows[0][2] == "n/a");
}
