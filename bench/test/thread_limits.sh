#!/bin/sh
# The bench never aborts when it cannot create a thread: under a memory limit that leaves room for
# only a few thread stacks, a trace naming 1,500 threads and `tune --threads 2000` each end with
# exit status 1 and a message naming the thread, not with std::terminate (status 134).
#   thread_limits.sh BENCH SCRATCH_DIR
set -u
bench=$1
dir=$2
mkdir -p "$dir"
trace="$dir/threads1500.csv"
{
  echo "Thread,Time,Action,Pointer,Size,Stream"
  t=0
  while [ $t -lt 1500 ]; do
    echo "$t,$t,allocate,$((4096 * (t + 1))),4096,0x0"
    echo "$t,$t,free,$((4096 * (t + 1))),4096,0x0"
    t=$((t + 1))
  done
} >"$trace"

failed=0
expect() {  # expect NAME COMMAND...: status 1 and "cannot create thread" on stderr
  name=$1
  shift
  # 256 MiB stacks in 3 GiB of address space: a handful of threads at most.
  (ulimit -s 262144 && ulimit -v 3145728 && exec "$@") >"$dir/$name.out" 2>"$dir/$name.err"
  status=$?
  if [ $status -ne 1 ] || ! grep -q "cannot create thread" "$dir/$name.err"; then
    echo "FAILED $name: status $status (expected 1 and 'cannot create thread'); stderr:"
    cat "$dir/$name.err"
    failed=1
  else
    echo "ok $name: $(cat "$dir/$name.err")"
  fi
}
expect replay "$bench" replay --fake "$trace"
expect tune "$bench" tune --workload random --threads 2000
exit $failed
