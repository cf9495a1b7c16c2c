# The consumer tests (CTest tests consumer.*, test/CMakeLists.txt): small projects that use
# streampool as its users would, configured, built and run with the CMake of this build.
#
#   cmake -DCONSUMER=find_package|add_subdirectory -DSOURCE_DIR=<streampool source>
#         -DBUILD_DIR=<streampool build> -DWORK_DIR=<scratch> -DGENERATOR=<generator>
#         [-DCUDA_COMPILER=<nvcc>] [-DPREFIX_PATH=<dir>|<dir>...] -P run.cmake
#
# find_package: installs BUILD_DIR (`cmake --install`, nothing rebuilt) under WORK_DIR/prefix,
# builds test/consumers/find_package against it in Release and runs its programs, then checks
# which versions the package says it satisfies. add_subdirectory: builds
# test/consumers/add_subdirectory with streampool's source tree inside it, as a shared library
# and in Debug, runs its programs, configures it once more without a build type, which must stay
# empty, then installs the shared libraries it built and builds the find_package consumer against
# them. Both check that the README shows their snippet word for word. Single-config generators.
cmake_minimum_required(VERSION 3.25)

foreach(var CONSUMER SOURCE_DIR BUILD_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: ${var} is not set")
  endif()
endforeach()
set(here ${SOURCE_DIR}/test/consumers)
set(common -G ${GENERATOR})
if(CUDA_COMPILER)
  list(APPEND common -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER} -DCMAKE_CUDA_ARCHITECTURES=90)
endif()

function(run)
  string(REPLACE ";" " " shown "${ARGN}")
  message(STATUS "run.cmake: ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "run.cmake: failed (${status}): ${shown}")
  endif()
endfunction()

# The README's snippet for this consumer is the text between its readme markers.
function(check_readme name file)
  file(READ ${file} text)
  string(REGEX MATCH "# readme-begin ${name}\n(.*)# readme-end" _ "${text}")
  set(snippet "${CMAKE_MATCH_1}")
  if(snippet STREQUAL "")
    message(FATAL_ERROR "run.cmake: no readme-begin ${name} ... readme-end in ${file}")
  endif()
  file(READ ${SOURCE_DIR}/README.md readme)
  string(FIND "${readme}" "${snippet}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "run.cmake: README.md does not show ${file}'s snippet:\n${snippet}")
  endif()
endfunction()

set(work ${WORK_DIR}/${CONSUMER})
file(REMOVE_RECURSE ${work})

# Where the consumers look for packages: the streampool installed by this script (when there is
# one), then the streampool build's own CMAKE_PREFIX_PATH (its dependencies). Through the
# environment, whose ':'-separated list needs no quoting through execute_process.
string(REPLACE "|" ";" dependency_prefixes "${PREFIX_PATH}")
if(DEFINED ENV{CMAKE_PREFIX_PATH})
  list(APPEND dependency_prefixes $ENV{CMAKE_PREFIX_PATH})
endif()
function(look_in prefix)
  set(prefixes ${prefix} ${dependency_prefixes})
  list(JOIN prefixes ":" joined)
  set(ENV{CMAKE_PREFIX_PATH} "${joined}")
endfunction()

# The find_package consumer against the streampool installed under `prefix`, built in `build`.
function(build_find_package_consumer prefix build)
  look_in(${prefix})
  run(${CMAKE_COMMAND} -S ${here}/find_package -B ${build} ${common} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build ${build})
  run(${build}/app)
  run(${build}/app_tests)
  if(CUDA_COMPILER)
    run(${build}/app_cuda)
  endif()
endfunction()

if(CONSUMER STREQUAL "find_package")
  check_readme(find_package ${here}/find_package/CMakeLists.txt)
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${work}/prefix)
  if(EXISTS ${BUILD_DIR}/bench/streampool-bench)
    run(${work}/prefix/bin/streampool-bench --help)
  endif()
  build_find_package_consumer(${work}/prefix ${work}/build)
  foreach(case "0.2;YES" "0.2.0;YES" "0.1;NO" "0.3;NO" "1.0;NO")
    list(GET case 0 wanted)
    list(GET case 1 expected)
    run(${CMAKE_COMMAND} -S ${here}/version -B ${work}/version-${wanted} -G ${GENERATOR}
        -DWANTED=${wanted} -DEXPECT_FOUND=${expected})
  endforeach()
elseif(CONSUMER STREQUAL "add_subdirectory")
  check_readme(add_subdirectory ${here}/add_subdirectory/CMakeLists.txt)
  look_in("")
  run(${CMAKE_COMMAND} -S ${here}/add_subdirectory -B ${work}/debug ${common}
      -DCMAKE_BUILD_TYPE=Debug -DSTREAMPOOL_SOURCE_DIR=${SOURCE_DIR})
  run(${CMAKE_COMMAND} --build ${work}/debug)
  run(${work}/debug/app)
  if(CUDA_COMPILER)
    run(${work}/debug/app_cuda)
  endif()
  # No build type at all (CMake's default, asserts on): the one streampool used to replace with
  # Release. Configuring is enough, the project checks it.
  run(${CMAKE_COMMAND} -S ${here}/add_subdirectory -B ${work}/none ${common}
      -DSTREAMPOOL_SOURCE_DIR=${SOURCE_DIR})
  # The shared libraries just built, installed as a package (streampool's install rules are the
  # parent's): the find_package consumer links them from there, as the other test does the
  # static ones.
  run(${CMAKE_COMMAND} --install ${work}/debug --prefix ${work}/shared-prefix)
  build_find_package_consumer(${work}/shared-prefix ${work}/find_package-shared)
else()
  message(FATAL_ERROR "run.cmake: unknown CONSUMER '${CONSUMER}'")
endif()
