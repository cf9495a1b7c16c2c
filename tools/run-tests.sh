#!/usr/bin/env bash
# Builds streampool and runs its tests. GPU tests (CTest label `gpu`) report Skipped where there
# is no GPU. Usage: tools/run-tests.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
"$root/tools/install-deps.sh"
export PATH=/usr/local/cuda/bin:$PATH
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTREAMPOOL_WERROR=ON
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure
