// Bad input (issue 9, item 4), the rows no other file covers: each bad value refused with its
// documented error, or, where the API promises it is safe, shown to be safe. The rows covered
// elsewhere are named where they live:
//   n == 0, n * sizeof(T) overflowing     pooled_buffer.cpp ("alloc_async throws invalid_value
//                                          ...", "try_alloc_async reports failure ..."), raw
//                                          allocate(0) in "raw allocate and deallocate work ..."
//   a size past the device                pooled_buffer.cpp (try_alloc_async, allocate),
//                                          pool_out_of_memory.cpp; sizes no device has: below
//   unknown keys, garbage, overflowing    pool_options.cpp ("bad input throws invalid_value
//   numbers, bad booleans, later key wins  ..."; "a later item for the same key wins"); every
//                                          key with each bad value: below
//   a raw deallocate of a foreign         pool_raw_api.cpp (aborts in a debug build, ignored in
//   pointer, a double free, a wrong size   a release build: memory_pool.hpp)
//   a capturing stream without a pool     capture_allocation.cpp ("... capture_without_pool ...")
//   a sealed pool                         capture_allocation.cpp, device_errors.cpp
//   a stream destroyed after its buffers  pool_streams.cpp ("a new stream that gets a destroyed
//   were dropped                           stream's handle does not get its blocks early")
//   the pool destroyed while buffers,     pool_lifetime.cpp, capture_lifetime.cpp (each alone);
//   CapturePools and graphs live           all at once, with every event counted: below
#include "fake_helpers.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <limits>
#include <string>
#include <vector>

using streampool::CapturedGraph;
using streampool::CapturePool;
using streampool::Errc;
using streampool::Error;
using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PoolOptions;
using Bytes = streampool::PooledBuffer<std::byte>;
using Call = FakeDevice::Call;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::size_t TiB = std::size_t{1} << 40;
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();

// The text of the invalid_value Error that parse() refuses `conf` with.
std::string refusal(const std::string& conf) {
  try {
    PoolOptions::parse(conf);
  } catch (const Error& e) {
    REQUIRE(e.errc() == Errc::invalid_value);
    return e.what();
  }
  FAIL("parse accepted \"" << conf << "\"");
  return {};
}

// The text of the invalid_value Error a MemoryPool constructed with `options` throws.
std::string construction_refusal(const PoolOptions& options) {
  try {
    MemoryPool pool(std::make_shared<FakeDevice>(), options);
  } catch (const Error& e) {
    REQUIRE(e.errc() == Errc::invalid_value);
    return e.what();
  }
  FAIL("constructed a pool with " << options.to_conf());
  return {};
}

}  // namespace

TEST_CASE("every key refuses an empty, negative, non-numeric or overflowing value, naming it",
          "[options][bad_input]") {
  const std::vector<std::string> size_keys{
      "smallest", "per_doubling", "largest", "alignment", "slab", "segment", "large_rounding",
      "large_shelf", "stream_homes",
      "max_reserved", "unfenced", "unfenced_us", "idle_ms", "stats_granule"};
  for (const std::string& key : size_keys) {
    for (const std::string value : {"", "-1", "-0", "+5", "ten", "1.5M", "0x100",
                                    "18446744073709551616", "99999999999999999999999"}) {
      const std::string conf = key + "=" + value;
      CAPTURE(conf);
      REQUIRE_THAT(refusal(conf), Catch::Contains(conf));
    }
  }
  for (const std::string key : {"fence_every_free", "cross_stream_wait", "stream_checks"}) {
    for (const std::string value : {"", "-1", "2", "maybe"}) {
      const std::string conf = key + "=" + value;
      CAPTURE(conf);
      REQUIRE_THAT(refusal(conf), Catch::Contains(conf));
    }
  }
  SECTION("trace_file takes any path, but not an empty one") {
    REQUIRE_THAT(refusal("trace_file="), Catch::Contains("trace_file=") &&
                                             Catch::Contains("expected a file path"));
    REQUIRE_THAT(refusal("trace_file=  ,slab=1M"), Catch::Contains("trace_file="));
    REQUIRE(PoolOptions::parse("trace_file= a b=c.csv ").trace_file == "a b=c.csv");
  }
  SECTION("an empty key is an unknown key") {
    REQUIRE_THAT(refusal("=1M"), Catch::Contains("unknown key ''"));
    REQUIRE_THAT(refusal("slab=1M, =2"), Catch::Contains("unknown key ''"));
  }
  SECTION("a duplicate key with a bad value is refused though an earlier one was good") {
    REQUIRE_THAT(refusal("slab=1M,slab=-1"), Catch::Contains("slab=-1"));
  }
}

TEST_CASE("sizes the pool's arithmetic cannot hold are refused, naming the key and the limit",
          "[options][bad_input]") {
  // A slab's blocks are host records too (a 1 GiB slab of 512-byte blocks is two million of
  // them); segments, mappings, the large rounding and the stats granule above 1 TiB (what a size class may
  // be) overflowed the pool's sums: slab=SIZE_MAX carved empty slabs, and allocations returned
  // an empty buffer with no error.
  struct Row {
    const char* key;
    std::size_t limit;
    const char* limit_text;
  };
  for (const Row row : {Row{"slab", GiB, "1 GiB"}, Row{"segment", TiB, "1 TiB"},
                        Row{"mapping", TiB, "1 TiB"}, Row{"large_rounding", TiB, "1 TiB"},
                        Row{"stats_granule", TiB, "1 TiB"}}) {
    CAPTURE(row.key);
    // large_rounding must be a power of two: its limit itself and twice it.
    const bool power = std::string(row.key) == "large_rounding";
    const std::size_t past = power ? 2 * row.limit : row.limit + 1;
    for (std::size_t bad : {past, size_max / 2 + 1, size_max - 255, size_max}) {
      if (power && (bad & (bad - 1)) != 0) continue;
      const std::string conf = std::string(row.key) + "=" + std::to_string(bad);
      CAPTURE(conf);
      const std::string what = refusal(conf);
      CHECK_THAT(what, Catch::Contains(row.key) && Catch::Contains(row.limit_text));
    }
    REQUIRE_NOTHROW(PoolOptions::parse(std::string(row.key) + "=" + std::to_string(row.limit)));
  }

  SECTION("options set in code are refused by the constructor the same way") {
    auto options = test_options();
    options.slab_bytes = size_max;
    CHECK_THAT(construction_refusal(options), Catch::Contains("slab") && Catch::Contains("1 GiB"));
    options = test_options();
    options.segment_bytes = size_max - 255;
    CHECK_THAT(construction_refusal(options),
               Catch::Contains("segment") && Catch::Contains("1 TiB"));
    options = test_options();
    options.mapping_bytes = size_max;
    CHECK_THAT(construction_refusal(options),
               Catch::Contains("mapping") && Catch::Contains("1 TiB"));
    options = test_options();
    options.stats_granule = std::size_t{1} << 62;
    CHECK_THAT(construction_refusal(options),
               Catch::Contains("stats_granule") && Catch::Contains("1 TiB"));
    options = test_options();
    options.trace_file = std::string("run\0.csv", 7);
    CHECK_THAT(construction_refusal(options),
               Catch::Contains("trace_file") && Catch::Contains("NUL"));
    // A path that cannot be opened: test/trace_recorder.cpp.
  }
}

TEST_CASE("at the largest segment a pool never passes max_reserved_bytes", "[pool][bad_input]") {
  auto options = test_options();
  options.segment_bytes = TiB;  // no device has that much: each segment is its request alone
  options.max_reserved_bytes = 16 * MiB;
  PoolOnFake pool(options);
  cudaStream_t s = pool.fake().create_stream();
  std::vector<Bytes> kept;
  std::error_code error;
  for (int i = 0; i < 20 && !error; ++i) {
    kept.push_back(Bytes::try_alloc_async(*pool, 6 * MiB, s, error));
    REQUIRE(pool.fake().live_bytes() <= 16 * MiB);
  }
  CHECK(error == Errc::out_of_memory);
  CHECK(kept.size() == 3);  // 6 + 6 MiB fit, 18 would not
  CHECK(pool->stats().reserved_bytes.peak <= static_cast<std::int64_t>(16 * MiB));
  // Small blocks too: their slabs come from the same limited segments.
  error.clear();
  std::vector<Bytes> small;
  for (int i = 0; i < 4096 && !error; ++i) {
    small.push_back(Bytes::try_alloc_async(*pool, 4096, s, error));
  }
  CHECK(error == Errc::out_of_memory);
  CHECK(pool.fake().live_bytes() <= 16 * MiB);
}

TEST_CASE("at the largest slab small allocations are served or refused, never empty",
          "[pool][bad_input]") {
  auto options = test_options();
  options.slab_bytes = GiB;
  options.size_classes.smallest = 64 << 10;  // few blocks to a slab: 16384 of 64 KiB
  options.size_classes.alignment = 4096;
  options.large_rounding = 1 << 16;
  FakeDevice::Options device;
  device.capacity = 2 * GiB;
  PoolOnFake pool(options, device);
  cudaStream_t s = pool.fake().create_stream();
  Bytes a = Bytes::alloc_async(*pool, 1000, s);
  REQUIRE_FALSE(a.is_empty());
  Bytes b = Bytes::alloc_async(*pool, 1000, s);
  REQUIRE_FALSE(b.is_empty());
  CHECK(a.data() != b.data());
  CHECK(pool->stats().reserved_bytes.current == static_cast<std::int64_t>(GiB));

  pool.fake().set_capacity(GiB + GiB / 2);  // a second slab no longer fits the device
  // The one segment is the first class's slab, in use: a slab for another class has no room.
  std::error_code error;
  Bytes c = Bytes::try_alloc_async(*pool, 200 << 10, s, error);
  CHECK(c.is_empty());
  CHECK(error == Errc::out_of_memory);
}

TEST_CASE("sizes no device has fail with out_of_memory before any device call",
          "[pool][bad_input]") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  for (std::size_t bytes : {(std::size_t{1} << 50) + 1, size_max / 2, size_max - 255, size_max}) {
    CAPTURE(bytes);
    std::error_code error;
    CHECK(pool->try_allocate(bytes, s, error) == nullptr);
    CHECK(error == Errc::out_of_memory);
    CHECK(Bytes::try_alloc_async(*pool, bytes, s, error).is_empty());
    CHECK(error == Errc::out_of_memory);
    try {
      Bytes::alloc_async(*pool, bytes, s);
      FAIL("allocated " << bytes << " bytes");
    } catch (const Error& e) {
      CHECK(e.errc() == Errc::out_of_memory);
      CHECK_THAT(e.what(), Catch::Contains(std::to_string(bytes)));
    }
  }
  CHECK(pool.fake().calls(Call::malloc) == 0);
  CHECK(pool->stats().live_allocations.current == 0);
}

TEST_CASE("a pool destroyed while buffers, CapturePools and graphs live leaks nothing once they go",
          "[pool][capture][bad_input]") {
  auto fake = std::make_shared<FakeDevice>();
  cudaStream_t s = fake->create_stream();
  cudaStream_t t = fake->create_stream();
  auto options = test_options();
  options.fence_every_free = true;  // events to account for too
  auto pool = std::make_unique<MemoryPool>(fake, options);
  Bytes small = Bytes::alloc_async(*pool, 4096, s);
  Bytes large = Bytes::alloc_async(*pool, 8 * MiB, t);
  large.record_stream(s);
  Bytes::alloc_async(*pool, 4096, t).reset();  // a fence on t
  auto capture = std::make_shared<CapturePool>(*pool);
  capture->reserve(4 * MiB);
  capture->record_buffer(Bytes::alloc_async(*pool, 1 * MiB, s));
  streampool::begin_capture_with_pool(capture, s);
  Bytes inside = Bytes::alloc_async(*pool, 64 << 10, s);
  fake->launch(s, {{inside.data(), inside.byte_size(), true}});
  inside.reset();
  CapturedGraph graph = streampool::end_capture_with_pool(s, capture);
  graph.launch(s);
  fake->launch(t, {{large.data(), large.byte_size(), true}});

  pool.reset();  // everything above still alive
  CHECK(fake->live_allocations() > 0);
  graph.launch(s);  // the graph still replays into its memory
  fake->launch(s, {{small.data(), small.byte_size(), true}});
  small.reset();
  large.reset();
  capture.reset();
  fake->complete_all();
  CHECK(fake->live_allocations() > 0);  // the graph holds the CapturePool's memory
  graph = CapturedGraph();
  streampool::complete_graph_releases();
  CHECK(fake->hazards().empty());
  CHECK(fake->live_bytes() == 0);
  CHECK(fake->live_allocations() == 0);
  CHECK(fake->live_events() == 0);
  CHECK(fake->live_user_objects() == 0);
}
