#!/usr/bin/env bash
# Builds streampool-bench (the bench alone: not the tests or the examples) and runs the main job.
# The build directory and its flags are tools/run-tests.sh's (tools/configure.sh), so that
# run-tests.sh afterwards builds only the rest. Usage: tools/run-bench.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
"$root/tools/install-deps.sh"
"$root/tools/configure.sh" "$build"
cmake --build "$build" --target streampool-bench
"$build/bench/streampool-bench"  # replays the embedded workloads
