#!/usr/bin/env bash
# Training faults at the command line (docs/reliability.md, "Training faults" and "Checked
# checkpoints"): a step that is not finite under both train.on_nonfinite policies ends with exit code 3
# and a checkpoint from before it; 16 flipped bytes in a checkpoint's data are refused by resume and
# sample, naming the file, the tensor and the older intact checkpoint, which --checkpoint then resumes
# bit for bit; a checkpoint write that fails (an injected file-size limit) keeps the previous checkpoint
# and ends with a clear error; a token id past the vocabulary is refused when the shards open; an error after a trained step saves it first; sizes that do not
# fit are refused before anything is allocated, naming the key; --out naming a file or a folder that
# cannot be created, and `--resume --set k=v`, are user errors.
# Usage: train_faults_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 4 300 12
cat > "$WORK/tiny.toml" <<TOML
[model]
d_model = 16
n_layers = 1
n_heads = 2
dropout = 0.1
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
warmup_steps = 1
[log]
every = 1
eval_every = 3
eval_batches = 2
sample_every = 0
progress = "plain"
[checkpoint]
every = 3
TOML
# expect RC NAME WANT ARGS...: seqlab ARGS exits with RC and one line on stderr containing WANT.
expect() {
  local want_rc=$1 name=$2 want=$3
  shift 3
  "$SEQLAB" "$@" > "$WORK/stdout" 2> "$WORK/stderr"
  local rc=$?
  if [ "$rc" -eq "$want_rc" ] && [ "$(wc -l < "$WORK/stderr")" -eq 1 ] && grep -qF -- "$want" "$WORK/stderr"; then
    pass "$name: $(cat "$WORK/stderr")"
  else
    fail "$name: exit $rc (wanted $want_rc): $(cat "$WORK/stderr")"
  fi
}

"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/a" > /dev/null || { echo "FAIL straight run"; exit 1; }

# 1. A checkpoint with 16 bytes flipped inside a tensor's data (the header intact).
cp -r "$WORK/a" "$WORK/flip"
python3 - "$WORK/flip/ckpt_0000006.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
begin = 8 + n + json.loads(data[8:8 + n])["blocks.0.mlp.fc.weight"]["data_offsets"][0] + 64
data[begin:begin + 16] = bytes(b ^ 0xFF for b in data[begin:begin + 16])
open(path, "wb").write(data)
PY
DAMAGE="flip/ckpt_0000006.safetensors: damaged: tensor \"blocks.0.mlp.fc.weight\" fails its CRC32C check"
OLDER="the newest older checkpoint that passes its checks is $WORK/flip/ckpt_0000003.safetensors"
expect 2 "resume refuses a flipped checkpoint" "$DAMAGE" --resume "$WORK/flip" --set train.steps=9
grep -qF "$OLDER" "$WORK/stderr" && pass "... and names the older intact checkpoint" || fail "no older checkpoint named"
expect 2 "sample refuses it too" "$DAMAGE" sample "$WORK/flip" --tokens 4
[ -f "$WORK/flip/ckpt_0000003.safetensors" ] && [ "$(ls "$WORK/flip" | grep -c '^ckpt_')" -eq 2 ] \
  && pass "no checkpoint was deleted or written" || fail "checkpoints changed: $(ls "$WORK/flip")"
"$SEQLAB" --resume "$WORK/flip" --checkpoint "$WORK/flip/ckpt_0000003.safetensors" > /dev/null 2> "$WORK/stderr" \
  || fail "resume from the older checkpoint: $(cat "$WORK/stderr")"
grep -qF "set aside $WORK/flip/ckpt_0000006.safetensors.abandoned" "$WORK/stderr" \
  && pass "the damaged later checkpoint was set aside" || fail "not set aside: $(cat "$WORK/stderr")"
same_losses "resumed with --checkpoint from the intact one" "$WORK/a" "$WORK/flip"
"$SEQLAB" sample "$WORK/flip" --tokens 4 > /dev/null 2> "$WORK/stderr" && [ ! -s "$WORK/stderr" ] \
  && pass "the resumed run's new checkpoint samples" || fail "sample after the resume: $(cat "$WORK/stderr")"

# 2. A checkpoint write that fails: the file-size limit (SIGXFSZ ignored: write returns EFBIG) lets the
# logs through and stops the checkpoint, as a full disk would.
cp -r "$WORK/a" "$WORK/full"
rm "$WORK/full/ckpt_0000006.safetensors"
( trap '' XFSZ; ulimit -f 64; exec "$SEQLAB" --resume "$WORK/full" ) > /dev/null 2> "$WORK/stderr"
rc=$?
if [ "$rc" -eq 2 ] && grep -qF "the checkpoint of step 6 was not saved: $WORK/full/ckpt_0000006.safetensors: write failed (File too large); the checkpoints saved before are kept (the newest: $WORK/full/ckpt_0000003.safetensors)" "$WORK/stderr"; then
  pass "a failed checkpoint write: exit 2, $(cat "$WORK/stderr")"
else
  fail "failed checkpoint write: exit $rc: $(cat "$WORK/stderr")"
fi
ls "$WORK/full" | grep -q '\.tmp' && fail "a temporary file was left: $(ls "$WORK/full")" || pass "no temporary file left"
"$SEQLAB" --resume "$WORK/full" > /dev/null || fail "resume after the failed write"
same_losses "resumed after the failed write" "$WORK/a" "$WORK/full"

# 3. Non-finite steps: optim.lr = 1e30 makes the second step's loss NaN.
HUGE=(--set optim.lr=1e30 --set train.steps=8 --set checkpoint.every=100)
expect 3 "on_nonfinite = stop" "step 2: the loss is nan and the gradient of " "$WORK/tiny.toml" --out "$WORK/stop" \
  "${HUGE[@]}"
grep -qF "stopped without applying it (train.on_nonfinite = \"stop\"): $WORK/stop/ckpt_0000001.safetensors holds the weights from before this step" "$WORK/stderr" \
  && [ "$(ls "$WORK/stop" | grep '^ckpt_')" = "ckpt_0000001.safetensors" ] \
  && pass "... with the checkpoint of step 1, from before it" || fail "stop: $(ls "$WORK/stop")"
"$SEQLAB" --resume "$WORK/stop" --set optim.lr=1e-3 > /dev/null 2>&1
[ $? -eq 3 ] && pass "its resume (weights of 1e29) stops again, exit 3" || fail "resume of the stopped run"
expect 3 "on_nonfinite = skip, max_skipped = 3" "step 4: the loss is nan" "$WORK/tiny.toml" --out "$WORK/skip" \
  "${HUGE[@]}" --set train.on_nonfinite=skip --set train.max_skipped=3
if [ "$(grep -c '"skipped"' "$WORK/skip/metrics.jsonl")" -eq 3 ] && \
   grep -qF '{"step": 4, "skipped": 3, "nonfinite": "' "$WORK/skip/metrics.jsonl" && \
   [ -f "$WORK/skip/ckpt_0000004.safetensors" ]; then
  pass "skip: three skipped updates counted in metrics.jsonl, then a checkpoint and exit 3"
else
  fail "skip: $(cat "$WORK/skip/metrics.jsonl")"
fi

# 4. A token id past the vocabulary in a val shard: refused when the shards are opened, before any step,
# naming the shard. An error after a trained step (here the disk refusing metrics.jsonl, which is
# /dev/full) saves that step's checkpoint before it ends the run.
cp -r "$WORK/cache/"* "$WORK/shards"
python3 - "$WORK/shards/val_000000.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1024)                      # the first token, after the 256-int32 header
    f.write(b"\xff\xff")
PY
expect 2 "a val shard holding an id past the vocabulary" \
  "$WORK/shards/val_000000.bin: token id 65535 at position 0 is outside the vocabulary of 275 ids" \
  "$WORK/tiny.toml" --out "$WORK/badval" --set data.source=shards --set "data.path=\"$WORK/shards\""
ls "$WORK/badval" 2> /dev/null | grep -q '^ckpt_' && fail "... a checkpoint was written" || pass "... before any step"
mkdir -p "$WORK/logerr"
ln -s /dev/full "$WORK/logerr/metrics.jsonl"
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/logerr" --set checkpoint.every=0 > /dev/null 2> "$WORK/stderr"
rc=$?
if [ "$rc" -eq 2 ] && grep -qF "step 1 was trained: $WORK/logerr/ckpt_0000001.safetensors saved before the error below" "$WORK/stderr" \
   && grep -qF "metrics.jsonl" "$WORK/stderr" && [ -f "$WORK/logerr/ckpt_0000001.safetensors" ]; then
  pass "an error after a trained step (metrics.jsonl on a full disk): its checkpoint saved, exit 2"
else
  fail "error after a trained step: exit $rc: $(cat "$WORK/stderr")"
fi

# 5. Sizes that cannot fit: refused before anything is allocated (at once, in little memory: the peak
# resident size of the refused run stays within 64 MiB of a one-step run of the tiny recipe, which
# holds the same libraries; the refused models would need tens of GiB and more).
# peak_kib ARGS...: runs seqlab ARGS (stdout dropped, stderr to $WORK/stderr), prints its peak RSS in KiB
# and exits with its exit code.
peak_kib() {
  python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], "w"))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(r.returncode)' "$WORK/stderr" "$SEQLAB" "$@"
}
base=$(peak_kib "$WORK/tiny.toml" --out "$WORK/one_step" --set train.steps=1 --set optim.warmup_steps=0)
for kv in model.d_model=1000000000 model.vocab_size=1000000000 model.d_ff=999999999; do
  key=${kv%%=*}
  peak=$(peak_kib "$WORK/tiny.toml" --out "$WORK/big" --set "$kv")
  rc=$?
  if [ "$rc" -eq 2 ] && grep -qF "$key = ${kv#*=} makes the model too big" "$WORK/stderr" && \
     [ "$peak" -lt $((base + 65536)) ]; then
    pass "$kv refused (peak memory $peak KiB, a one-step run $base KiB): $(head -n 1 "$WORK/stderr")"
  else
    fail "$kv: exit $rc, peak $peak KiB (a one-step run $base KiB), $(cat "$WORK/stderr")"
  fi
done
expect 2 "n_layers = 100000 of a d_model = 256 model" "model.n_layers = 100000 makes the model too big" \
  "$WORK/tiny.toml" --out "$WORK/big" --set model.d_model=256 --set model.n_layers=100000

# 6. The command line and the run folder.
expect 2 "--out names a file" "$WORK/corpus.txt: exists and is not a folder" "$WORK/tiny.toml" --out "$WORK/corpus.txt"
expect 2 "--out cannot be created" "$WORK/corpus.txt/sub: cannot create the run folder" "$WORK/tiny.toml" \
  --out "$WORK/corpus.txt/sub"
expect 2 "--resume --set k=v" "--resume needs a value before --set" --resume --set train.steps=5
expect 2 "--checkpoint without --resume" "--checkpoint FILE goes with --resume" "$WORK/tiny.toml" --checkpoint x
echo "failures: $failures"
[ "$failures" -eq 0 ]
