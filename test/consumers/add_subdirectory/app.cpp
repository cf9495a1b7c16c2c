// A consumer built with streampool's source tree inside it (add_subdirectory), as a shared
// library: the parent's build type is left alone (so its asserts stay on), and what the library
// throws is caught here, across the library's boundary.
#include <streampool/streampool.hpp>

#include <cassert>
#include <cstdio>
#include <string>

#ifdef NDEBUG
#error "NDEBUG is defined: streampool changed the parent project's build type"
#endif

int main() {
  int asserted = 0;
  assert(++asserted == 1);  // runs only while asserts are on
  if (asserted != 1) return 1;

  if (streampool::version() != STREAMPOOL_VERSION_STRING) return 1;

  bool thrown = false;
  try {
    (void)streampool::PoolOptions::parse("no_such_key=1");
  } catch (const streampool::Error& error) {
    thrown = error.errc() == streampool::Errc::invalid_value;
  }
  if (!thrown) return 1;

  const streampool::PoolOptions options = streampool::PoolOptions::parse("segment=64M");
  if (options.segment_bytes != std::size_t{64} << 20) return 1;
  std::printf("streampool %s, asserts on, options %s\n",
              std::string(streampool::version()).c_str(), options.to_conf().c_str());
  return 0;
}
