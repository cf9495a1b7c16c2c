#!/usr/bin/env bash
# Builds streampool and runs the main job. Usage: tools/run-bench.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
"$root/tools/install-deps.sh"
export PATH=/usr/local/cuda/bin:$PATH
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build"
"$build/bench/streampool-bench"  # replays the embedded workloads
