// streampool::version(): the version written in project(VERSION ...), the one place it is set.
#include <streampool/version.hpp>

#include <catch2/catch.hpp>

#include <string>

TEST_CASE("version() is the version CMake's project() declares", "[version]") {
  // STREAMPOOL_TEST_CMAKE_VERSION is ${PROJECT_VERSION}, passed by test/CMakeLists.txt.
  CHECK(streampool::version() == STREAMPOOL_TEST_CMAKE_VERSION);
}

TEST_CASE("the version macros spell the same version as version()", "[version]") {
  const std::string spelled = std::to_string(STREAMPOOL_VERSION_MAJOR) + "." +
                              std::to_string(STREAMPOOL_VERSION_MINOR) + "." +
                              std::to_string(STREAMPOOL_VERSION_PATCH);
  CHECK(spelled == STREAMPOOL_VERSION_STRING);
  CHECK(streampool::version() == STREAMPOOL_VERSION_STRING);
}
