#!/usr/bin/env bash
# Exact resume, at the command line: a short GPT run (rotary positions, dropout on) straight through, the same run resumed from a
# middle checkpoint (in f32 and in bf16 mixed precision), one killed with SIGKILL between checkpoints and one stopped with SIGTERM must log
# identical losses at every step. A truncated checkpoint and bad arguments are refused with exit code 2
# and one line.
# Usage: train_resume_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 3 400 12
cat > "$WORK/tiny.toml" <<TOML
[model]
d_model = 16
n_layers = 1
n_heads = 2
dropout = 0.1
positions = "rope"
[data]
path = "$WORK/corpus.txt"
format = "text"
val_fraction = 0.2
cache_dir = "$WORK/cache"
[train]
device = "cpu"          # these tests check the CPU path on any machine
steps = 6
batch_size = 2
seq_len = 16
[optim]
warmup_steps = 2
[log]
every = 1
eval_every = 3
eval_batches = 2
sample_every = 3
sample_tokens = 8
[checkpoint]
every = 3
TOML

# 1. Resume from the middle checkpoint.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/a" > /dev/null || { echo "FAIL straight run"; exit 1; }
cp -r "$WORK/a" "$WORK/b"
rm "$WORK/b/ckpt_0000006.safetensors"
"$SEQLAB" --resume "$WORK/b" > /dev/null || { echo "FAIL resumed run"; exit 1; }
[ "$(wc -l < "$WORK/a/metrics.jsonl")" -eq 6 ] || fail "straight run logged $(wc -l < "$WORK/a/metrics.jsonl") lines, not 6"
same_losses "resume from step 3 (recipe taken from the run directory)" "$WORK/a" "$WORK/b"
cmp -s "$WORK/a/samples.txt" "$WORK/b/samples.txt" && pass "resumed run writes the same samples" || fail "samples differ"
grep -q '"val_loss"' "$WORK/a/metrics.jsonl" && pass "evaluation logged" || fail "no val_loss"
grep -q '^### step 6' "$WORK/a/samples.txt" && pass "sample written" || fail "no sample at step 6"
[ -f "$WORK/a/recipe.toml" ] && pass "resolved recipe written" || fail "no recipe.toml"
"$SEQLAB" --resume "$WORK/a" | grep -q "already complete" && pass "resuming a finished run does nothing" || fail "finished run"

# 1b. Mixed precision (bf16 weights and activations, f32 masters; GEMMs on the CPU's bf16 instructions where it has them), with two
# micro-batches a step summed in f32, resumes exactly too: its checkpoints hold the f32 master weights.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/m" --set 'train.dtype="bf16"' --set train.grad_accum=2 2> /dev/null \
  > /dev/null || fail "bf16 run"
cp -r "$WORK/m" "$WORK/m2"
rm "$WORK/m2/ckpt_0000006.safetensors"
"$SEQLAB" --resume "$WORK/m2" > /dev/null || fail "resumed bf16 run"
same_losses "bf16 resumed from step 3" "$WORK/m" "$WORK/m2"
python3 - "$WORK/m/ckpt_0000006.safetensors" <<'PY' && pass "bf16 checkpoint weights are f32" || fail "bf16 checkpoint dtypes"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
sys.exit(0 if dtypes <= {"F32", "I64"} and "F32" in dtypes else 1)
PY

# 2. Killed with SIGKILL between checkpoints, then resumed.
LONG=(--set train.steps=1500 --set checkpoint.every=10 --set log.eval_every=1000 --set log.sample_every=0
      --set log.progress=plain)
"$SEQLAB" "$WORK/tiny.toml" "${LONG[@]}" --out "$WORK/long" > /dev/null || { echo "FAIL long run"; exit 1; }
# kill_after SIGNAL RUN: starts the long run into RUN with its progress lines (one per step) going into
# a pipe read here, and sends SIGNAL once step 25 has been printed. The run cannot finish first: once
# this script stops reading, the pipe fills (64 KiB, about 1000 lines of ~65 bytes) and blocks the run
# hundreds of steps before its end. After the signal the rest is drained into RUN.log, so a run that saves a
# checkpoint and exits can do so.
kill_after() {
  local line
  coproc TRAINING { exec "$SEQLAB" "$WORK/tiny.toml" "${LONG[@]}" --out "$2" 2>&1; }
  local pid=$TRAINING_PID
  while IFS= read -r line <&"${TRAINING[0]}"; do
    echo "$line" >> "$2.log"
    case "$line" in "step 25/"*) break;; esac
  done
  kill "-$1" "$pid" 2> /dev/null
  cat <&"${TRAINING[0]}" >> "$2.log"
  wait "$pid" 2> /dev/null
}
kill_after KILL "$WORK/killed" 2> /dev/null  # (no "Killed" job notice)
rc=$?
if [ "$rc" -eq 137 ] && [ ! -f "$WORK/killed/ckpt_0001500.safetensors" ]; then
  pass "SIGKILL ended the run at $(tail -n 1 "$WORK/killed/metrics.jsonl" | cut -d, -f1) }"
  "$SEQLAB" --resume "$WORK/killed" > /dev/null || fail "resume after SIGKILL"
  same_losses "killed with SIGKILL and resumed" "$WORK/long" "$WORK/killed"
else
  fail "SIGKILL: exit code $rc (the run may have finished before the kill)"
fi

# 3. Stopped with SIGTERM: a checkpoint at the step it stopped, exit code 128 + 15.
kill_after TERM "$WORK/stopped"
rc=$?
last=$(ls "$WORK/stopped" | grep -c '^ckpt_')
if [ "$rc" -eq 143 ] && grep -q "continue with --resume" "$WORK/stopped.log" && \
   [ "$(tail -n 1 "$WORK/stopped/metrics.jsonl" | sed -E 's/^\{"step": ([0-9]+),.*/\1/')" = \
     "$(ls "$WORK/stopped" | grep '^ckpt_' | tail -n 1 | sed -E 's/ckpt_0*([0-9]+)\.safetensors/\1/')" ]; then
  pass "SIGTERM saved a checkpoint at the last step and exited with 143 ($last checkpoints kept)"
  "$SEQLAB" --resume "$WORK/stopped" > /dev/null || fail "resume after SIGTERM"
  same_losses "stopped with SIGTERM and resumed" "$WORK/long" "$WORK/stopped"
else
  fail "SIGTERM: exit code $rc"; cat "$WORK/stopped.log"
fi

# 4. A truncated checkpoint and bad arguments: exit code 2, one line.
cp -r "$WORK/b" "$WORK/truncated"
newest=$(ls "$WORK/truncated"/ckpt_* | tail -n 1)
head -c 3000 "$newest" > "$WORK/part" && mv "$WORK/part" "$newest"
mkdir -p "$WORK/empty"
expect_usage_error() {  # NAME WANT ARGS...
  local name=$1 want=$2
  shift 2
  "$SEQLAB" "$@" > /dev/null 2> "$WORK/stderr"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/stderr")" -eq 1 ] && grep -qF -- "$want" "$WORK/stderr"; then
    pass "$name: $(cat "$WORK/stderr")"
  else
    fail "$name: exit $rc: $(cat "$WORK/stderr")"
  fi
}
expect_usage_error "truncated checkpoint" "ckpt_0000006.safetensors" --resume "$WORK/truncated"
expect_usage_error "negative steps" "train.steps must be an integer ≥ 1" "$WORK/tiny.toml" --set train.steps=-1
expect_usage_error "unknown flag" "unknown flag '--frobnicate' (see seqlab --help)" "$WORK/tiny.toml" --frobnicate
expect_usage_error "no checkpoint" "not a run directory" --resume "$WORK/empty"
expect_usage_error "fresh run over an old one" "already holds checkpoints" "$WORK/tiny.toml" --out "$WORK/a"
expect_usage_error "--out with --resume" "give one" "$WORK/tiny.toml" --out "$WORK/x" --resume "$WORK/a"
if ! nvidia-smi -L > /dev/null 2>&1; then  # only where no GPU is usable
  expect_usage_error "train.device = cuda without a GPU" "no GPU is usable here" "$WORK/tiny.toml" --out "$WORK/g" \
    --set train.device=cuda
fi
echo "failures: $failures"
[ "$failures" -eq 0 ]
