#!/usr/bin/env bash
# Builds streampool and runs its tests. GPU tests (CTest label `gpu`) report Skipped where there
# is no GPU. The build directory and its flags are tools/run-bench.sh's (tools/configure.sh): what
# that built is not built again. Usage: tools/run-tests.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
"$root/tools/install-deps.sh"
"$root/tools/configure.sh" "$build"
export PATH=/usr/local/cuda/bin:$PATH
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure
