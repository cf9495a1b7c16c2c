// MemoryPool::grant_access: another GPU's kernels given the pool's memory, as cudaMemPoolSetAccess
// gives a peer a cudaMallocAsync pool's. The fake device of ordinal 0 here has device 1 as its
// peer (FakeDevice::Options::peers) and records which devices may use each byte
// (FakeDevice::accessible_from): mappings through vm_set_access, cudaMalloc memory through
// enable_peer_access.
#include "hooked_device.hpp"
#include "pool_helpers.hpp"

#include <streampool/capture_pool.hpp>
#include <streampool/error.hpp>

#include <atomic>
#include <optional>
#include <random>
#include <thread>
#include <vector>

using streampool::Errc;
using streampool::Error;
using streampool::FakeDevice;
using Call = streampool::FakeDevice::Call;
using Bytes = streampool::PooledBuffer<std::byte>;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;

FakeDevice::Options with_peer() {
  FakeDevice::Options o;
  o.peers = 0b10;  // device 1
  return o;
}

streampool::PoolOptions options_with(bool expandable) {
  auto options = test_options();
  options.expandable_segments = expandable;
  return options;
}

// The Error grant_access(device) throws; none where it granted.
std::optional<Error> grant_refused(streampool::MemoryPool& pool, int device) {
  try {
    pool.grant_access(device);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// Two mappings of one reservation with a hole between them, where a third was unmapped: two
// runs of mappings, so that a grant makes two calls.
struct RunsApart {
  Bytes x;
  Bytes z;
  const void* hole = nullptr;
};
template <class Pool>
RunsApart runs_apart(Pool& pool, cudaStream_t s) {
  RunsApart made;
  made.x = Bytes::alloc_async(*pool, 4 * MiB, s);
  auto y = Bytes::alloc_async(*pool, 4 * MiB, s);
  made.z = Bytes::alloc_async(*pool, 4 * MiB, s);
  REQUIRE(y.data() == made.x.data() + 4 * MiB);  // one reservation, three mappings
  REQUIRE(made.z.data() == y.data() + 4 * MiB);
  made.hole = y.data();
  y.reset();
  pool->trim();  // unmaps y's mapping: x's and z's are apart
  REQUIRE(pool->stats().reserved_bytes.current == static_cast<std::int64_t>(8 * MiB));
  return made;
}
}  // namespace

TEST_CASE("grant_access gives a peer every block, those handed out before and after") {
  const bool expandable = GENERATE(true, false);
  CAPTURE(expandable);
  PoolOnFake pool(options_with(expandable), with_peer());
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  cudaStream_t t = fake.create_stream();
  // Small blocks (slabs) and large ones, from growths before the grant, on two streams (whose
  // large growths map into homes of their own: mappings apart).
  std::vector<Bytes> before;
  before.push_back(Bytes::alloc_async(*pool, 1000, s));
  before.push_back(Bytes::alloc_async(*pool, 3 * MiB, s));
  before.push_back(Bytes::alloc_async(*pool, 9 * MiB, s));
  before.push_back(Bytes::alloc_async(*pool, 5 * MiB, t));
  before.push_back(Bytes::alloc_async(*pool, 2000, t));
  for (const Bytes& b : before) {
    CHECK(fake.accessible_from(b.data(), 0));
    CHECK_FALSE(fake.accessible_from(b.data(), 1));  // not yet
  }
  const auto set_access_before = fake.calls(Call::vm_set_access);

  pool->grant_access(1);
  CHECK(fake.calls(Call::enable_peer_access) == 1);
  for (const Bytes& b : before) {
    CHECK(fake.accessible_from(b.data(), 1));
    CHECK(fake.accessible_from(b.data() + b.byte_size() - 1, 1));
    CHECK(fake.accessible_from(b.data(), 0));  // its own device keeps it
  }
  if (expandable) {
    // Adjacent mappings in one call: fewer calls than growths, and more than one (the homes).
    const auto calls = fake.calls(Call::vm_set_access) - set_access_before;
    CHECK(calls > 1);
    CHECK(calls < set_access_before);
  } else {
    CHECK(fake.calls(Call::vm_set_access) == 0);
  }

  // Growths after the grant: the peer's at once.
  std::vector<Bytes> after;
  after.push_back(Bytes::alloc_async(*pool, 40 * MiB, s));
  after.push_back(Bytes::alloc_async(*pool, 7 * MiB, s));
  for (const Bytes& b : after) {
    CHECK(fake.accessible_from(b.data(), 1));
    CHECK(fake.accessible_from(b.data(), 0));
  }
  CHECK_FALSE(fake.accessible_from(after.front().data(), 2));  // no other device

  // Granted twice is granted once.
  const auto calls = fake.total_calls();
  pool->grant_access(1);
  CHECK(fake.total_calls() - calls == 1);  // the device's peer access, already on
  CHECK(fake.hazards().empty());
}

TEST_CASE("grant_access reaches the mappings on both sides of an unmapped hole") {
  PoolOnFake pool(options_with(true), with_peer());
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  const RunsApart made = runs_apart(pool, s);
  const auto calls = fake.calls(Call::vm_set_access);
  pool->grant_access(1);
  CHECK(fake.calls(Call::vm_set_access) - calls == 2);
  CHECK(fake.accessible_from(made.x.data(), 1));
  CHECK(fake.accessible_from(made.z.data(), 1));
  CHECK_FALSE(fake.accessible_from(made.hole, 1));  // nothing mapped there
}

TEST_CASE("grant_access refuses what CUDA refuses, and its own device needs nothing") {
  PoolOnFake pool(options_with(true), with_peer());
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto b = Bytes::alloc_async(*pool, 3 * MiB, s);
  const auto calls = fake.total_calls();
  pool->grant_access(0);  // its own
  CHECK(fake.total_calls() == calls);

  for (const int bad : {-1, 64}) {
    const std::optional<Error> refused = grant_refused(*pool, bad);
    REQUIRE(refused);
    CHECK(refused->code() == Errc::invalid_value);
  }
  CHECK(fake.total_calls() == calls);

  // Device 2 cannot reach device 0's memory: CUDA's refusal, and nothing given.
  const std::optional<Error> refused = grant_refused(*pool, 2);
  REQUIRE(refused);
  CHECK(refused->cuda_error() == cudaErrorInvalidDevice);
  CHECK_THAT(refused->what(), Catch::Contains("grant_access(2)"));
  CHECK_FALSE(fake.accessible_from(b.data(), 2));
  auto later = Bytes::alloc_async(*pool, 30 * MiB, s);  // growths still work, for device 0
  CHECK(fake.accessible_from(later.data(), 0));
  CHECK_FALSE(fake.accessible_from(later.data(), 1));
}

TEST_CASE("a grant that fails half way can be made again, and later growths wait for it") {
  HookedPool pool(options_with(true), with_peer());
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  const RunsApart made = runs_apart(pool, s);
  const Bytes& x = made.x;
  const Bytes& z = made.z;
  // The first of the grant's two calls succeeds, the second fails.
  pool.device->after_next(Call::vm_set_access,
                          [&] { fake.fail_next(Call::vm_set_access, 1, cudaErrorInvalidValue); });
  const std::optional<Error> refused = grant_refused(*pool, 1);
  REQUIRE(refused);
  CHECK(refused->cuda_error() == cudaErrorInvalidValue);
  CHECK_THAT(refused->what(), Catch::Contains("cuMemSetAccess"));
  CHECK(fake.accessible_from(x.data(), 1) != fake.accessible_from(z.data(), 1));  // half way
  // Not granted: a growth now is device 0's alone.
  auto growth = Bytes::alloc_async(*pool, 30 * MiB, s);
  CHECK_FALSE(fake.accessible_from(growth.data(), 1));
  pool->grant_access(1);
  CHECK(fake.accessible_from(x.data(), 1));
  CHECK(fake.accessible_from(z.data(), 1));
  CHECK(fake.accessible_from(growth.data(), 1));
}

TEST_CASE("grant_access is refused during a capture that forbids cudaMalloc") {
  PoolOnFake pool(options_with(true), with_peer());
  FakeDevice& fake = pool.fake();
  cudaStream_t s = fake.create_stream();
  auto capture = std::make_shared<streampool::CapturePool>(*pool);
  streampool::begin_capture_with_pool(capture, s, streampool::CaptureMode::global);
  const auto calls = fake.calls(Call::enable_peer_access);
  const std::optional<Error> refused = grant_refused(*pool, 1);
  REQUIRE(refused);
  CHECK(refused->code() == Errc::capture_forbids_call);
  CHECK(fake.calls(Call::enable_peer_access) == calls);
  auto graph = streampool::end_capture_with_pool(s, capture);
  pool->grant_access(1);  // after it: granted
  auto b = Bytes::alloc_async(*pool, 3 * MiB, s);
  CHECK(fake.accessible_from(b.data(), 1));
}

// A grant while other threads grow and trim: every block handed out after grant_access returned
// is the peer's (a growth that read the devices before the grant took the growth mutex would
// map memory the grant's walk had not seen yet, or had already passed).
TEST_CASE("a grant while threads grow: every block handed out after it is the peer's") {
  PoolOnFake pool(options_with(true), with_peer());
  FakeDevice& fake = pool.fake();
  constexpr int threads = 4;
  constexpr int rounds_after = 200;  // each thread's allocations once the grant is made
  std::atomic<bool> granted{false};
  std::atomic<int> made{0};
  std::atomic<int> checked{0};
  std::atomic<int> missing{0};
  std::atomic<int> failed{0};
  std::vector<cudaStream_t> streams;
  for (int t = 0; t < threads; ++t) streams.push_back(fake.create_stream());
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t + 1));
      std::vector<Bytes> held;
      for (int after_rounds = 0, r = 0; after_rounds < rounds_after; ++r) {
        const bool after = granted.load();
        std::error_code error;
        auto b = Bytes::try_alloc_async(*pool, (1 + random() % 24) * MiB + random() % 4096,
                                        streams[t], error);
        if (error) {
          ++failed;
          return;
        }
        ++made;
        if (after) {
          ++after_rounds;
          ++checked;
          if (!fake.accessible_from(b.data(), 1) ||
              !fake.accessible_from(b.data() + b.byte_size() - 1, 1)) {
            ++missing;
          }
        }
        held.push_back(std::move(b));
        if (held.size() > 4) held.erase(held.begin());
        if (t == 0 && r % 50 == 49) pool->trim();  // mappings go and come back
      }
    });
  }
  // Granted once the threads are under way, while they grow, reuse and trim.
  while (made.load() < 100 && failed.load() == 0) std::this_thread::yield();
  pool->grant_access(1);
  granted = true;
  for (auto& w : workers) w.join();
  CHECK(failed == 0);
  CHECK(checked == threads * rounds_after);
  CHECK(missing == 0);
  fake.complete_all();
  CHECK(fake.hazards().empty());
}
