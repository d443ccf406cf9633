#!/usr/bin/env bash
# Where a CPU training step goes (docs/perf.md): gpt_small and gla_small, f32 and bf16, each trained for
# STEPS steps under `seqlab RECIPE --profile STEPS-1` (the first step warms the caches and is left out),
# then one markdown table of all four runs from their profile.json: ms/step and share per category, and
# each run's largest slots.
#
# Usage: bench/step_profile.sh [STEPS, default 20] [OUT_DIR, default runs/step_profile]
#        SEQLAB_BUILD=DIR to use another build (default build/); OUT_DIR must not hold these runs yet.
#        bench/step_profile.sh --report OUT_DIR   the table again, from the runs already in OUT_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

# The markdown table of the profile.json files given.
report() {
  python3 - "$@" <<'PY'
import json, os, sys
runs = [(os.path.basename(os.path.dirname(p)), json.load(open(p))) for p in sys.argv[1:]]
print("| category | " + " | ".join(f"{name} ms/step (share)" for name, _ in runs) + " |")
print("|---|" + "---|" * len(runs))
for i, cat in enumerate(runs[0][1]["categories"]):
    cells = [f'{r["categories"][i]["ms_per_step"]:.1f} ({100 * r["categories"][i]["share"]:.1f}%)' for _, r in runs]
    print(f'| {cat["name"]} | ' + " | ".join(cells) + " |")
print("| **step (wall)** | " + " | ".join(f'**{r["wall_ms_per_step"]:.1f}**' for _, r in runs) + " |")
print()
for name, r in runs:
    top = [f'{s["name"]} {100 * s["share"]:.1f}%' + (f' (nested GEMM {s["nested_gemm_ms_per_step"]:.1f} ms)'
           if s["nested_gemm_ms_per_step"] > 0 else "") for s in r["slots"][:8]]
    print(f'- {name}, {r["steps"]} steps, largest slots: ' + ", ".join(top))
PY
}

if [ "${1:-}" = "--report" ]; then
  [ $# -eq 2 ] || { echo "usage: bench/step_profile.sh --report OUT_DIR" >&2; exit 2; }
  files=()
  for recipe in gpt_small gla_small; do
    for dtype in f32 bf16; do
      [ -f "$2/$recipe-$dtype/profile.json" ] && files+=("$2/$recipe-$dtype/profile.json")
    done
  done
  [ ${#files[@]} -gt 0 ] || { echo "step_profile.sh: no */profile.json of these runs in $2" >&2; exit 2; }
  report "${files[@]}"
  exit 0
fi
steps="${1:-20}"
out="${2:-$root/runs/step_profile}"
build="${SEQLAB_BUILD:-$root/build}"
if ! [[ "$steps" =~ ^[0-9]+$ ]] || [ "$steps" -lt 2 ]; then
  echo "step_profile.sh: STEPS must be a whole number of at least 2, got '$steps'" >&2
  exit 2
fi
[ -x "$build/seqlab" ] || { echo "step_profile.sh: no $build/seqlab (build it: source scripts/setup.sh && seqlab_build seqlab)" >&2; exit 2; }
# As ./train runs: idle OpenMP threads spin briefly, then sleep (scripts/setup.sh, docs/perf.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-3000}"
mkdir -p "$out"
runs=()
for recipe in gpt_small gla_small; do
  for dtype in f32 bf16; do
    run="$out/$recipe-$dtype"
    if [ -e "$run" ]; then
      echo "step_profile.sh: $run exists already: give another OUT_DIR" >&2
      exit 2
    fi
    echo "step_profile.sh: $recipe, $dtype, $steps steps ..." >&2
    "$build/seqlab" "$root/recipes/$recipe.toml" --set train.steps="$steps" --set train.dtype="$dtype" \
      --set log.sample_every=0 --out "$run" --profile $((steps - 1)) >"$run.log" 2>&1 ||
      { echo "step_profile.sh: the run failed: $run.log" >&2; exit 1; }
    runs+=("$run/profile.json")
  done
done
report "${runs[@]}"
