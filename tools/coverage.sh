#!/usr/bin/env bash
# Line coverage of the library by the test suite: builds every target with gcc's --coverage
# (STREAMPOOL_COVERAGE=ON, build dir build-coverage/; -O1 for the suite's time, gcov still counting
# inlined code on its own lines), with the invariant checks of CI's sanitizer builds
# (STREAMPOOL_DEBUG_CHECKS=2), runs the CTest suite (the model check's children
# included: they write their counts before they exit), and reports, with gcovr, each file of lib/
# with its lines run and the numbers of those never run. lib/cuda_device.cpp is left out: it calls
# the CUDA runtime, which only the GPU tests reach (they report Skipped without a GPU).
#
# Writes build-coverage/coverage.txt (the table) and build-coverage/coverage.json (gcovr's JSON
# summary), and prints the table. A line never run is a rule no test holds the pool to, or a path
# no test can reach (a failed check's report, a host allocation failing where no test makes one
# fail, a race window): write the test that fails without the line, or know which it is.
#
# Usage: tools/coverage.sh [ctest arguments...]     e.g. tools/coverage.sh -R model
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/install-deps.sh" coverage  # gcovr

build="$root/build-coverage"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
  -DSTREAMPOOL_COVERAGE=ON -DSTREAMPOOL_DEBUG_CHECKS=2 >/dev/null
cmake --build "$build"
# Counts from an earlier run would be added to this one's.
find "$build" -name '*.gcda' -delete
# The consumer projects (consumer.*) build and install streampool again, outside these counts.
if ! ctest --test-dir "$build" -E '^consumer[.]' -j "$(nproc)" --output-on-failure "$@" \
  >"$build/ctest.log"; then
  tail -n 40 "$build/ctest.log"
  echo "== coverage: some tests failed ($build/ctest.log)" >&2
  exit 1
fi

gcovr --root "$root" --object-directory "$build" --filter "$root/lib/" \
  --exclude "$root/lib/cuda_device.cpp" --txt "$build/coverage.txt" \
  --json-summary-pretty --json-summary "$build/coverage.json"
cat "$build/coverage.txt"
echo "== coverage: $build/coverage.txt, $build/coverage.json" >&2
