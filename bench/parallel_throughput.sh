#!/usr/bin/env bash
# Training throughput of one process against data parallelism (--nproc 2, its gradient averaging overlapped
# with the backward, and not: parallel.overlap=false) and sequence parallelism (--nproc 2 --set
# parallel.sp=2) on this machine's CPU cores, the same recipe and global batch, run alternately (one, dp2,
# dp2sync, sp2, one, ...) so that drift on a shared machine hits them alike. Every run's
# tokens/s is the median over its logged steps after the first 5 (warm-up); printed: every run, the
# medians and the ratios against one process. The one process uses all cores; each of the 2 ranks half of
# them (what ./train does by default).
#
# Usage: bench/parallel_throughput.sh [rounds (3)] [steps (40)] [recipe (recipes/gpt_small.toml)] [-- --set ...]
# Environment: SEQLAB (the seqlab binary, default build/seqlab).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-40}"
recipe="${3:-$root/recipes/gpt_small.toml}"
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
extra=("$@")
seqlab="${SEQLAB:-$root/build/seqlab}"
fail() { printf 'parallel_throughput: %s\n' "$*" >&2; exit 1; }
[ -x "$seqlab" ] || fail "$seqlab not found: build it first (ninja -C build seqlab)"
[ -f "$recipe" ] || fail "no recipe $recipe"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# median tokens/s of a run's logged steps after the fifth
tps() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
v = [m["tokens_per_s"] for m in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in m and m["step"] > 5]
print(f"{statistics.median(v):.0f}" if v else "0")
PY
}
common=(--set train.steps="$steps" --set log.every=1 --set log.eval_every=100000 --set log.sample_every=0
        --set checkpoint.every=100000 --set 'log.progress="plain"' "${extra[@]}")
declare -A runs=([one]="" [dp2]="--nproc 2" [dp2sync]="--nproc 2 --set parallel.overlap=false"
                 [sp2]="--nproc 2 --set parallel.sp=2")
names=(one dp2 dp2sync sp2)
declare -A results
for ((r = 1; r <= rounds; r++)); do
  for name in "${names[@]}"; do
    out="$work/$name-$r"
    # shellcheck disable=SC2086  # the flags of the run, split on purpose
    "$seqlab" "$recipe" "${common[@]}" ${runs[$name]} --out "$out" > "$out.log" 2>&1 || fail "$name failed: $(tail -n 2 "$out.log")"
    t="$(tps "$out")"
    results[$name]+="$t "
    echo "round $r $name: $t tokens/s"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
one="$(median <<<"${results[one]}")"
echo
for name in "${names[@]}"; do
  m="$(median <<<"${results[$name]}")"
  printf '%-7s median %s tokens/s  (%s)  ratio to one process %s\n' "$name" "$m" "${runs[$name]:-one process}" \
    "$(awk -v a="$m" -v b="$one" 'BEGIN {printf "%.2f", a / b}')"
done
