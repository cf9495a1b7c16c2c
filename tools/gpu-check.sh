#!/usr/bin/env bash
# The one script for the GPU machine: builds for sm_90, runs the GPU tests, the probes of CUDA's
# behaviour, the call costs, compute-sanitizer and the benches, and writes what it saw under $OUT
# (few files: the device tool brings back at most eight).
#
#   tools/gpu-check.sh [stage...]     stages: tests probes costs sanitize nvtx bench (default: all),
#                                     and, asked for by name: stress stress-ab stress-paced churn
#                                     stress-sanitize (CHURN_SECONDS: the churn stage's length;
#                                     MAX_IN_FLIGHT: the paced stage's bound), torch (PyTorch on
#                                     streampool, tools/torch_check.py; TORCH_STEPS: training
#                                     steps per run, 200 by default; TORCH_MODELS: gpt2,resnet50),
#                                     torch-ddp (tools/torch_ddp.py: GPT-2 under DDP over NCCL,
#                                     a process per GPU), two-gpu (a pool per GPU under
#                                     concurrent use: DEVICES_SECONDS a run, 60 by default),
#                                     ab (this tree's bench against an older tree's, AB_OLD),
#                                     replay-ab (cold replays of the traces in .traces and the
#                                     embedded workloads, device calls timed, against the
#                                     older tree's: what growth costs)
#                                     Exits 1 when a stage failed (each stage's rc is in the log).
#
# Before the call, on the development machine: ../shared/gpu/prepare.sh (fills .devdeps), and
# carry .devdeps. For `ab` and `replay-ab`, the older tree too, in an ignored folder carried with the call:
#   rm -rf build-old-src && mkdir build-old-src && git archive COMMIT | tar -x -C build-old-src
#   (then carry build-old-src; AB_OLD names another folder); for `replay-ab`, the traces too:
#   mkdir -p .traces && cp ../shared/traces/*.csv.gz .traces/ (then carry .traces)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
build=$root/build-gpu
log=$out/gpu-check.log
stages=("$@")
((${#stages[@]})) || stages=(tests probes costs sanitize nvtx bench)
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }

deps=$root/.devdeps/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH

summary=()
failed=0  # the script's exit status: 1 when a stage failed
stage() {  # stage NAME command...: runs it, logs everything, keeps one summary line
  local name=$1
  shift
  echo "=== $name: $*" >>"$log"
  local start=$SECONDS
  "$@" >>"$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - start)))")
  echo "=== $name: rc=$rc" >>"$log"
  ((rc == 0)) || failed=1
  return $rc
}

{
  date -u
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  nproc
} >"$log" 2>&1

# The torch stages build in a folder of their own (below): the main build leaves the PyTorch hooks
# out, so that a PyTorch whose headers do not take them cannot fail the other stages.
only_torch=1
for s in "${stages[@]}"; do [[ $s == torch || $s == torch-ddp ]] || only_torch=0; done
if ((!only_torch)); then
  stage configure cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$deps" -DCMAKE_CUDA_ARCHITECTURES=90 -DSTREAMPOOL_TORCH_HOOKS=OFF ||
    { cat "$log"; exit 1; }
  # The stress stages need the bench alone.
  targets=()
  only_stress=1
  for s in "${stages[@]}"; do [[ " stress stress-ab stress-paced churn stress-sanitize ab replay-ab " == *" $s "* ]] || only_stress=0; done
  ((only_stress)) && targets=(--target streampool-bench)
  stage build cmake --build "$build" -j "$(nproc)" "${targets[@]}" || { tail -60 "$log"; exit 1; }
fi

gpu_tests=$build/test/gpu/streampool_gpu_tests
if want tests; then
  stage ctest ctest --test-dir "$build" --output-on-failure -j 4
fi
if want probes; then
  stage probes "$gpu_tests" "[.probe]"
fi
if want costs; then
  stage costs "$build/test/gpu/streampool_call_costs"
fi
if want sanitize; then
  # compute-sanitizer serializes launches: tests that need pending work ([blocking]) cannot run.
  # Fewer iterations of the hand-off tests: every launch is checked, and serialized.
  # API errors are not reported: the contract tests make calls CUDA refuses, on purpose.
  for tool in memcheck racecheck synccheck; do
    STREAMPOOL_GPU_ITERATIONS=300 stage "$tool" compute-sanitizer --tool "$tool" \
      --report-api-errors no --error-exitcode 1 "$gpu_tests" "~[blocking]"
  done
fi
# compute-sanitizer sees pool blocks (PoolOptions::nvtx_memory): a read past a block and a write
# after a drop, both inside a segment, are reported with the option on and unseen with it off.
nvtx_memcheck() {
  local program=$build/test/gpu/streampool_nvtx_memcheck failed=0 bug access expect rc report
  for bug in read-past write-after-drop; do
    access=read
    [[ $bug == write-after-drop ]] && access=write
    for mode in on off; do
      report=$(compute-sanitizer --tool memcheck --nvtx yes --error-exitcode 1 \
        "$program" "$bug" "$mode" 2>&1)
      rc=$?
      echo "$report"
      expect=1
      [[ $mode == off ]] && expect=0
      if [[ $rc != "$expect" ]]; then
        echo "nvtx: $bug with nvtx_memory $mode: memcheck rc=$rc, expected $expect"
        failed=1
      elif [[ $mode == on ]] && ! grep -q "Invalid __global__ $access" <<<"$report"; then
        echo "nvtx: $bug with nvtx_memory on: no 'Invalid __global__ $access' in the report"
        failed=1
      else
        echo "nvtx: $bug with nvtx_memory $mode: as expected (memcheck rc=$rc)"
      fi
    done
  done
  return $failed
}
if want nvtx; then
  stage nvtx nvtx_memcheck
fi
# The stress workload (streampool-bench stress; docs/bench.md), each policy in the same run.
stress_bench=$build/bench/streampool-bench
if want stress; then
  stage stress "$stress_bench" stress --seconds 60 --config "" --config fence_every_free=true \
    --out "$out/stress"
fi
# The two policies in the order A B B A, 20 s each, and cross_stream_wait: what one machine does
# over a few minutes (its clocks, the driver's first allocations) then weighs on both alike.
if want stress-ab; then
  stage stress-ab "$stress_bench" stress --seconds 20 --config "" --config fence_every_free=true \
    --config fence_every_free=true --config "" --config cross_stream_wait=true --out "$out/stress-ab"
fi
# The same A B B A with every thread at most MAX_IN_FLIGHT checks ahead of the GPU: the policies
# compared at one bounded backlog, as an application that synchronizes every few steps runs.
if want stress-paced; then
  stage stress-paced "$stress_bench" stress --seconds 20 --max-in-flight "${MAX_IN_FLIGHT:-32}" \
    --config "" --config fence_every_free=true --config fence_every_free=true --config "" \
    --out "$out/stress-paced"
fi
if want churn; then
  stage churn "$stress_bench" stress --seconds "${CHURN_SECONDS:-300}" --churn 64 --max-growth 1.5 \
    --out "$out/churn"
fi
if want stress-sanitize; then
  for tool in memcheck racecheck synccheck; do
    stage "stress-$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
      "$stress_bench" stress --seconds 5 --threads 4 --churn 64 --interval 5
  done
fi
# This tree's bench against an older tree's, each built alike, in the order old new new old: the
# pairs and threads of `compare --quick` (the peers in every run), then the paced stress with the
# default settings, 12 s a run. One file back, ab.tgz (the device tool brings back only a few
# files), packed again after every run, so that a call cut short by the tool's time limit still
# brings back the runs that finished.
old_build=$root/build-gpu-old
# The older tree's bench (AB_OLD, else build-old-src), built as this tree's is.
build_old() {
  local old_src=${AB_OLD:-$root/build-old-src}
  [ -f "$old_src/CMakeLists.txt" ] || { echo "no source tree in $old_src"; return 1; }
  cmake -S "$old_src" -B "$old_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$deps" -DCMAKE_CUDA_ARCHITECTURES=90 -DSTREAMPOOL_TORCH_HOOKS=OFF \
    -DSTREAMPOOL_BUILD_TESTS=OFF -DSTREAMPOOL_BUILD_EXAMPLES=OFF &&
    cmake --build "$old_build" -j "$(nproc)" --target streampool-bench
}
ab() {
  local i=0 which bench
  build_old || return 1
  local results=$root/ab-out
  rm -rf "$results" && mkdir -p "$results"
  local pack=(tar -C "$root" -czf "$out/ab.tgz" ab-out)
  for which in old new new old; do
    i=$((i + 1))
    bench=$build/bench/streampool-bench
    [[ $which == old ]] && bench=$old_build/bench/streampool-bench
    echo "ab: run $i, $which: compare --quick"
    "$bench" compare --quick --out "$results/compare-$i-$which" || return 1
    "${pack[@]}"
  done
  i=0
  for which in old new new old; do
    i=$((i + 1))
    bench=$build/bench/streampool-bench
    [[ $which == old ]] && bench=$old_build/bench/streampool-bench
    echo "ab: run $i, $which: stress (paced)"
    "$bench" stress --seconds 12 --max-in-flight "${MAX_IN_FLIGHT:-32}" --interval 12 --config "" \
      --out "$results/stress-$i-$which" || return 1
    "${pack[@]}"
  done
}
# Growth from a cold pool, this tree against the older one: `replay --raw --calls` of the traces
# carried in .traces and the embedded workloads, in the order old new new old (each replay a
# fresh pool, so every device allocation is a growth, and --calls times the device calls), then
# each with fixed segments once. One file back, replay-ab.tgz, packed again after every run. The
# older tree needs replay's --raw and --calls (e065b5f and after). A run that fails (a replay
# exits 1 on a failed allocation) is packed with its report and the next runs go on; the stage
# fails at the end.
replay_ab() {
  local i=0 which bench config traces=("$root"/.traces/*.csv.gz) results=$root/replay-ab-out
  local rc=0
  if [ ! -f "${traces[0]}" ]; then
    echo "replay-ab: no traces in $root/.traces: the embedded workloads alone"
    traces=()
  fi
  build_old || return 1
  rm -rf "$results" && mkdir -p "$results"
  local pack=(tar -C "$root" -czf "$out/replay-ab.tgz" replay-ab-out)
  for which in old new new old fixed-new fixed-old; do
    i=$((i + 1))
    bench=$build/bench/streampool-bench
    [[ $which == *old ]] && bench=$old_build/bench/streampool-bench
    config=""
    [[ $which == fixed-* ]] && config=expandable_segments=false
    echo "replay-ab: run $i, $which"
    "$bench" replay --raw --calls --config "$config" "${traces[@]}" --workload all \
      >"$results/replay-$i-$which.md" 2>"$results/replay-$i-$which.err" ||
      { rc=1; echo "replay-ab: run $i, $which failed:"; tail -n 5 "$results/replay-$i-$which.err"; }
    "${pack[@]}"
  done
  return $rc
}
if want ab; then
  stage ab ab
fi
if want replay-ab; then
  stage replay-ab replay_ab
fi
# PyTorch on streampool (docs/pytorch.md): the allocator library, its hooks (needs PyTorch's
# C++ headers; the checks run without them if they fail to build), then tools/torch_check.py
# (stage torch) or tools/torch_ddp.py (stage torch-ddp).
torch_build=$root/build-torch
torch_libs() {
  stage torch-configure cmake -S "$root" -B "$torch_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$deps" -DCMAKE_CUDA_ARCHITECTURES=90 -DSTREAMPOOL_BUILD_TESTS=OFF \
    -DSTREAMPOOL_BUILD_BENCH=OFF -DSTREAMPOOL_BUILD_EXAMPLES=OFF -DSTREAMPOOL_TORCH_HOOKS=ON &&
    stage torch-lib cmake --build "$torch_build" -j "$(nproc)" --target streampool_torch &&
    { rm -f "$torch_build"/torch/libstreampool_torch_hooks.so*  # none left if the build fails
      stage torch-hooks cmake --build "$torch_build" -j "$(nproc)" --target streampool_torch_hooks
      true; }
}
if want torch || want torch-ddp; then
  torch_libs
fi
if want torch && [ -e "$torch_build/torch/libstreampool_torch.so" ]; then
  stage torch-check bash -o pipefail -c \
    'STREAMPOOL_TORCH_LIB_DIR="$2"/torch python3 "$1"/tools/torch_check.py --steps "$3" \
       --models "$5" --json "$4"/torch-check.json | tee "$4"/torch-check.md' \
    _ "$root" "$torch_build" "${TORCH_STEPS:-200}" "$out" "${TORCH_MODELS:-gpt2,resnet50}"
fi
# Issue 13's second half: GPT-2 small under DistributedDataParallel over NCCL, a process per GPU,
# PyTorch's allocator against streampool's in each (TORCH_STEPS steps, 300 by default).
if want torch-ddp && [ -e "$torch_build/torch/libstreampool_torch.so" ]; then
  stage torch-ddp bash -o pipefail -c \
    'STREAMPOOL_TORCH_LIB_DIR="$2"/torch python3 "$1"/tools/torch_ddp.py --steps "$3" \
       --json "$4"/torch-ddp.json | tee "$4"/torch-ddp.md' \
    _ "$root" "$torch_build" "${TORCH_STEPS:-300}" "$out"
fi
# Issue 13's first half: a pool per GPU under threads of every GPU at once, real kernels, the
# caller's current device another's during each pool call, peer access off and on
# (test/gpu/devices_concurrent_gpu.cpp), for DEVICES_SECONDS a run (60 by default; three runs),
# then compute-sanitizer's memcheck on a short run of it.
if want two-gpu; then
  STREAMPOOL_GPU_SECONDS=${DEVICES_SECONDS:-60} stage devices "$gpu_tests" "[devices]"
  STREAMPOOL_GPU_SECONDS=3 stage devices-memcheck compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$gpu_tests" "[devices]"
fi
if want bench && [ -x "$build/bench/streampool-bench" ]; then
  stage bench "$root/tools/bench-h200.sh" "$build/bench/streampool-bench" "$root/bench-out"
  tar -C "$root" -czf "$out/results.tgz" bench-out  # one file back, however many results
fi

printf '%s\n' "${summary[@]}" | tee -a "$log"
grep -E "^probe:|^nvtx:|^[a-zA-Z].* +[0-9]+\.[0-9]$" "$log" | tail -120
# The status of the stages, not of the grep above (which finds nothing when no stage prints).
exit "$failed"
