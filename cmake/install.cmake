# `cmake --install`: the headers, the two libraries, streampool-bench (bench/CMakeLists.txt) and
# the package that find_package(streampool) reads:
#
#   find_package(streampool 0.2 REQUIRED)
#   target_link_libraries(app PRIVATE streampool::streampool)        # and streampool::fake_device
#
# Included by the top-level CMakeLists.txt after both library targets exist.
include(CMakePackageConfigHelpers)

set(STREAMPOOL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/streampool)

install(DIRECTORY include/streampool DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        PATTERN "*.in" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/include/streampool/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/streampool)

install(TARGETS streampool streampool_fake_device EXPORT streampool-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT streampool-targets NAMESPACE streampool:: DESTINATION ${STREAMPOOL_CMAKE_DIR})

configure_package_config_file(cmake/streampool-config.cmake.in
  ${PROJECT_BINARY_DIR}/streampool-config.cmake
  INSTALL_DESTINATION ${STREAMPOOL_CMAKE_DIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible (a 0.2.x
# package satisfies find_package(streampool 0.2), not 0.1 or 0.3).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/streampool-config-version.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/streampool-config.cmake
              ${PROJECT_BINARY_DIR}/streampool-config-version.cmake
        DESTINATION ${STREAMPOOL_CMAKE_DIR})
