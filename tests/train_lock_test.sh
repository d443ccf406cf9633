#!/usr/bin/env bash
# One writer per run folder, leftovers and kills (docs/reliability.md): two runs started together into
# one folder, one refused at once naming the holder, the other's metrics whole; a second run or a
# --resume while a run trains is refused naming its pid; a lock left by a process killed with SIGKILL
# is taken over; temporary files of dead writers are removed on the next start (a live writer's kept);
# a run killed with SIGKILL at random moments (checkpoints every step, so some kills land inside a
# checkpoint write) and resumed each time ends bit for bit where an uninterrupted run ends: the same
# losses at every step and the same CRC32C of every weight and optimizer tensor.
# scripts/kill_resume.sh does the same with 20 kills of a larger model.
# Usage: train_lock_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
RANDOM=13  # a fixed sequence of kill moments
word_corpus "$WORK/corpus.txt" 6 300 12
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
steps = 40
batch_size = 2
seq_len = 16
[optim]
warmup_steps = 2
[log]
every = 1
eval_every = 20
eval_batches = 2
sample_every = 0
progress = "plain"
[checkpoint]
every = 10
TOML

# 1. Two runs into one folder, started together: one trains, the other is refused at once.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/two" --set train.seed=1 > "$WORK/one.out" 2> "$WORK/one.err" &
p1=$!
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/two" --set train.seed=2 > "$WORK/two.out" 2> "$WORK/two.err" &
p2=$!
wait $p1; rc1=$?
wait $p2; rc2=$?
if [ "$rc1" -eq 0 ] && [ "$rc2" -eq 2 ]; then winner=1 loser=two
elif [ "$rc1" -eq 2 ] && [ "$rc2" -eq 0 ]; then winner=2 loser=one
else winner=0 loser=none; fi
if [ "$winner" -ne 0 ] && grep -qF "seqlab train: $WORK/two is in use by another training process (pid " "$WORK/$loser.err" \
   && [ "$(wc -l < "$WORK/$loser.err")" -eq 1 ] && ! grep -q "^done" "$WORK/$loser.out"; then
  pass "two runs started together: one refused: $(cat "$WORK/$loser.err")"
else
  fail "two runs started together: exit codes $rc1 and $rc2"; cat "$WORK/one.err" "$WORK/two.err"
fi
if [ "$(wc -l < "$WORK/two/metrics.jsonl")" -eq 40 ] && grep -q "^seed *= $winner " "$WORK/two/recipe.toml"; then
  pass "the winner's metrics (40 lines) and recipe (seed $winner) are whole"
else
  fail "the run folder mixes the runs: $(wc -l < "$WORK/two/metrics.jsonl") metrics lines"
fi

# train_until RUN STEP ARGS...: starts seqlab ARGS with its progress lines in a pipe read here and
# returns once "step STEP/" was printed, the process still running (it blocks once the pipe is full).
train_until() {
  local run=$1 until=$2 line
  shift 2
  coproc TRAINING { exec "$SEQLAB" "$@" 2>&1; }
  pid=$TRAINING_PID
  while IFS= read -r line <&"${TRAINING[0]}"; do
    echo "$line" >> "$run.log"
    case "$line" in "step $until/"*) return 0;; esac
  done
  return 1
}
# finish: SIGKILL (or the signal given) to the coproc, the rest of its output drained, its exit code.
finish() {
  kill "-${1:-KILL}" "$pid" 2> /dev/null
  cat <&"${TRAINING[0]}" >> /dev/null
  wait "$pid" 2> /dev/null
}

# 2. A second run, and a --resume, while a run trains into the folder: refused, naming its pid.
LONG=(--set train.steps=3000 --set checkpoint.every=5)
train_until "$WORK/busy" 12 "$WORK/tiny.toml" --out "$WORK/busy" "${LONG[@]}" || fail "the busy run did not start"
holder=$pid
for args in "$WORK/tiny.toml --out $WORK/busy" "--resume $WORK/busy"; do
  # shellcheck disable=SC2086
  "$SEQLAB" $args > /dev/null 2> "$WORK/stderr"
  rc=$?
  if [ "$rc" -eq 2 ] && grep -qF "$WORK/busy is in use by another training process (pid $holder host " "$WORK/stderr"; then
    pass "'seqlab ${args/$WORK\//}' while another process trains: refused naming pid $holder"
  else
    fail "'seqlab $args' while another process trains: exit $rc: $(cat "$WORK/stderr")"
  fi
done
finish KILL 2> /dev/null
# A lock left by the killed process is taken over; temporaries of dead writers go, a live one's stay.
sh -c 'exit 0' & dead=$!
wait $dead
: > "$WORK/busy/ckpt_0000099.safetensors.tmp.$dead"
: > "$WORK/busy/notes.tmp.$$"
newest() { ls "$1" | grep '^ckpt_.*safetensors$' | tail -n 1 | sed -E 's/ckpt_0*([0-9]+)\.safetensors/\1/'; }
"$SEQLAB" --resume "$WORK/busy" --set train.steps=$(($(newest "$WORK/busy") + 2)) > /dev/null 2> "$WORK/stderr"
rc=$?
[ "$rc" -eq 0 ] && ! grep -q "pid $holder " "$WORK/busy/.lock" \
  && pass "the lock of a process killed with SIGKILL is taken over ($(cat "$WORK/busy/.lock"))" \
  || fail "stale lock: exit $rc: $(cat "$WORK/stderr")"
if [ ! -e "$WORK/busy/ckpt_0000099.safetensors.tmp.$dead" ] && [ -e "$WORK/busy/notes.tmp.$$" ] && \
   grep -qF "removed $WORK/busy/ckpt_0000099.safetensors.tmp.$dead, left behind by a process that ended while writing it" "$WORK/stderr"; then
  pass "the dead writer's temporary file removed, the live one's kept"
else
  fail "leftover temporaries: $(ls -a "$WORK/busy") / $(cat "$WORK/stderr")"
fi
printf 'pid 1 host elsewhere since 2000-01-01T00:00:00Z\n' > "$WORK/busy/.lock"  # no process holds it
"$SEQLAB" --resume "$WORK/busy" --set train.steps=$(($(newest "$WORK/busy") + 2)) > /dev/null 2>&1 && pass "a lock file nobody holds is taken" \
  || fail "a lock file nobody holds"

# 3. SIGKILL at random moments, checkpoints every step, resumed after each kill: bit for bit at the end.
KILLS=(--set train.steps=120 --set checkpoint.every=1)
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/straight" "${KILLS[@]}" > /dev/null || { echo "FAIL straight run"; exit 1; }
at=0 inside=0
for k in 1 2 3; do
  at=$((at + 2 + RANDOM % 20))
  if [ "$k" -eq 1 ]; then train_until "$WORK/killed" $at "$WORK/tiny.toml" --out "$WORK/killed" "${KILLS[@]}"
  else train_until "$WORK/killed" $at --resume "$WORK/killed"; fi || fail "kill $k: the run ended before step $at"
  sleep "0.00$((RANDOM % 10))"
  finish KILL 2> /dev/null
  ls "$WORK/killed" | grep -q '\.tmp\.' && inside=$((inside + 1))
  at=$(newest "$WORK/killed")
done
"$SEQLAB" --resume "$WORK/killed" > /dev/null 2>&1 || fail "the last resume"
if diff <(losses "$WORK/straight") <(losses "$WORK/killed") > /dev/null && \
   diff <(tensor_sums "$WORK/straight/ckpt_0000120.safetensors") <(tensor_sums "$WORK/killed/ckpt_0000120.safetensors") > /dev/null; then
  pass "3 kills with SIGKILL ($inside inside a checkpoint write), each resumed: the same losses and the same final weights and optimizer state, bit for bit"
else
  fail "killed and resumed: the run differs"; diff <(losses "$WORK/straight") <(losses "$WORK/killed") | head -5
fi
ls "$WORK/killed" | grep -q '\.tmp\.' && fail "temporary files left: $(ls "$WORK/killed")" || pass "no temporary file left"
echo "failures: $failures"
[ "$failures" -eq 0 ]
