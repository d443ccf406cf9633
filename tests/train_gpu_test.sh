#!/usr/bin/env bash
# gpt_small trains on the GPU as on the CPU: recipes/gpt_small.toml (d 256, 4 layers, 4 heads, T 256, B 8,
# AdamW with warm-up and clipping) on a small generated corpus, 50 steps four times: CPU f32 (the
# reference), GPU f32, GPU bf16 (mixed precision) and CPU bf16 (the CPU's emulation, the bf16 reference).
# At every step the training loss of GPU f32 must be within 1e-3 relative of the CPU's, and GPU bf16 within
# 3e-2 of CPU f32 (bf16 weights and activations keep 8 bits of mantissa) and of CPU bf16; so must the
# validation loss at step 50. The GPU run's checkpoints must load: resumed from step
# 25 on the GPU it logs the same losses bit for bit, and `seqlab sample` continues a prompt from it (the
# same text twice with one seed). Exits 77 (CTest: skipped) where no GPU is usable.
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
        --set train.steps=50 --set optim.warmup_steps=10 --set log.every=1 --set log.eval_every=50
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
# close KEY TOL RUN_A RUN_B: the KEY ("loss" or "val_loss") of RUN_B within TOL relative of RUN_A's at every
# step that logs it; prints the largest relative difference and where it is.
close() {
  python3 - "$@" <<'PY'
import json, os, sys
key, tol, a, b = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
def read(run):
    if not os.path.exists(run + "/metrics.jsonl"):
        sys.exit(f"no {os.path.basename(run)}/metrics.jsonl: that run failed")
    with open(run + "/metrics.jsonl") as f:
        return {m["step"]: m[key] for m in map(json.loads, f) if key in m}
ra, rb = read(a), read(b)
if not ra or sorted(ra) != sorted(rb):
    sys.exit(f"{key}: the runs log different steps: {sorted(ra)[:5]}... against {sorted(rb)[:5]}...")
rel = {s: abs(rb[s] - ra[s]) / abs(ra[s]) for s in ra}
worst = max(rel, key=rel.get)
bad = [s for s in sorted(rel) if rel[s] > tol]
print(f"max rel diff {rel[worst]:.2e} at step {worst} ({ra[worst]:.6f} against {rb[worst]:.6f}) over "
      f"{len(rel)} step(s), tolerance {tol:g}" + (f"; over it at steps {bad[:10]}" if bad else ""))
sys.exit(1 if bad else 0)
PY
}
compare() {  # NAME KEY TOL REFERENCE_RUN RUN
  local msg
  if msg="$(close "$2" "$3" "$WORK/$4" "$WORK/$5" 2>&1)"; then pass "$1: $msg"; else fail "$1: $msg"; fi
}

# 1. The four runs, compared step by step.
train cpu cpu f32
train gpu cuda f32
train bf16 cuda bf16
train cpu_bf16 cpu bf16
compare "GPU f32 train loss against CPU f32" loss 1e-3 cpu gpu
compare "GPU f32 val loss against CPU f32" val_loss 1e-3 cpu gpu
compare "GPU bf16 train loss against CPU f32" loss 3e-2 cpu bf16
compare "GPU bf16 val loss against CPU f32" val_loss 3e-2 cpu bf16
compare "GPU bf16 train loss against CPU bf16" loss 3e-2 cpu_bf16 bf16

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
