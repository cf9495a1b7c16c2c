#!/usr/bin/env bash
# The bench runs behind bench/results/h200.md, on the GPU machine (tools/gpu-check.sh calls it).
#   tools/bench-h200.sh BENCH OUTDIR
# Real traces are read from .traces/ (an ignored folder: copy ../shared/traces there and carry
# it); without them only the embedded workloads run.
set -uo pipefail
bench=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
traces=()
for t in "$root"/.traces/*.csv.gz; do [ -e "$t" ] && traces+=("$t"); done
summary=()
[ -f "$root/.traces/torch_summary.json" ] && summary=(--torch-summary "$root/.traces/torch_summary.json")

run() {  # run NAME args...: the command line and its output, into OUTDIR/NAME.md
  local name=$1
  shift
  {
    echo "Command (run $(date -u +%Y-%m-%dT%H:%MZ)):"
    echo
    echo '```'
    echo "streampool-bench $*" | sed "s|$root/||g"
    echo '```'
    echo
    "$bench" "$@"
  } >"$out/$name.md" 2>"$out/$name.err"
  echo "$name: rc=$?"
}

run compare compare --workload all "${traces[@]}" "${summary[@]}" --out "$out/compare"
run tune tune --workload all "${traces[@]}" --out "$out/tune"
run replay replay --workload all "${traces[@]}"
"$bench" replay --workload all "${traces[@]}" --json >"$out/replay.json" 2>/dev/null
