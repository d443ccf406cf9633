#!/usr/bin/env bash
# gpt_small trains on the GPU as on the CPU: recipes/gpt_small.toml as it is (d 256, 4 layers, 4 heads,
# T 256, B 8, AdamW, 30 warm-up steps, clipping) on a small generated corpus, 50 steps four times: CPU f32
# (the reference), GPU f32, GPU bf16 (mixed precision) and CPU bf16 (the CPU's emulation, the bf16
# reference). Checked:
#   GPU f32 against CPU f32: the training loss within 1e-3 relative at every step, the validation loss too;
#   GPU bf16 against CPU f32 and against CPU bf16: the first step's loss (the forward before any update)
#     within 1e-2, every step within 5e-2, the means of each 10 steps within 3e-2, the validation loss
#     within 3e-2 (against CPU f32).
# Why bf16 is not held to 3e-2 at every step: bf16 weights, activations and gradients round at 8 bits, and
# training amplifies any perturbation, so two correct runs part by a few percent where the loss falls
# fastest. Measured on the CPU (CPU bf16 against CPU f32, this test's runs): at most 2.8e-2 at one step,
# 1.3e-2 over 10 steps, 1.6e-3 on the validation loss; with 10 warm-up steps instead of 30, 9.3e-2 at the
# step where the learning rate reaches its peak. The 10-step means and the first step catch a wrong
# kernel; the per-step bound catches a run that goes astray.
# The GPU run's checkpoints must load: resumed from step 25 on the GPU it logs the same losses bit for bit,
# and `seqlab sample` continues a prompt from it (the same text twice with one seed). Exits 77 (CTest:
# skipped) where no GPU is usable.
# Usage: train_gpu_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! "$SEQLAB" --version 2> /dev/null | grep -q 'GPU(s) usable'; then
  echo "skip: no usable GPU (seqlab --version: $("$SEQLAB" --version 2>&1 | grep -o 'no usable GPU[^;)]*' | head -n 1))"
  exit 77
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 - "$WORK/corpus.txt" <<'PY'
import random, sys
random.seed(5)
words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home", "while", "birds",
         "sang", "in", "tall", "green", "trees", "by", "river", "slowly", "quickly", "under", "sun"]
with open(sys.argv[1], "w") as f:
    for _ in range(3000):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(8, 30))) + ".\n\n")
PY
# gpt_small as it is, but on this corpus, for 50 steps, logging every step, one evaluation at the end, no
# samples while training, checkpoints at steps 25 and 50.
COMMON=(--set "data.path=\"$WORK/corpus.txt\"" --set 'data.format="text"' --set "data.cache_dir=\"$WORK/cache\""
        --set train.steps=50 --set log.every=1 --set log.eval_every=50
        --set log.eval_batches=4 --set log.sample_every=0 --set checkpoint.every=25 --set 'log.progress="plain"')
failures=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
train() {  # NAME DEVICE DTYPE [more flags]: trains into $WORK/NAME; its output goes to $WORK/NAME.log
  local name=$1 device=$2 dtype=$3
  shift 3
  if "$SEQLAB" "$ROOT/recipes/gpt_small.toml" "${COMMON[@]}" --set "train.device=\"$device\"" \
       --set "train.dtype=\"$dtype\"" "$@" --out "$WORK/$name" > "$WORK/$name.log" 2>&1; then
    pass "$name: 50 steps on $device in $dtype ($(grep -o '"tokens_per_s": [0-9.]*' "$WORK/$name/metrics.jsonl" |
      tail -n 1 | sed 's/.*: //') tokens/s at the end)"
  else
    fail "$name: training on $device in $dtype failed:"
    tail -n 5 "$WORK/$name.log"
  fi
}
# close KEY TOL RUN_A RUN_B [WINDOW [LAST_STEP]]: the KEY ("loss" or "val_loss") of RUN_B within TOL relative
# of RUN_A's at every step that logs it up to LAST_STEP, or, with WINDOW > 1, the means of each WINDOW
# consecutive steps; prints the largest relative difference and where it is.
close() {
  python3 - "$@" <<'PY'
import json, os, sys
key, tol, a, b = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
window = int(sys.argv[5]) if len(sys.argv) > 5 else 1
last = int(sys.argv[6]) if len(sys.argv) > 6 else 10**9
def read(run):
    if not os.path.exists(run + "/metrics.jsonl"):
        sys.exit(f"no {os.path.basename(run)}/metrics.jsonl: that run failed")
    with open(run + "/metrics.jsonl") as f:
        return {m["step"]: m[key] for m in map(json.loads, f) if key in m and m["step"] <= last}
ra, rb = read(a), read(b)
if not ra or sorted(ra) != sorted(rb):
    sys.exit(f"{key}: the runs log different steps: {sorted(ra)[:5]}... against {sorted(rb)[:5]}...")
steps = sorted(ra)
groups = [steps[i:i + window] for i in range(0, len(steps) - window + 1, window)]
mean = lambda r, g: sum(r[s] for s in g) / len(g)
rel = {f"{g[0]}-{g[-1]}" if window > 1 else f"{g[0]}": (mean(ra, g), mean(rb, g)) for g in groups}
rel = {k: (x, y, abs(y - x) / abs(x)) for k, (x, y) in rel.items()}
worst = max(rel, key=lambda k: rel[k][2])
bad = [k for k in rel if rel[k][2] > tol]
x, y, r = rel[worst]
what = f"{window}-step means" if window > 1 else "step"
print(f"max rel diff {r:.2e} at {what} {worst} ({x:.6f} against {y:.6f}) over {len(rel)}, tolerance {tol:g}" +
      (f"; over it at {bad[:10]}" if bad else ""))
sys.exit(1 if bad else 0)
PY
}
compare() {  # NAME KEY TOL REFERENCE_RUN RUN [WINDOW [LAST_STEP]]
  local msg name=$1
  shift
  if msg="$(close "$@" 2>&1)"; then pass "$name: $msg"; else fail "$name: $msg"; fi
}

# 1. The four runs, compared step by step.
train cpu cpu f32
train gpu cuda f32
train bf16 cuda bf16
train cpu_bf16 cpu bf16
compare "GPU f32 train loss against CPU f32" loss 1e-3 "$WORK/cpu" "$WORK/gpu"
compare "GPU f32 val loss against CPU f32" val_loss 1e-3 "$WORK/cpu" "$WORK/gpu"
for ref in cpu cpu_bf16; do
  name="GPU bf16 train loss against CPU $([ $ref = cpu ] && echo f32 || echo bf16)"
  compare "$name, first step" loss 1e-2 "$WORK/$ref" "$WORK/bf16" 1 1
  compare "$name, every step" loss 5e-2 "$WORK/$ref" "$WORK/bf16"
  compare "$name, 10-step means" loss 3e-2 "$WORK/$ref" "$WORK/bf16" 10
done
compare "GPU bf16 val loss against CPU f32" val_loss 3e-2 "$WORK/cpu" "$WORK/bf16"

# 2. The GPU run's checkpoint at step 25, resumed on the GPU: the same losses, bit for bit.
if [ -f "$WORK/gpu/ckpt_0000025.safetensors" ]; then
  cp -r "$WORK/gpu" "$WORK/resumed"
  rm "$WORK/resumed/ckpt_0000050.safetensors"
  if "$SEQLAB" --resume "$WORK/resumed" > "$WORK/resumed.log" 2>&1; then
    strip() { sed -E 's/, "(tokens_per_s|mfu|elapsed_s)": [0-9.e+-]+//g' "$1/metrics.jsonl"; }
    if diff <(strip "$WORK/gpu") <(strip "$WORK/resumed") > /dev/null; then
      pass "GPU run resumed from its step-25 checkpoint: identical losses at steps 26-50"
    else
      fail "GPU run resumed from step 25: losses differ"; diff <(strip "$WORK/gpu") <(strip "$WORK/resumed") | head -4
    fi
  else
    fail "resuming the GPU run from step 25:"; tail -n 5 "$WORK/resumed.log"
  fi
else
  fail "the GPU run left no checkpoint at step 25"
fi

# 3. `seqlab sample` from the GPU runs' newest checkpoints.
for run in gpu bf16; do
  [ -d "$WORK/$run" ] || continue
  a="$("$SEQLAB" sample "$WORK/$run" --prompt "the cat" --tokens 24 --seed 7 2> "$WORK/sample.err")"
  rc=$?
  b="$("$SEQLAB" sample "$WORK/$run" --prompt "the cat" --tokens 24 --seed 7 2> /dev/null)"
  if [ "$rc" -eq 0 ] && [[ "$a" == "the cat"* ]] && [ "${#a}" -gt 7 ] && [ "$a" = "$b" ]; then
    pass "sample from the $run run's checkpoint: $(LC_ALL=C tr -c '[:print:]' '?' <<<"$a" | cut -c 1-40)"
  else
    fail "sample from the $run run's checkpoint (exit $rc): $a $(cat "$WORK/sample.err")"
  fi
done
echo "failures: $failures"
[ "$failures" -eq 0 ]
