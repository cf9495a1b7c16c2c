// The raw-pointer API: allocate and deallocate as cudaMallocAsync and cudaFreeAsync. A free may
// name another stream than the allocation's: the memory is then reusable after the work enqueued
// on the freeing stream so far, and no sooner, on any stream.
#include "coverage.hpp"
#include "fake_helpers.hpp"
#include "pool_helpers.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <functional>
#include <string>

using streampool::FakeDevice;
using Call = FakeDevice::Call;

// Issue 8, item 9: a free on another stream than the allocation's asks that stream's id; when
// the id cannot be read, the block goes back to the allocation's own stream for immediate reuse
// there, though its last use was on the freeing stream. It must wait for that stream's work, as
// a retired stream's blocks do.
TEST_CASE("a raw free on a stream whose id cannot be read is reused only after that stream's "
          "work") {
  PoolOnFake pool(one_block_slabs());
  FakeDevice& fake = pool.fake();
  cudaStream_t a = fake.create_stream();
  cudaStream_t c = fake.create_stream();
  void* p = pool->allocate(4096, a);
  fake_test::order_after(fake, c, a);  // C uses p after A
  fake.launch(c, {{p, 4096, true}});
  fake.fail_next(Call::stream_id);
  pool->deallocate(p, 4096, c);  // freed on C, while C's write is pending

  void* q = pool->allocate(4096, a);
  fake.launch(a, {{q, 4096, true}});
  INFO(first_hazard(fake));
  CHECK(fake.hazards().empty());
  fake.complete_all();
  pool->deallocate(q, 4096, a);
}

// Misuse of the raw API the pool can see: a pointer it does not hold (never allocated by its
// allocate, or deallocated already) and a size other than the one allocated. Debug builds
// (STREAMPOOL_DEBUG_CHECKS >= 1) abort naming the call; release builds ignore the call, as
// memory_pool.hpp documents (a double free of a pointer handed out again since is not seen).
namespace {

struct ChildEnd {
  bool aborted = false;  // ended by SIGABRT
  std::string stderr_text;
};

// Runs `misuse` in a child process (the parent's pool and fake device copied into it), with its
// standard error captured.
ChildEnd in_child(const std::function<void()>& misuse) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL);  // not Catch's handler: the child ends as a program would
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    misuse();
    flush_coverage();
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildEnd end;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) {
    end.stderr_text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  end.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  return end;
}

}  // namespace

#if STREAMPOOL_DEBUG_CHECKS >= 1
TEST_CASE("in a debug build, a raw deallocate the pool can see is wrong aborts, naming it",
          "[raw][bad_input]") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  void* p = pool->allocate(4096, s);
  SECTION("a pointer the pool never allocated") {
    int not_ours = 0;
    const ChildEnd end = in_child([&] { pool->deallocate(&not_ours, sizeof not_ours, s); });
    CHECK(end.aborted);
    CHECK_THAT(end.stderr_text, Catch::Contains("deallocate") &&
                                    Catch::Contains("not allocated by this pool's allocate"));
  }
  SECTION("a pointer deallocated already") {
    pool->deallocate(p, 4096, s);
    const ChildEnd end = in_child([&] { pool->deallocate(p, 4096, s); });
    CHECK(end.aborted);
    CHECK_THAT(end.stderr_text, Catch::Contains("already deallocated"));
    p = pool->allocate(4096, s);
  }
  SECTION("a PooledBuffer's pointer") {
    auto buffer = streampool::PooledBuffer<std::byte>::alloc_async(*pool, 4096, s);
    const ChildEnd end = in_child([&] { pool->deallocate(buffer.data(), 4096, s); });
    CHECK(end.aborted);
    CHECK_THAT(end.stderr_text, Catch::Contains("not allocated by this pool's allocate"));
  }
  SECTION("a size other than the one allocated") {
    const ChildEnd end = in_child([&] { pool->deallocate(p, 8192, s); });
    CHECK(end.aborted);
    CHECK_THAT(end.stderr_text, Catch::Contains("8192") && Catch::Contains("4096"));
  }
  SECTION("the right pointer and size do not abort") {
    const ChildEnd end = in_child([&] { pool->deallocate(p, 4096, s); });
    CHECK_FALSE(end.aborted);
    CHECK(end.stderr_text.empty());
  }
  pool->deallocate(p, 4096, s);
  CHECK(pool->stats().live_allocations.current == 0);
}
#else
TEST_CASE("in a release build, a raw deallocate the pool can see is wrong is ignored",
          "[raw][bad_input]") {
  PoolOnFake pool;
  cudaStream_t s = pool.fake().create_stream();
  void* p = pool->allocate(4096, s);
  auto buffer = streampool::PooledBuffer<std::byte>::alloc_async(*pool, 4096, s);
  int not_ours = 0;
  pool->deallocate(&not_ours, sizeof not_ours, s);  // never allocated: ignored
  pool->deallocate(buffer.data(), 4096, s);         // a PooledBuffer's: ignored, still live
  CHECK(pool->stats().live_allocations.current == 2);
  pool->deallocate(p, 8192, s);  // the wrong size: the allocation is freed whole
  CHECK(pool->stats().live_allocations.current == 1);
  pool->deallocate(p, 4096, s);  // deallocated already, not handed out since: ignored
  CHECK(pool->stats().live_allocations.current == 1);
  void* q = pool->allocate(4096, s);  // p's block again, on its stream
  CHECK(q == p);
  pool->deallocate(q, 4096, s);
  buffer.reset();
  CHECK(pool->stats().live_allocations.current == 0);
  // In no build does a child process abort for a correct deallocate.
  void* r = pool->allocate(4096, s);
  CHECK_FALSE(in_child([&] { pool->deallocate(r, 4096, s); }).aborted);
  pool->deallocate(r, 4096, s);
}
#endif
