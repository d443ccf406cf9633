#!/usr/bin/env bash
# Training speed of a recipe under several builds (or settings), measured alternately: one round trains the
# recipe for STEPS steps with each candidate in turn, rounds repeat so that drift on a shared machine hits
# every candidate alike. A run's rate is the mean of the tokens/s logged at steps ≥ 20 (the first steps warm
# the caches); prints every run, each candidate's median and its ratio to the first candidate's median.
#
# Usage: bench/recipe_speed.sh RECIPE ROUNDS STEPS CANDIDATE...
#   CANDIDATE = NAME=BINARY[@RECIPE][,--set,KEY=VALUE...]: @RECIPE trains that recipe file instead of RECIPE
#   (an older build that does not read a key of today's recipe), e.g.
#     bench/recipe_speed.sh recipes/gla_small.toml 3 60 before=../old/build/seqlab@old_gla_small.toml \
#         f32=build/seqlab,--set,train.dtype=f32 auto=build/seqlab
# Each run writes to a fresh folder under ${TMPDIR:-/tmp} and removes it after; evaluation is pushed past the
# last step (log.eval_every) so that only training is timed.
set -euo pipefail

usage() {
  echo "usage: bench/recipe_speed.sh RECIPE ROUNDS STEPS NAME=BINARY[@RECIPE][,--set,KEY=VALUE...]..." >&2
  exit 2
}
[ $# -ge 4 ] || usage
recipe="$1" rounds="$2" steps="$3"
shift 3
[ -f "$recipe" ] || { echo "recipe_speed: no recipe $recipe" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ && "$steps" =~ ^[0-9]+$ && "$steps" -ge 25 ]] ||
  { echo "recipe_speed: ROUNDS must be ≥ 1 and STEPS ≥ 25" >&2; exit 2; }

names=() bins=() recipes=() extras=()
for cand in "$@"; do
  [[ "$cand" == *=* ]] || usage
  name="${cand%%=*}" spec="${cand#*=}"
  IFS=, read -r -a parts <<<"$spec"
  bin="${parts[0]%%@*}" own="$recipe"
  [[ "${parts[0]}" == *@* ]] && own="${parts[0]#*@}"
  [ -x "$bin" ] || { echo "recipe_speed: $name: $bin is not an executable" >&2; exit 2; }
  [ -f "$own" ] || { echo "recipe_speed: $name: no recipe $own" >&2; exit 2; }
  names+=("$name")
  bins+=("$bin")
  recipes+=("$own")
  extra=""
  if [ ${#parts[@]} -gt 1 ]; then extra="$(printf '%q ' "${parts[@]:1}")"; fi
  extras+=("$extra")
done

work="$(mktemp -d "${TMPDIR:-/tmp}/recipe_speed.XXXXXX")"
trap 'rm -rf "$work"' EXIT
declare -A rates
for ((r = 1; r <= rounds; ++r)); do
  for i in "${!names[@]}"; do
    out="$work/run"
    rm -rf "$out"
    eval "$(printf '%q %q' "${bins[$i]}" "${recipes[$i]}")" "${extras[$i]}" --set train.steps="$steps" \
      --set log.eval_every=1000000 --out "$(printf '%q' "$out")" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
    rate="$(python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
r = [m["tokens_per_s"] for m in lines if m.get("step", 0) >= 20 and m.get("tokens_per_s") is not None]
print(f"{sum(r) / len(r):.0f}" if r else "nan")' "$out/metrics.jsonl")"
    rates[$i]+="$rate "
    echo "round $r ${names[$i]}: $rate tokens/s"
  done
done
base=""
for i in "${!names[@]}"; do
  median="$(python3 -c 'import sys, statistics; print(f"{statistics.median(float(v) for v in sys.argv[1:]):.0f}")' ${rates[$i]})"
  [ -z "$base" ] && base="$median"
  ratio="$(python3 -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "$median" "$base")"
  printf '%-16s %-30s median %6s tokens/s   %sx the first\n' "${names[$i]}" "${rates[$i]}" "$median" "$ratio"
done
