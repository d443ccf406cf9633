#!/usr/bin/env bash
# Sequence parallelism at the command line (`./train R --nproc N --set parallel.sp=P`, Gloo CPU ranks): tiny
# two-layer models — GPT (learned positions), a rotary GPT with grouped KV heads, GLA, retention, linear
# attention, DeltaNet (its short convolution's halo) and a hybrid of attention and GLA — trained with SP = 2,
# DP = 2 × SP = 2 and SP = 4 log the losses of one process with the same global batch (within a relative 1e-5
# at every step, f32), the ranks end with weights identical bit for bit, a run resumes from SP = 2 onto one
# process and from one process onto DP = 2 × SP = 2 with the losses of an uninterrupted run, a rank killed with
# SIGKILL ends the job naming it, and the grid's misfits (a world size sp does not divide, a sequence that
# does not split into 2·sp chunks, a batch the data-parallel groups cannot split) are refused with exit code 2
# and one line. The f64 comparison to 1e-10 is tests/sequence_parallel_train_test.cc.
# Usage: train_sp_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 5 300 12
# Dropout 0 (the ranks draw their own dropout streams); one thread a rank.
cat > "$WORK/tiny.toml" <<TOML
[model]
d_model = 16
n_layers = 2
n_heads = 2
[data]
path = "$WORK/corpus.txt"
format = "text"
val_fraction = 0.2
cache_dir = "$WORK/cache"
[train]
device = "cpu"
steps = 5
batch_size = 4
seq_len = 32
[optim]
warmup_steps = 2
[log]
every = 1
eval_every = 3
eval_batches = 2
sample_every = 0
[checkpoint]
every = 3
[parallel]
threads = 1
TOML

# name: its --set flags, separated by ";" (the recipe's GPT by default).
declare -A MODELS=(
  [gpt]=""
  [rope_gqa]='model.positions="rope";model.n_kv_heads=1'
  [gla]='model.mixer="gla";model.gla.chunk_size=4'
  [retention]='model.mixer="retention"'
  [linear_attention]='model.mixer="linear_attention"'
  [delta_net]='model.mixer="delta_net";model.delta_net.chunk_size=2'
  [hybrid]='model.pattern="attention gla"'
)
flags() { local IFS=';'; for kv in ${MODELS[$1]}; do printf -- '--set\n%s\n' "$kv"; done; }

for model in gpt rope_gqa gla retention linear_attention delta_net hybrid; do
  mapfile -t extra < <(flags "$model")
  if ! "$SEQLAB" "$WORK/tiny.toml" "${extra[@]}" --out "$WORK/$model-1" > /dev/null 2> "$WORK/$model-1.err"; then
    fail "$model: one process"; cat "$WORK/$model-1.err"; continue
  fi
  for grid in "2 2" "4 2" "4 4"; do
    set -- $grid
    n=$1 sp=$2 name="$model --nproc $1 --set parallel.sp=$2"
    # Only GPT and GLA at every grid; the others at SP = 2 (each run costs a few seconds of CI).
    if [ "$model" != gpt ] && [ "$model" != gla ] && [ "$grid" != "2 2" ]; then continue; fi
    d="$WORK/$model-$n-$sp"
    mkdir -p "$d.w"
    if SEQLAB_TEST_WEIGHTS_DIR="$d.w" "$SEQLAB" "$WORK/tiny.toml" "${extra[@]}" --nproc "$n" --set parallel.sp="$sp" \
         --out "$d" > /dev/null 2> "$d.err"; then
      close_losses "$name: the losses of one process" "$WORK/$model-1" "$d"
      same=1
      for r in $(seq 1 $((n - 1))); do cmp -s "$d.w/rank0.bin" "$d.w/rank$r.bin" || same=0; done
      [ "$same" = 1 ] && [ -s "$d.w/rank0.bin" ] && pass "$name: every rank's weights identical bit for bit" ||
        fail "$name: the ranks' weights differ"
    else
      fail "$name"; cat "$d.err"
    fi
  done
done
grep -q '4 ranks: 2 data-parallel × 2 sequence-parallel' <("$SEQLAB" "$WORK/tiny.toml" --nproc 4 --set parallel.sp=2 \
  --set train.steps=1 --out "$WORK/banner" 2>&1) && pass "the start line names the grid" || fail "the start line"

# Resume across grids: 3 steps on one grid, the last 2 on another, against the uninterrupted one process.
for pair in "2:2 1:1" "1:1 4:2"; do
  set -- $pair
  a=(--nproc "${1%:*}" --set parallel.sp="${1#*:}") b=(--nproc "${2%:*}" --set parallel.sp="${2#*:}")
  d="$WORK/resume-${1/:/x}-${2/:/x}"
  "$SEQLAB" "$WORK/tiny.toml" "${a[@]}" --set train.steps=3 --out "$d" > /dev/null 2>&1 || fail "resume $pair: first part"
  "$SEQLAB" "$WORK/tiny.toml" "${b[@]}" --resume "$d" > /dev/null 2>&1 || fail "resume $pair: second part"
  close_losses "resumed from ${a[*]} onto ${b[*]}: the losses of an uninterrupted run" "$WORK/gpt-1" "$d"
done

# A rank killed with SIGKILL mid-run (once metrics are written): the launcher ends the job naming the rank,
# and no rank is left running.
"$SEQLAB" "$WORK/tiny.toml" --nproc 2 --set parallel.sp=2 --set train.steps=100000 --set checkpoint.every=100000 \
  --set log.eval_every=100000 --out "$WORK/killed" > /dev/null 2> "$WORK/killed.err" &
launcher=$!
for _ in $(seq 1 300); do [ -s "$WORK/killed/metrics.jsonl" ] && break; sleep 0.1; done
for pid in $(pgrep -P "$launcher"); do  # the launcher's child whose environment says SEQLAB_RANK=1
  tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx SEQLAB_RANK=1 && kill -KILL "$pid"
done
wait "$launcher"
rc=$?
sleep 0.2
left=$(pgrep -f -- "--out $WORK/killed" | wc -l)
if [ "$rc" -ne 0 ] && grep -q "rank 1 of 2 was killed by signal 9" "$WORK/killed.err" && [ "$left" -eq 0 ]; then
  pass "SIGKILL of rank 1 under parallel.sp = 2: exit $rc, $(grep -m 1 'rank 1 of 2 was killed' "$WORK/killed.err")"
else
  fail "SIGKILL of rank 1 under parallel.sp = 2: exit $rc, $left processes left"; cat "$WORK/killed.err"
fi

# The grid's misfits, refused before any rank starts: exit 2 and one line naming the keys.
expect_refusal() {  # NAME TEXT FLAGS...
  local name=$1 text=$2
  shift 2
  "$SEQLAB" "$WORK/tiny.toml" "$@" --out "$WORK/refused" > "$WORK/refused.out" 2>&1
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/refused.out")" -eq 1 ] && grep -qF "$text" "$WORK/refused.out"; then
    pass "$name: $(cat "$WORK/refused.out")"
  else
    fail "$name (exit $rc)"; cat "$WORK/refused.out"
  fi
  rm -rf "$WORK/refused"
}
expect_refusal "sp without the ranks" "parallel.sp = 2 needs a job of a multiple of 2 ranks" --set parallel.sp=2
expect_refusal "sp not dividing --nproc" "parallel.sp = 2 needs a job of a multiple of 2 ranks (groups of 2 share each sequence), and this one has --nproc 3 ranks" \
  --nproc 3 --set parallel.sp=2
expect_refusal "a sequence not in 2·sp chunks" "parallel.sp = 3 needs train.seq_len divisible by 2·sp = 6" \
  --nproc 3 --set parallel.sp=3
expect_refusal "a batch the groups cannot split" "train.batch_size = 3 does not split across 2 data-parallel groups" \
  --nproc 4 --set parallel.sp=2 --set train.batch_size=3

echo "failures: $failures"
[ "$failures" -eq 0 ]
