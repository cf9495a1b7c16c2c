#!/usr/bin/env bash
# Configures the build directory that tools/run-bench.sh and tools/run-tests.sh share, with the
# one set of flags both use: the second command then builds only what the first did not (Ninja
# builds incrementally, and the same flags leave every object the first built up to date; flags
# that differed, WERROR say, would change every compile command and rebuild everything).
# Usage: tools/configure.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1
export PATH=/usr/local/cuda/bin:$PATH
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTREAMPOOL_WERROR=ON
