#!/usr/bin/env bash
# `seqlab RECIPE --profile N`: the profiled run trains the very losses of the same run without it; it prints
# the table (categories, framework, the top slots) and writes RUN/profile.json, whose categories add up to
# its wall time per step and whose steps are N (from the run's second step); a run shorter than that reports
# the steps it had; a bad value is one line and exit code 2. Structure only: no timing is asserted.
# Usage: train_profile_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"

word_corpus "$WORK/corpus.txt" 5 200 12
tiny_model_and_data "$WORK/tiny.toml" "$WORK"
cat >> "$WORK/tiny.toml" <<TOML
[train]
device = "cpu"
steps = 6
batch_size = 4
seq_len = 16
[log]
every = 1
eval_every = 6
eval_batches = 1
sample_every = 0
progress = "plain"
TOML

"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/plain" > "$WORK/plain.log" 2>&1 || { fail "plain run"; cat "$WORK/plain.log"; }
if "$SEQLAB" "$WORK/tiny.toml" --out "$WORK/profiled" --profile 3 > "$WORK/profiled.log" 2>&1; then
  pass "profiled run"
else
  fail "profiled run"; cat "$WORK/profiled.log"
fi
same_losses "--profile 3" "$WORK/plain" "$WORK/profiled"
# The GEMMs appear as gemm_kernel or inside linear_kernel (its GEMM nested); which of the two makes the
# table's top slots depends on the build's timings (a sanitizer build's differ).
for want in "profile of 3 steps" "framework" "gemm_kernel\|linear_kernel" "attention_forward_kernel" "profile.json"; do
  if grep -q -- "$want" "$WORK/profiled.log"; then pass "table shows '$want'"; else fail "table lacks '$want'"; fi
done

check_json() {  # FILE STEPS: valid JSON, STEPS steps, categories summing to the wall time, framework >= 0
  python3 - "$1" "$2" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["steps"] == int(sys.argv[2]), p["steps"]
cats = {c["name"]: c["ms_per_step"] for c in p["categories"]}
assert set(cats) >= {"gemm", "attention/variant", "norm", "elementwise", "optimizer", "memory", "bf16 stand-ins",
                     "loss/softmax/embedding", "other", "framework"}, cats
assert abs(sum(cats.values()) - p["wall_ms_per_step"]) <= 1e-3 * max(1.0, p["wall_ms_per_step"]), cats
assert p["kernel_ms_per_step"] <= p["wall_ms_per_step"] + 1e-6
assert cats["framework"] >= 0 and cats["gemm"] > 0 and cats["optimizer"] > 0
names = [s["name"] for s in p["slots"]]
assert "gemm_kernel" in names or "linear_kernel" in names, names  # linear: its GEMM nested in it
assert all(s["category"] == "gemm" for s in p["slots"] if s["name"] in ("gemm_kernel", "linear_kernel")), p["slots"]
assert abs(sum(s["ms_per_step"] for s in p["slots"]) - p["kernel_ms_per_step"]) <= 1e-3 * max(1.0, p["kernel_ms_per_step"])
PY
}
if check_json "$WORK/profiled/profile.json" 3; then pass "profile.json adds up"; else fail "profile.json"; fi

# Asked for more steps than the run has: the 5 it had (steps 2 to 6), said so.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/short" --profile 50 > "$WORK/short.log" 2>&1 || fail "short run"
if grep -q "5 of the 50 steps" "$WORK/short.log" && check_json "$WORK/short/profile.json" 5; then
  pass "a run shorter than --profile reports its steps"
else
  fail "short run report"; grep -A3 "profile of" "$WORK/short.log"
fi

for bad in 0 -1 x; do
  out="$("$SEQLAB" "$WORK/tiny.toml" --out "$WORK/bad" --profile "$bad" 2>&1)"; code=$?
  if [ $code -eq 2 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q -- "--profile"; then
    pass "--profile $bad refused in one line"
  else
    fail "--profile $bad: exit $code: $out"
  fi
done

[ "$failures" -eq 0 ] || exit 1
echo "all passed"
