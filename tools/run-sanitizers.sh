#!/usr/bin/env bash
# Builds the CPU test suite (the test executables that need no GPU, nvcc or Python) under
# AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer, and runs every test of
# it; a single sanitizer report fails the run. CI (.ci/run) runs it after tools/run-tests.sh.
#
# Usage: tools/run-sanitizers.sh [asan|tsan]...   (default: both; build dirs build-asan, build-tsan)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/install-deps.sh"  # g++ brings the sanitizer runtimes (libasan, libubsan, libtsan)
export PATH=/usr/local/cuda/bin:$PATH

kinds=("$@")
((${#kinds[@]})) || kinds=(asan tsan)

# A report ends the run with a failing status: ASan and UBSan abort at the first one (the build
# makes every UBSan check fatal), LeakSanitizer fails the exit, ThreadSanitizer stops at the first
# race (halt_on_error) with its own status.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1

for kind in "${kinds[@]}"; do
  case "$kind" in
    asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" ;;
    tsan) flags="-fsanitize=thread" ;;
    *) echo "run-sanitizers.sh: unknown kind '$kind' (asan or tsan)" >&2; exit 2 ;;
  esac
  build="$root/build-$kind"
  echo "== $kind: $flags" >&2
  start=$SECONDS
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTREAMPOOL_DEBUG_CHECKS=2 -DSTREAMPOOL_BUILD_BENCH=OFF -DSTREAMPOOL_BUILD_EXAMPLES=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
  cmake --build "$build" --target streampool_tests streampool_host_memory_tests \
    streampool_torch_tests streampool_trace_cost streampool_guide_defaults
  built=$SECONDS
  # Every test case CTest knows of the executables (the GPU tests, the header check, the consumer
  # projects, the thrust tests, which nvcc compiles, and the Python binding, which loads an
  # instrumented library into an uninstrumented python3, need what is not built here).
  ctest --test-dir "$build" --output-on-failure \
    -E '^(gpu|headers\..*|example\..*|consumer\..*|torch\.python_binding|streampool_cuda_tests_NOT_BUILT.*|cuda: .*)$' \
    --no-tests=error --parallel "${CTEST_PARALLEL_LEVEL:-$(nproc)}"
  echo "== $kind: built in $((built - start)) s, tests ran in $((SECONDS - built)) s" >&2
done
