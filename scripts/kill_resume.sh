#!/usr/bin/env bash
# Kills a training run with SIGKILL at random moments and resumes it after each kill, then checks that
# it ended bit for bit where an uninterrupted run of the same recipe ends: the same losses at every
# step, and the same CRC32C of every weight and optimizer tensor of the final checkpoint (which the
# checks on reading hold true to the bytes). The model is large enough (about 0.5 M parameters, 5 MiB
# checkpoints written every 2 steps) that kills land inside a checkpoint write; a quarter of the kills
# come in the first half second (start-up: the lock, the removal of leftovers, the rewrite of the
# logs), the others 0 to 59 ms after the run printed its 1st to 6th step line (steps, checkpoint
# writes, evaluation). tests/train_lock_test.sh does 3
# kills of a tiny model in CI; docs/reliability.md records a run of this script.
# Usage: scripts/kill_resume.sh [KILLS (20)] [SEED (1)]   (builds build/seqlab through ./train's setup)
set -u
KILLS=${1:-20}
RANDOM=${2:-1}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/setup.sh"
seqlab_build seqlab || exit 1
SEQLAB="$SEQLAB_BUILD/seqlab"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$ROOT/tests/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 11 3000 14
cat > "$WORK/run.toml" <<TOML
[model]
d_model = 128
n_layers = 2
n_heads = 4
dropout = 0.1
positions = "rope"
[data]
path = "$WORK/corpus.txt"
format = "text"
cache_dir = "$WORK/cache"
[train]
device = "cpu"
steps = 400
batch_size = 4
seq_len = 64
[optim]
warmup_steps = 10
[log]
every = 1
eval_every = 50
eval_batches = 2
sample_every = 100
sample_tokens = 16
progress = "plain"
[checkpoint]
every = 2
TOML
newest() { ls "$1" | grep '^ckpt_.*safetensors$' | tail -n 1; }

start=$(date +%s)
"$SEQLAB" "$WORK/run.toml" --out "$WORK/straight" > /dev/null || { echo "the uninterrupted run failed"; exit 1; }
echo "uninterrupted run: $(($(date +%s) - start)) s"

inside=0 startup=0 done_early=0
steps_printed() {
  local n
  n=$(grep -c '^step ' "$WORK/out" 2> /dev/null)
  echo "${n:-0}"
}
for k in $(seq 1 "$KILLS"); do
  before=$(newest "$WORK/killed" 2> /dev/null)
  # A run killed before its first checkpoint has nothing to resume from: it starts again.
  if [ -n "$before" ]; then args=(--resume "$WORK/killed"); else args=("$WORK/run.toml" --out "$WORK/killed"); fi
: > "$WORK/out"
  "$SEQLAB" "${args[@]}" >> "$WORK/out" 2>&1 &
  pid=$!
  if [ $((RANDOM % 4)) -eq 0 ]; then
    delay=$(printf '0.%03d' $((RANDOM % 500)))  # start-up: lock, leftovers, logs, data
    moment="$delay s after the start"
  else
    # Training: once the run has printed 1 to 6 step lines, 0 to 59 ms later (a step takes tens of
    # ms and a checkpoint write about as long, every second step).
    want=$((1 + RANDOM % 6))
    while kill -0 "$pid" 2> /dev/null && [ "$(steps_printed)" -lt "$want" ]; do sleep 0.01; done
    delay=$(printf '0.%03d' $((RANDOM % 60)))
    moment="$delay s after step line $want"
  fi
  sleep "$delay"
  kill -KILL "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  rc=$?
  if [ "$rc" -ne 137 ]; then
    echo "kill $k: the run ended by itself (exit $rc)"
    done_early=$((done_early + 1))
    [ "$rc" -eq 0 ] || { cat "$WORK/out"; exit 1; }
    continue
  fi
  where="between steps"
  if ls "$WORK/killed" 2> /dev/null | grep -q '\.tmp\.'; then where="inside a write ($(ls "$WORK/killed" | grep '\.tmp\.'))"; inside=$((inside + 1)); fi
  if [ "$(steps_printed)" -eq 0 ]; then where="in start-up"; startup=$((startup + 1)); fi
  echo "kill $k ($moment): $where; newest checkpoint ${before:-none} -> $(newest "$WORK/killed" 2> /dev/null)"
done
"$SEQLAB" --resume "$WORK/killed" > "$WORK/out" 2>&1 || { cat "$WORK/out"; exit 1; }
if ls -a "$WORK/killed" | grep -q '\.tmp\.'; then echo "FAIL: temporary files left: $(ls "$WORK/killed")"; exit 1; fi
if diff <(losses "$WORK/straight") <(losses "$WORK/killed") > /dev/null && \
   diff <(tensor_sums "$WORK/straight/ckpt_0000400.safetensors") \
        <(tensor_sums "$WORK/killed/ckpt_0000400.safetensors") > /dev/null && \
   cmp -s "$WORK/straight/samples.txt" "$WORK/killed/samples.txt"; then
  echo "ok: $KILLS kills ($inside inside a checkpoint write, $startup in start-up, $done_early after the run ended)," \
       "each resumed: the same losses at all 400 steps, the same samples, and the same CRC32C of all" \
       "$(tensor_sums "$WORK/straight/ckpt_0000400.safetensors" | wc -l) tensors of the final checkpoint"
else
  echo "FAIL: the killed and resumed run differs from the uninterrupted one"
  diff <(losses "$WORK/straight") <(losses "$WORK/killed") | head
  exit 1
fi
