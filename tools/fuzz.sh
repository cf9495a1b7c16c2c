#!/usr/bin/env bash
# Builds the libFuzzer harness of the model check (test/fuzz/pool_fuzz.cpp; clang, ASan + UBSan,
# build dir build-fuzz/) and runs it for SECONDS on a copy of the seed corpus test/fuzz/corpus/:
# the copy, build-fuzz/fuzz-run/corpus/, takes the inputs it finds; the committed corpus is never
# written. Then prints the executions, exec/s and coverage it reached (libFuzzer's final stats
# and its last cov:/ft: figures). A crash, a model failure, a hang or running out of memory exits
# non-zero and keeps the input in build-fuzz/fuzz-run/artifacts/, with how to replay it.
#
# Usage: tools/fuzz.sh SECONDS [libFuzzer flags...]     e.g. tools/fuzz.sh 60, tools/fuzz.sh 1800
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if (($# < 1)) || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: tools/fuzz.sh SECONDS [libFuzzer flags...]" >&2
  exit 2
fi
seconds=$1
shift
"$root/tools/install-deps.sh" fuzz  # clang and libclang-rt-dev (libFuzzer, the sanitizers)

build="$root/build-fuzz"
start=$SECONDS
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DSTREAMPOOL_BUILD_FUZZER=ON -DSTREAMPOOL_DEBUG_CHECKS=2 \
  -DSTREAMPOOL_BUILD_BENCH=OFF -DSTREAMPOOL_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" --target streampool_fuzz
echo "== fuzz: built in $((SECONDS - start)) s" >&2

run="$build/fuzz-run"
rm -rf "$run"
mkdir -p "$run/corpus" "$run/artifacts"
cp "$root"/test/fuzz/corpus/* "$run/corpus/"
fuzzer="$build/test/fuzz/streampool_fuzz"
steps=$(sed -n 's/.*fuzz_max_steps = \([0-9]*\);.*/\1/p' "$root/test/fuzz/fuzz_options.hpp")

# Every sanitizer report is fatal; libFuzzer saves the input that caused it.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
status=0
"$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -max_len=4096 -timeout=60 \
  -artifact_prefix="$run/artifacts/" "$@" "$run/corpus" >"$run/log" 2>&1 || status=$?

# The final stats, and the coverage of the last status line ("#N ... cov: C ft: F corp: ...").
final_stat() { sed -n "s/^stat::$1: *//p" "$run/log" | tail -1; }
last=$(grep -E '^#[0-9]+' "$run/log" | tail -1 || true)
figure() { sed -n "s/.* $1: \([^ ]*\).*/\1/p" <<<"$last"; }
echo "== fuzz: ${seconds} s: $(final_stat number_of_executed_units) executions," \
  "$(final_stat average_exec_per_sec) exec/s, cov: $(figure cov), ft: $(figure ft)," \
  "corpus $(figure corp) ($(ls "$run/corpus" | wc -l) inputs, $(final_stat new_units_added) new)," \
  "peak RSS $(final_stat peak_rss_mb) MB" >&2

artifacts=("$run"/artifacts/*)
if ((status != 0)) || [ -e "${artifacts[0]}" ]; then
  tail -n 80 "$run/log" >&2
  echo "== fuzz: FAILED (libFuzzer exited with $status); the whole log: $run/log" >&2
  for input in "${artifacts[@]}"; do
    [ -e "$input" ] || continue
    echo "input kept: $input" >&2
    echo "  replay: $fuzzer $input" >&2
    echo "  reduce: $fuzzer -minimize_crash=1 -runs=20000 -exact_artifact_path=$input.min $input" >&2
    echo "  in the test suite: STREAMPOOL_MODEL_BYTES=$(od -An -tx1 -v "$input" | tr -d ' \n')" \
      "STREAMPOOL_MODEL_STEPS=$steps STREAMPOOL_MODEL_IN_PROCESS=1 build/test/streampool_tests" \
      "\"random operations on the pool*\"" >&2
  done
  exit 1
fi
