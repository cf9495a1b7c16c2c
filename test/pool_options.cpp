// PoolOptions: the STREAMPOOL_CONF syntax ("key=value,key=value"), its errors, its round trip
// through to_conf(), and how a MemoryPool picks it up from the environment.
#include "pool_helpers.hpp"

#include <streampool/error.hpp>

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

using streampool::Errc;
using streampool::Error;
using streampool::FakeDevice;
using streampool::MemoryPool;
using streampool::PoolOptions;
using streampool::StreamChecks;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

// The text of the Error that parse() refuses `conf` with; fails the test unless it is an
// invalid_value Error.
std::string refusal(std::string_view conf) {
  try {
    PoolOptions::parse(conf);
  } catch (const Error& e) {
    REQUIRE(e.errc() == Errc::invalid_value);
    return e.what();
  }
  FAIL("parse accepted \"" << std::string(conf) << "\"");
  return {};
}

// Sets STREAMPOOL_CONF (or unsets it, for nullopt) for one scope, then puts back what was there.
class ConfEnvironment {
 public:
  explicit ConfEnvironment(std::optional<std::string> value) {
    if (const char* old = std::getenv("STREAMPOOL_CONF")) saved_ = old;
    if (value) ::setenv("STREAMPOOL_CONF", value->c_str(), 1);
    else ::unsetenv("STREAMPOOL_CONF");
  }
  ~ConfEnvironment() {
    if (saved_) ::setenv("STREAMPOOL_CONF", saved_->c_str(), 1);
    else ::unsetenv("STREAMPOOL_CONF");
  }
  ConfEnvironment(const ConfEnvironment&) = delete;
  ConfEnvironment& operator=(const ConfEnvironment&) = delete;

 private:
  std::optional<std::string> saved_;
};

}  // namespace

TEST_CASE("a SizeClassConfig made with no arguments has the pool's default size classes") {
  // A program that builds its own (options.size_classes = {}; then sets one number) gets the
  // defaults for the others, not a largest class 256 times the pool's.
  const streampool::SizeClassConfig config{};
  CHECK(config == streampool::PoolOptions{}.size_classes);
  CHECK(config.smallest == 512);
  CHECK(config.per_doubling == 4);
  CHECK(config.largest == std::size_t{256} << 10);
  CHECK(config.alignment == 256);
}

TEST_CASE("parse sets each key and leaves every other option as the base had it") {
  const PoolOptions base;

  SECTION("smallest") {
    PoolOptions expected = base;
    expected.size_classes.smallest = 1024;
    REQUIRE(PoolOptions::parse("smallest=1024") == expected);
  }
  SECTION("per_doubling") {
    for (unsigned n : {1u, 2u, 4u, 8u}) {
      PoolOptions expected = base;
      expected.size_classes.per_doubling = n;
      REQUIRE(PoolOptions::parse("per_doubling=" + std::to_string(n)) == expected);
    }
  }
  SECTION("largest") {
    PoolOptions expected = base;
    expected.size_classes.largest = 4 * MiB;
    REQUIRE(PoolOptions::parse("largest=4194304") == expected);
  }
  SECTION("unfenced, unfenced_us and idle_ms") {
    PoolOptions expected = base;
    expected.unfenced_bytes = MiB;
    REQUIRE(PoolOptions::parse("unfenced=1M") == expected);
    expected = base;
    expected.unfenced_us = 250;
    REQUIRE(PoolOptions::parse("unfenced_us=250") == expected);
    expected = base;
    expected.idle_ms = 0;
    REQUIRE(PoolOptions::parse("idle_ms=0") == expected);
    REQUIRE_THAT(refusal("idle_ms=99999999999"), Catch::Contains("idle_ms"));
  }
  SECTION("alignment") {
    PoolOptions expected = base;
    expected.size_classes.alignment = 512;
    REQUIRE(PoolOptions::parse("alignment=512") == expected);
  }
  SECTION("slab") {
    PoolOptions expected = base;
    expected.slab_bytes = 3000;
    REQUIRE(PoolOptions::parse("slab=3000") == expected);
  }
  SECTION("segment") {
    PoolOptions expected = base;
    expected.segment_bytes = 100000;
    REQUIRE(PoolOptions::parse("segment=100000") == expected);
  }
  SECTION("mapping") {
    PoolOptions expected = base;
    expected.mapping_bytes = 8 * MiB;
    REQUIRE(PoolOptions::parse("mapping=8M") == expected);
  }
  SECTION("large_rounding") {
    PoolOptions expected = base;
    expected.large_rounding = 4096;
    REQUIRE(PoolOptions::parse("large_rounding=4096") == expected);
  }
  SECTION("max_reserved") {
    PoolOptions expected = base;
    expected.max_reserved_bytes = 123456789;
    REQUIRE(PoolOptions::parse("max_reserved=123456789") == expected);
  }
  SECTION("fence_every_free, in each spelling of true and false") {
    for (const char* yes : {"1", "true", "on", "yes"}) {
      PoolOptions expected = base;
      expected.fence_every_free = true;
      REQUIRE(PoolOptions::parse(std::string("fence_every_free=") + yes) == expected);
    }
    PoolOptions on = base;
    on.fence_every_free = true;
    for (const char* no : {"0", "false", "off", "no"}) {
      REQUIRE(PoolOptions::parse(std::string("fence_every_free=") + no, on) == base);
    }
  }
  SECTION("cross_stream_wait, in each spelling of true and false") {
    for (const char* yes : {"1", "true", "on", "yes"}) {
      PoolOptions expected = base;
      expected.cross_stream_wait = true;
      REQUIRE(PoolOptions::parse(std::string("cross_stream_wait=") + yes) == expected);
    }
    PoolOptions on = base;
    on.cross_stream_wait = true;
    for (const char* no : {"0", "false", "off", "no"}) {
      REQUIRE(PoolOptions::parse(std::string("cross_stream_wait=") + no, on) == base);
    }
  }
  SECTION("stream_checks") {
    for (auto [text, checks] : {std::pair{"none", StreamChecks::none},
                                std::pair{"identity", StreamChecks::identity},
                                std::pair{"full", StreamChecks::full}}) {
      PoolOptions start = base;
      start.stream_checks = checks == StreamChecks::full ? StreamChecks::none : StreamChecks::full;
      PoolOptions expected = base;
      expected.stream_checks = checks;
      REQUIRE(PoolOptions::parse(std::string("stream_checks=") + text, start) == expected);
    }
  }
  SECTION("stats_granule") {
    PoolOptions expected = base;
    expected.stats_granule = 0;
    REQUIRE(PoolOptions::parse("stats_granule=0") == expected);
  }
  SECTION("every key at once") {
    const PoolOptions parsed = PoolOptions::parse(
        "smallest=1K,per_doubling=2,largest=8M,alignment=512,slab=4M,segment=128M,"
        "large_rounding=1M,max_reserved=2G,fence_every_free=true,cross_stream_wait=true,"
        "stream_checks=identity,stats_granule=64K");
    REQUIRE(parsed.size_classes.smallest == 1 * KiB);
    REQUIRE(parsed.size_classes.per_doubling == 2);
    REQUIRE(parsed.size_classes.largest == 8 * MiB);
    REQUIRE(parsed.size_classes.alignment == 512);
    REQUIRE(parsed.slab_bytes == 4 * MiB);
    REQUIRE(parsed.segment_bytes == 128 * MiB);
    REQUIRE(parsed.large_rounding == 1 * MiB);
    REQUIRE(parsed.max_reserved_bytes == 2 * GiB);
    REQUIRE(parsed.fence_every_free);
    REQUIRE(parsed.cross_stream_wait);
    REQUIRE(parsed.stream_checks == StreamChecks::identity);
    REQUIRE(parsed.stats_granule == 64 * KiB);
    REQUIRE(parsed.read_environment == base.read_environment);
  }
}

TEST_CASE("parse applies the conf on top of the base it is given") {
  PoolOptions base;
  base.read_environment = false;
  base.max_reserved_bytes = 7 * MiB;
  base.stream_checks = StreamChecks::none;
  const PoolOptions parsed = PoolOptions::parse("slab=1M", base);
  PoolOptions expected = base;
  expected.slab_bytes = 1 * MiB;
  REQUIRE(parsed == expected);
  REQUIRE(PoolOptions::parse("", base) == base);
}

TEST_CASE("a later item for the same key wins") {
  REQUIRE(PoolOptions::parse("slab=1M,slab=3M").slab_bytes == 3 * MiB);
}

TEST_CASE("sizes take a K, M or G suffix, binary, in either case or as KiB, MiB, GiB") {
  for (auto [text, bytes] : {std::pair{"3K", 3 * KiB}, std::pair{"3k", 3 * KiB},
                             std::pair{"3KiB", 3 * KiB}, std::pair{"5M", 5 * MiB},
                             std::pair{"5m", 5 * MiB}, std::pair{"5MiB", 5 * MiB},
                             std::pair{"2G", 2 * GiB}, std::pair{"2g", 2 * GiB},
                             std::pair{"2GiB", 2 * GiB}, std::pair{"0K", std::size_t{0}}}) {
    CAPTURE(text);
    REQUIRE(PoolOptions::parse(std::string("max_reserved=") + text).max_reserved_bytes == bytes);
  }
  REQUIRE(PoolOptions::parse("max_reserved=8589934592G").max_reserved_bytes ==
          std::size_t{1} << 63);
  REQUIRE(PoolOptions::parse("max_reserved=18446744073709551615").max_reserved_bytes ==
          ~std::size_t{0});
}

TEST_CASE("white space around items, keys and values is ignored, and so are empty items") {
  const PoolOptions parsed =
      PoolOptions::parse(" ,, slab = 1M ,\tstream_checks\t=\tnone\t,,fence_every_free= on ,");
  PoolOptions expected;
  expected.slab_bytes = 1 * MiB;
  expected.stream_checks = StreamChecks::none;
  expected.fence_every_free = true;
  REQUIRE(parsed == expected);
  REQUIRE(PoolOptions::parse("") == PoolOptions{});
  REQUIRE(PoolOptions::parse(" , ,\t,") == PoolOptions{});
  // A line end too, as a variable read from a file keeps it (found in review, 2026-12-05).
  REQUIRE(PoolOptions::parse("slab=1M\n").slab_bytes == 1 * MiB);
  REQUIRE(PoolOptions::parse("slab=1M\r\n").slab_bytes == 1 * MiB);
}

TEST_CASE("bad input throws invalid_value with a message naming the key or the value") {
  SECTION("an unknown key is named, with the known ones") {
    const std::string what = refusal("slab=1M,colour=blue");
    REQUIRE_THAT(what, Catch::Contains("unknown key 'colour'"));
    REQUIRE_THAT(what, Catch::Contains("stream_checks"));
  }
  SECTION("an item without '=' is named") {
    REQUIRE_THAT(refusal("slab=1M,fence_every_free"),
                 Catch::Contains("fence_every_free") && Catch::Contains("expected key=value"));
  }
  SECTION("a size that is not a number names its key and value") {
    for (const char* conf : {"slab=big", "slab=", "slab=-1", "slab=K", "slab=0x10"}) {
      CAPTURE(conf);
      REQUIRE_THAT(refusal(conf), Catch::Contains(conf));
    }
  }
  SECTION("an unknown size suffix names its key and value") {
    for (const char* conf : {"segment=64T", "segment=64 M", "segment=64MB", "segment=1K=2"}) {
      CAPTURE(conf);
      REQUIRE_THAT(refusal(conf), Catch::Contains(conf) && Catch::Contains("suffix"));
    }
  }
  SECTION("a size too large for the machine names its key and value") {
    REQUIRE_THAT(refusal("max_reserved=18446744073709551616"),
                 Catch::Contains("max_reserved=18446744073709551616"));
    REQUIRE_THAT(refusal("max_reserved=17179869184G"),
                 Catch::Contains("max_reserved=17179869184G") && Catch::Contains("too large"));
  }
  SECTION("a bad boolean names its key and value") {
    for (const char* conf : {"fence_every_free=maybe", "cross_stream_wait=2",
                             "fence_every_free="}) {
      CAPTURE(conf);
      REQUIRE_THAT(refusal(conf), Catch::Contains(conf) && Catch::Contains("true or false"));
    }
  }
  SECTION("a bad stream_checks names its value and the three accepted") {
    REQUIRE_THAT(refusal("stream_checks=some"),
                 Catch::Contains("stream_checks=some") && Catch::Contains("none, identity or full"));
  }
  // Found in review (2026-12-05): counts and times took size suffixes, so idle_ms=1K meant 1024.
  SECTION("a count or a time with a size suffix names its key and value") {
    for (const char* conf : {"idle_ms=1K", "unfenced_us=2M", "per_doubling=1K", "large_shelf=1k",
                             "stream_homes=1G"}) {
      CAPTURE(conf);
      REQUIRE_THAT(refusal(conf), Catch::Contains(conf) && Catch::Contains("a whole number"));
    }
  }
  SECTION("per_doubling above 8 names its key and value") {
    REQUIRE_THAT(refusal("per_doubling=16"), Catch::Contains("per_doubling=16"));
  }
  SECTION("values that parse but make unusable options name what is wrong") {
    REQUIRE_THAT(refusal("per_doubling=3"), Catch::Contains("per doubling") && Catch::Contains("3"));
    REQUIRE_THAT(refusal("per_doubling=0"), Catch::Contains("per doubling") && Catch::Contains("0"));
    REQUIRE_THAT(refusal("alignment=384,smallest=768"),
                 Catch::Contains("alignment") && Catch::Contains("384"));
    REQUIRE_THAT(refusal("alignment=128"), Catch::Contains("alignment") && Catch::Contains("128"));
    REQUIRE_THAT(refusal("smallest=300"), Catch::Contains("smallest") && Catch::Contains("300"));
    REQUIRE_THAT(refusal("smallest=0"), Catch::Contains("smallest"));
    REQUIRE_THAT(refusal("largest=256"), Catch::Contains("largest") && Catch::Contains("256"));
    REQUIRE_THAT(refusal("largest=2048G"), Catch::Contains("largest"));
    REQUIRE_THAT(refusal("large_rounding=3000"),
                 Catch::Contains("large_rounding") && Catch::Contains("3000"));
    REQUIRE_THAT(refusal("alignment=1K,smallest=1K,large_rounding=512"),
                 Catch::Contains("large_rounding") && Catch::Contains("512"));
    REQUIRE_THAT(refusal("slab=0"), Catch::Contains("slab"));
    REQUIRE_THAT(refusal("segment=0"), Catch::Contains("segment"));
  }
  SECTION("the message says the text came from STREAMPOOL_CONF") {
    REQUIRE_THAT(refusal("colour=blue"), Catch::StartsWith("STREAMPOOL_CONF"));
    REQUIRE_THAT(refusal("slab=0"), Catch::StartsWith("STREAMPOOL_CONF"));
  }
}

TEST_CASE("validate accepts the defaults and names what is wrong with a bad combination") {
  REQUIRE(PoolOptions{}.validate().empty());

  const auto why = [](auto change) {
    PoolOptions o;
    change(o);
    return o.validate();
  };
  REQUIRE_THAT(why([](PoolOptions& o) { o.size_classes.alignment = 100; }),
               Catch::Contains("alignment"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.size_classes.alignment = 128; }),
               Catch::Contains("alignment"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.size_classes.smallest = 1000; }),
               Catch::Contains("smallest"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.size_classes.per_doubling = 5; }),
               Catch::Contains("per doubling"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.size_classes.largest = 256; }),
               Catch::Contains("largest"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.size_classes.largest = (std::size_t{1} << 40) + 1; }),
               Catch::Contains("largest"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.large_rounding = 0; }),
               Catch::Contains("large_rounding"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.large_rounding = 768 * KiB; }),
               Catch::Contains("large_rounding"));
  REQUIRE_THAT(why([](PoolOptions& o) {
                 o.size_classes.alignment = 4096;
                 o.size_classes.smallest = 4096;
                 o.large_rounding = 2048;  // a power of two, but below the alignment
               }),
               Catch::Contains("large_rounding"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.slab_bytes = 0; }), Catch::Contains("slab"));
  REQUIRE_THAT(why([](PoolOptions& o) { o.segment_bytes = 0; }), Catch::Contains("segment"));

  SECTION("options validate() accepts construct a pool; those it refuses make it throw") {
    auto options = test_options();
    options.size_classes.alignment = 512;
    options.size_classes.smallest = 512;
    options.large_rounding = 512;
    options.slab_bytes = 1;
    REQUIRE(options.validate().empty());
    REQUIRE_NOTHROW(MemoryPool(std::make_shared<FakeDevice>(), options));

    options.segment_bytes = 0;
    try {
      MemoryPool pool(std::make_shared<FakeDevice>(), options);
      FAIL("constructed a pool with segment_bytes = 0");
    } catch (const Error& e) {
      REQUIRE(e.errc() == Errc::invalid_value);
      REQUIRE_THAT(e.what(), Catch::Contains("segment"));
    }
  }
}

TEST_CASE("to_conf() gives the line that parse() turns back into the same options") {
  SECTION("the defaults") {
    const PoolOptions defaults;
    REQUIRE(PoolOptions::parse(defaults.to_conf()) == defaults);
    REQUIRE_THAT(defaults.to_conf(), !Catch::Contains("trace_file"));  // only when set
  }
  SECTION("every option changed, with sizes that take a suffix") {
    PoolOptions o;
    o.size_classes = {2 * KiB, 8, 16 * MiB, 1 * KiB};
    o.slab_bytes = 8 * MiB;
    o.segment_bytes = 3 * GiB;
    o.large_rounding = 2 * MiB;
    o.max_reserved_bytes = 70 * GiB;
    o.fence_every_free = true;
    o.cross_stream_wait = true;
    o.stream_checks = StreamChecks::none;
    o.stats_granule = 0;
    o.trace_file = "traces/run 1.csv";
    REQUIRE(PoolOptions::parse(o.to_conf()) == o);
    REQUIRE_THAT(o.to_conf(), Catch::Contains("segment=3G") && Catch::Contains("slab=8M") &&
                                  Catch::Contains("smallest=2K") &&
                                  Catch::EndsWith(",trace_file=traces/run 1.csv"));
  }
  SECTION("sizes that are not a multiple of any suffix, and the largest sizes") {
    PoolOptions o;
    o.slab_bytes = 4097;
    o.segment_bytes = 1 * GiB + 1;
    o.mapping_bytes = 3 * MiB + 5;
    o.stats_granule = 1000;
    o.max_reserved_bytes = ~std::size_t{0};
    o.stream_checks = StreamChecks::identity;
    REQUIRE(PoolOptions::parse(o.to_conf()) == o);
    for (std::size_t huge : {std::size_t{1} << 63, ~std::size_t{0} << 10, ~std::size_t{0} << 20,
                             ~std::size_t{0} << 30}) {
      o.max_reserved_bytes = huge;
      CAPTURE(o.to_conf());
      REQUIRE(PoolOptions::parse(o.to_conf()) == o);
    }
  }
  SECTION("read_environment is not part of the conf: parse keeps the base's") {
    PoolOptions o;
    o.read_environment = false;
    REQUIRE_THAT(o.to_conf(), !Catch::Contains("read_environment"));
    REQUIRE(PoolOptions::parse(o.to_conf(), o) == o);
  }
}

TEST_CASE("from_environment applies STREAMPOOL_CONF on top of the base, when it is set") {
  PoolOptions base;
  base.read_environment = false;
  base.segment_bytes = 32 * MiB;

  SECTION("set") {
    ConfEnvironment conf("slab=1M, stream_checks=none");
    PoolOptions expected = base;
    expected.slab_bytes = 1 * MiB;
    expected.stream_checks = StreamChecks::none;
    REQUIRE(PoolOptions::from_environment(base) == expected);
  }
  SECTION("unset: the base unchanged") {
    ConfEnvironment conf(std::nullopt);
    REQUIRE(PoolOptions::from_environment(base) == base);
  }
  SECTION("set but empty: the base unchanged") {
    ConfEnvironment conf("");
    REQUIRE(PoolOptions::from_environment(base) == base);
  }
  SECTION("set to something bad: invalid_value") {
    ConfEnvironment conf("slab=lots");
    REQUIRE_THROWS_MATCHES(PoolOptions::from_environment(base), Error,
                           Catch::Predicate<Error>([](const Error& e) {
                             return e.errc() == Errc::invalid_value &&
                                    std::string(e.what()).find("slab=lots") != std::string::npos;
                           }));
  }
}

TEST_CASE("a MemoryPool constructed with read_environment reads STREAMPOOL_CONF") {
  auto options = test_options();
  options.read_environment = true;

  SECTION("pool.options() are the options given, with STREAMPOOL_CONF applied") {
    ConfEnvironment conf("fence_every_free=1,max_reserved=256M,segment=16M");
    MemoryPool pool(std::make_shared<FakeDevice>(), options);
    PoolOptions expected = options;
    expected.fence_every_free = true;
    expected.max_reserved_bytes = 256 * MiB;
    expected.segment_bytes = 16 * MiB;
    REQUIRE(pool.options() == expected);
  }
  SECTION("the options it reads take effect: a fence per drop") {
    ConfEnvironment conf("fence_every_free=1");
    auto device = std::make_shared<FakeDevice>();
    MemoryPool pool(device, options);
    cudaStream_t s = device->create_stream();
    streampool::PooledBuffer<int>::alloc_async(pool, 10, s).reset();
    streampool::PooledBuffer<int>::alloc_async(pool, 10, s).reset();
    REQUIRE(device->calls(FakeDevice::Call::event_record) == 2);
  }
  SECTION("a bad STREAMPOOL_CONF makes the constructor throw invalid_value") {
    ConfEnvironment conf("stream_checks=paranoid");
    try {
      MemoryPool pool(std::make_shared<FakeDevice>(), options);
      FAIL("constructed a pool with a bad STREAMPOOL_CONF");
    } catch (const Error& e) {
      REQUIRE(e.errc() == Errc::invalid_value);
      REQUIRE_THAT(e.what(), Catch::Contains("stream_checks=paranoid"));
    }
  }
  SECTION("STREAMPOOL_CONF making valid options unusable makes the constructor throw too") {
    ConfEnvironment conf("largest=256");
    REQUIRE_THROWS_MATCHES(MemoryPool(std::make_shared<FakeDevice>(), options), Error,
                           Catch::Predicate<Error>([](const Error& e) {
                             return e.errc() == Errc::invalid_value;
                           }));
  }
  SECTION("without read_environment, STREAMPOOL_CONF is ignored, even a bad one") {
    options.read_environment = false;
    ConfEnvironment conf("fence_every_free=1,stream_checks=paranoid");
    MemoryPool pool(std::make_shared<FakeDevice>(), options);
    REQUIRE(pool.options() == options);
  }
}

TEST_CASE("a MemoryPool without a device throws invalid_value") {
  REQUIRE_THROWS_MATCHES(MemoryPool(nullptr, test_options()), Error,
                         Catch::Predicate<Error>([](const Error& e) {
                           return e.errc() == Errc::invalid_value;
                         }));
}

// Found in review (2026-12-05). to_conf() is "the conf line that parse() turns back into these
// options", and validate() accepts any trace_file without a NUL. A path with a comma (which a
// conf line cannot carry) or with spaces at either end (which parse trims) was written as it is,
// and the line did not parse back into it: with the comma parse threw, with the spaces it gave
// another path. Such a path has no conf form: to_conf() says so.
TEST_CASE("to_conf() refuses a trace_file that its line could not carry back") {
  for (const char* path : {"runs/a,b.csv", " leading.csv", "trailing.csv "}) {
    PoolOptions o;
    o.trace_file = path;
    REQUIRE(o.validate().empty());
    CAPTURE(path);
    CHECK_THROWS_MATCHES(o.to_conf(), Error, Catch::Predicate<Error>([&](const Error& e) {
                           return e.errc() == Errc::invalid_value &&
                                  std::string(e.what()).find(path) != std::string::npos;
                         }));
  }
  PoolOptions plain;
  plain.trace_file = "runs/a b.csv";  // a space inside is carried
  CHECK(PoolOptions::parse(plain.to_conf()) == plain);
}

// Found in review (2026-12-05). Options set in code that validate() refuses were reported as
// coming from STREAMPOOL_CONF whenever the variable was set, even to something harmless or to
// nothing: the environment was applied first, and its parse() validated the whole result under
// "STREAMPOOL_CONF: ". Without the variable the same options gave "MemoryPool options: ...".
TEST_CASE("options set in code that are unusable are not blamed on STREAMPOOL_CONF") {
  auto options = test_options();
  options.read_environment = true;
  options.slab_bytes = 0;  // the code's fault
  for (const char* conf : {"fence_every_free=1", ""}) {
    CAPTURE(conf);
    ConfEnvironment environment(conf);
    try {
      MemoryPool pool(std::make_shared<FakeDevice>(), options);
      FAIL("constructed a pool with slab_bytes = 0");
    } catch (const Error& e) {
      CHECK(e.errc() == Errc::invalid_value);
      CHECK_THAT(e.what(), Catch::Contains("slab"));
      CHECK_THAT(e.what(), !Catch::StartsWith("STREAMPOOL_CONF"));
    }
  }
}

// Found in review (2026-12-05). An item without '=' was quoted with an '=' the user did not
// write ("STREAMPOOL_CONF: slab 1M=: expected key=value").
TEST_CASE("an item without '=' is quoted as written, without an added '='") {
  const std::string what = refusal("slab 1M");
  CHECK_THAT(what, Catch::Contains("slab 1M"));
  CHECK_THAT(what, !Catch::Contains("slab 1M="));
}
