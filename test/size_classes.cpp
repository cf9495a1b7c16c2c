// Size classes: every size maps to a block that holds it, keeps the alignment, and wastes no more
// than the header promises.
#include <streampool/size_classes.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>

using streampool::SizeClassConfig;
using streampool::SizeClasses;

namespace {

// The promise stated in size_classes.hpp, for one request size: why it is broken, or "".
// Plain comparisons rather than REQUIREs: the exhaustive test checks tens of millions of sizes.
std::string broken_promise(const SizeClasses& classes, std::size_t n) {
  const auto& config = classes.config();
  const unsigned index = classes.class_of(n);
  if (index >= classes.count()) return "class index out of range";
  const std::size_t block = classes.block_size(index);
  if (block < n) return "block smaller than the request";
  if (block % config.alignment != 0) return "block not aligned";
  if (block - n >= std::max(config.smallest, n / config.per_doubling + config.alignment)) {
    return "waste above the bound";
  }
  // The class is the smallest that holds n.
  if (index > 0 && classes.block_size(index - 1) >= n) return "a smaller class holds it";
  return {};
}

void check_size(const SizeClasses& classes, std::size_t n) {
  const std::string broken = broken_promise(classes, n);
  if (!broken.empty()) {
    FAIL("request " << n << " -> block " << classes.block_size(classes.class_of(n)) << ": "
                    << broken);
  }
}

std::vector<SizeClassConfig> configurations() {
  std::vector<SizeClassConfig> all;
  for (std::size_t smallest : {256u, 512u, 1024u, 4096u}) {
    for (unsigned per : {1u, 2u, 4u, 8u}) {
      for (std::size_t alignment : {256u, 512u}) {
        if (smallest % alignment != 0) continue;
        all.push_back({smallest, per, std::size_t{4} << 20, alignment});
      }
    }
  }
  return all;
}

}  // namespace

TEST_CASE("every size up to the largest class maps to a block that holds it, aligned, within "
          "the promised waste") {
  for (const SizeClassConfig& config : configurations()) {
    CAPTURE(config.smallest, config.per_doubling, config.alignment);
    const SizeClasses classes(config);
    REQUIRE(classes.max_block_size() >= config.largest);
    for (std::size_t n = 1; n <= config.largest; ++n) check_size(classes, n);
    SUCCEED("every size from 1 to " << config.largest << " checked");
  }
}

TEST_CASE("a smallest block that is no power of two, and large alignments, keep the promise at "
          "the edges of every alignment unit") {
  // class_of answers the first 1,024 alignment units from a table, the arithmetic beyond: around
  // the table's end, with tables shorter than it, and where the arithmetic divides.
  struct Odd {
    std::size_t smallest, alignment;
  };
  const Odd odd[] = {{3 * 256, 256}, {5 * 256, 256}, {7 * 512, 512},
                     {3 * 4096, 4096}, {1 << 16, 1 << 16}, {9 * 1024, 1024}};
  std::size_t checked = 0;
  for (const Odd& o : odd) {
    for (unsigned per : {1u, 2u, 4u, 8u}) {
      for (std::size_t units : {1u, 100u, 1024u, 1500u}) {
        for (std::size_t extra : {std::size_t{0}, std::size_t{37}}) {
          const SizeClassConfig config{o.smallest, per,
                                       std::max(o.smallest, units * o.alignment + extra),
                                       o.alignment};
          CAPTURE(config.smallest, config.per_doubling, config.largest, config.alignment);
          REQUIRE(streampool::validate(config).empty());
          const SizeClasses classes(config);
          const std::size_t a = config.alignment;
          for (std::size_t edge = a; edge <= classes.max_block_size(); edge += a) {
            for (std::size_t n : {edge - 1, edge, edge + 1}) {
              if (n == 0 || classes.is_large(n)) continue;
              check_size(classes, n);
              ++checked;
            }
          }
          check_size(classes, 1);
          REQUIRE(classes.is_large(classes.max_block_size() + 1));
        }
      }
    }
  }
  SUCCEED(checked << " sizes checked");
}

TEST_CASE("sampled sizes up to 1 TiB keep the promise") {
  std::mt19937_64 random(42);
  for (unsigned per : {1u, 2u, 4u, 8u}) {
    const SizeClasses classes({512, per, std::size_t{1} << 40, 256});
    REQUIRE(classes.max_block_size() >= (std::size_t{1} << 40));
    for (int i = 0; i < 200000; ++i) {
      const unsigned bits = 1 + static_cast<unsigned>(random() % 40);
      const std::size_t n = 1 + random() % (std::size_t{1} << bits);
      check_size(classes, n);
    }
    for (unsigned bit = 9; bit <= 40; ++bit) {
      const std::size_t p = std::size_t{1} << bit;
      check_size(classes, p - 1);
      check_size(classes, p);
      if (!classes.is_large(p + 1)) check_size(classes, p + 1);
    }
  }
}

TEST_CASE("block sizes strictly increase with the class index") {
  for (const SizeClassConfig& config : configurations()) {
    const SizeClasses classes(config);
    for (unsigned i = 1; i < classes.count(); ++i) {
      REQUIRE(classes.block_size(i) > classes.block_size(i - 1));
    }
  }
}

TEST_CASE("requests above the largest class are large and none below it is") {
  const SizeClasses classes({512, 4, std::size_t{32} << 20, 256});
  REQUIRE_FALSE(classes.is_large(1));
  REQUIRE_FALSE(classes.is_large(std::size_t{32} << 20));
  REQUIRE(classes.is_large(classes.max_block_size() + 1));
  REQUIRE(classes.block_size(classes.count() - 1) == classes.max_block_size());
}

TEST_CASE("the mapping is usable at compile time") {
  constexpr SizeClasses classes(SizeClassConfig{512, 4, std::size_t{1} << 20, 256});
  static_assert(classes.block_size(classes.class_of(1)) == 512);
  static_assert(classes.block_size(classes.class_of(513)) == 768);  // steps of 512/4 rounded to 256
  static_assert(classes.block_size(classes.class_of(4097)) == 5120);  // 4096 + 4096/4
  static_assert(!classes.is_large(std::size_t{1} << 20));
  SUCCEED("checked by static_assert");
}

TEST_CASE("validate names what is wrong with a configuration") {
  using streampool::validate;
  REQUIRE(validate({}).empty());
  REQUIRE_THAT(validate({512, 4, 1 << 20, 128}), Catch::Contains("alignment"));
  REQUIRE_THAT(validate({512, 4, 1 << 20, 384}), Catch::Contains("alignment"));
  REQUIRE_THAT(validate({640, 4, 1 << 20, 256}), Catch::Contains("smallest"));
  REQUIRE_THAT(validate({512, 3, 1 << 20, 256}), Catch::Contains("per doubling"));
  REQUIRE_THAT(validate({512, 4, 256, 256}), Catch::Contains("largest"));
  REQUIRE_THAT(validate({512, 4, std::size_t{1} << 41, 256}), Catch::Contains("largest"));
}
