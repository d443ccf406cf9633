#!/usr/bin/env bash
# Fuzzes every parser of seqlab with libFuzzer: builds the targets of tests/fuzz/ (clang, ASan + UBSan,
# in build-asan/, shared with scripts/sanitize.sh) and runs each for SECONDS (default 60), starting from
# its seed corpus tests/fuzz/corpus/<target>/, as many at a time as there are cores.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g.  scripts/fuzz.sh 20   scripts/fuzz.sh 3600 npy
#
# A finding — a crash, a sanitizer report, a broken invariant of the target, an input that runs longer
# than 10 s, an allocation above 512 MB or a process above 2 GB — fails the run (exit 1); the input that
# did it is saved as build-asan/fuzz/<target>/crash-* (or leak-, timeout-, oom-, slow-unit-) and the
# end of the target's log is printed. Inputs that reached new code are kept in build-asan/fuzz/<target>/
# corpus/ for the next run. Environment: SEQLAB_FUZZ_JOBS (targets run at once, default: the cores),
# SEQLAB_FUZZ_RUNS (a target also stops after this many executions; the long run of docs/reliability.md
# is  SEQLAB_FUZZ_RUNS=1000000 scripts/fuzz.sh 3600).
set -euo pipefail
source "$(dirname "$0")/setup.sh"

seconds="${1:-60}"
[ $# -gt 0 ] && shift
case "$seconds" in '' | *[!0-9]*) seqlab_say "fuzz.sh: SECONDS must be a whole number, got '$seconds'"; exit 2 ;; esac
all_targets=()
for source in "$SEQLAB_ROOT"/tests/fuzz/fuzz_*.cc; do
  name="$(basename "$source" .cc)"
  all_targets+=("${name#fuzz_}")
done
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [ -f "$SEQLAB_ROOT/tests/fuzz/fuzz_$t.cc" ] || { seqlab_say "fuzz.sh: no target '$t' (targets: ${all_targets[*]})"; exit 2; }
done

seqlab_install_packages "${SEQLAB_PACKAGES[@]}" "${SEQLAB_CLANG_PACKAGES[@]}"
SEQLAB_BUILD="$SEQLAB_ROOT/build-asan"
SEQLAB_CMAKE_ARGS="-DCMAKE_CXX_COMPILER=clang++ -DSEQLAB_CUDA=OFF -DSEQLAB_FUZZ=ON -DSEQLAB_SANITIZE=address,undefined"
seqlab_build seqlab_fuzzers

work="$SEQLAB_BUILD/fuzz"
# Allocations and a process size no parser needs for inputs of a few kilobytes; a leak is a finding too.
limits=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10)
if [ -n "${SEQLAB_FUZZ_RUNS:-}" ]; then
  case "$SEQLAB_FUZZ_RUNS" in *[!0-9]*) seqlab_say "fuzz.sh: SEQLAB_FUZZ_RUNS must be a whole number"; exit 2 ;; esac
  limits+=(-runs="$SEQLAB_FUZZ_RUNS")
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$SEQLAB_ROOT/tests/lsan_suppressions.txt:print_suppressions=0}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # one process per core already
# The targets write each input to a file for the parser to read (and some write it back): on a
# memory file system that costs microseconds, on a disk a sync each (40x fewer executions measured).
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

run_target() {  # target: runs it, then prints one summary line; the exit status is libFuzzer's
  local t="$1" dir="$work/$1"
  rm -f "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* "$dir"/slow-unit-*
  mkdir -p "$dir/corpus"
  local status=0
  "$SEQLAB_BUILD/fuzz_$t" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$dir/" "$dir/corpus" "$SEQLAB_ROOT/tests/fuzz/corpus/$t" >"$dir/log" 2>&1 || status=$?
  local runs
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -n 1)"
  if [ "$status" -eq 0 ]; then
    printf 'fuzz %-12s %10s executions in %ss, 0 crashes (corpus %s files)\n' "$t" "${runs:-?}" \
      "$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$dir/log" | tail -n 1)" "$(find "$dir/corpus" -type f | wc -l)"
  else
    printf 'fuzz %-12s FAILED (exit %s) after %s executions; input saved as:\n' "$t" "$status" "${runs:-?}"
    ls "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* "$dir"/slow-unit-* 2>/dev/null | sed 's/^/  /' || true
    tail -n 40 "$dir/log" | sed 's/^/  | /'
  fi
  return "$status"
}

jobs="${SEQLAB_FUZZ_JOBS:-$(nproc)}"
failed=0 running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
if [ "$failed" -ne 0 ]; then
  seqlab_say "fuzzing found a problem (above); reproduce with: $SEQLAB_BUILD/fuzz_TARGET FILE"
  exit 1
fi
