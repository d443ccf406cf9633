#!/usr/bin/env bash
# Data parallelism at the command line (`./train R --nproc N`, Gloo CPU ranks): tiny GPT and GLA models
# trained by 2 and 4 ranks, and a GLA model with an MoE block and a shared attention block by 2, log the
# losses of one process (within a relative 1e-5) at every step (the MoE model its aux losses and drops
# too), the ranks end with weights identical bit for bit, a run resumes across world sizes (1 -> 2,
# 2 -> 1) with the losses of an uninterrupted run, a rank killed with SIGKILL ends the job naming it (no
# rank left running), SIGINT to the launcher saves a checkpoint and exits 130 like one process, two
# launchers (--nnodes 2) on this machine train as one job (through a shared folder, and through a Redis
# server where redis-server is installed), and bad --nproc/--nnodes/--node-rank/--rendezvous values
# and a batch size the ranks cannot split are refused with exit code 2 and one line.
# Usage: train_dp_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 5 300 12
# Dropout 0: the ranks draw dropout from their own streams (docs/distributed.md), which one process
# cannot reproduce. One thread a rank: 4 ranks share this machine's cores.
cat > "$WORK/tiny.toml" <<TOML
[model]
d_model = 16
n_layers = 1
n_heads = 2
[data]
path = "$WORK/corpus.txt"
format = "text"
val_fraction = 0.2
cache_dir = "$WORK/cache"
[train]
device = "cpu"
steps = 6
batch_size = 4
seq_len = 16
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


# 1 and 2. GPT and GLA: 2 and 4 ranks against one process; every rank's final weights bit for bit.
for model in gpt gla; do
  extra=()
  [ "$model" = gla ] && extra=(--set 'model.mixer="gla"')
  "$SEQLAB" "$WORK/tiny.toml" "${extra[@]}" --out "$WORK/$model-1" > /dev/null || fail "$model: one process"
  for n in 2 4; do
    mkdir -p "$WORK/w-$model-$n"
    SEQLAB_TEST_WEIGHTS_DIR="$WORK/w-$model-$n" "$SEQLAB" "$WORK/tiny.toml" "${extra[@]}" --nproc "$n" \
      --out "$WORK/$model-$n" > /dev/null 2> "$WORK/$model-$n.err" || { fail "$model: --nproc $n"; cat "$WORK/$model-$n.err"; }
    close_losses "$model --nproc $n: the losses of one process" "$WORK/$model-1" "$WORK/$model-$n"
    same=1
    for r in $(seq 1 $((n - 1))); do
      [ -s "$WORK/w-$model-$n/rank0.bin" ] && cmp -s "$WORK/w-$model-$n/rank0.bin" "$WORK/w-$model-$n/rank$r.bin" || same=0
    done
    [ "$same" = 1 ] && pass "$model --nproc $n: every rank's weights identical bit for bit ($(stat -c %s "$WORK/w-$model-$n/rank0.bin") bytes)" \
      || fail "$model --nproc $n: the ranks' weights differ"
  done
done
# With two micro-batches a step (train.grad_accum = 2): each rank's mean over its micro-batches, then the
# average over the ranks, is the one process's mean.
ACCUM=(--set train.grad_accum=2 --set log.eval_every=6)
"$SEQLAB" "$WORK/tiny.toml" "${ACCUM[@]}" --out "$WORK/accum-1" > /dev/null || fail "grad_accum 2: one process"
"$SEQLAB" "$WORK/tiny.toml" "${ACCUM[@]}" --nproc 2 --out "$WORK/accum-2" > /dev/null 2>&1 || fail "grad_accum 2: --nproc 2"
close_losses "gpt --nproc 2, train.grad_accum = 2: the losses of one process" "$WORK/accum-1" "$WORK/accum-2"
# The mixture-of-experts FFN (capacity binding: 0.5) and Zamba's shared attention block: the ranks route
# the whole batch together, so their losses (aux loss included), drops and weights are one process's
# (docs/hybrids.md).
MOE=(--set 'model.pattern="gla:moe gla"' --set model.n_layers=2 --set model.moe.experts=4
     --set model.moe.capacity_factor=0.5 --set model.shared_attention_every=2)
"$SEQLAB" "$WORK/tiny.toml" "${MOE[@]}" --out "$WORK/moe-1" > /dev/null || fail "moe: one process"
mkdir -p "$WORK/w-moe"
SEQLAB_TEST_WEIGHTS_DIR="$WORK/w-moe" "$SEQLAB" "$WORK/tiny.toml" "${MOE[@]}" --nproc 2 --out "$WORK/moe-2" \
  > /dev/null 2> "$WORK/moe-2.err" || { fail "moe: --nproc 2"; cat "$WORK/moe-2.err"; }
close_losses "moe --nproc 2: the losses of one process" "$WORK/moe-1" "$WORK/moe-2"
if python3 - "$WORK/moe-1/metrics.jsonl" "$WORK/moe-2/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert any(x["moe_dropped"] > 0 for x in a), "no token dropped"
for x, y in zip(a, b):
    for k in ("aux_loss", "moe_dropped"):
        assert abs(x[k] - y[k]) <= 1e-6 * max(abs(x[k]), 1e-12), (x["step"], k, x[k], y[k])
PY
then pass "moe --nproc 2: aux_loss and moe_dropped of one process"; else fail "moe --nproc 2: aux_loss or moe_dropped differ"; fi
cmp -s "$WORK/w-moe/rank0.bin" "$WORK/w-moe/rank1.bin" && pass "moe --nproc 2: the ranks' weights identical bit for bit" \
  || fail "moe --nproc 2: the ranks' weights differ"
[ ! -e "$WORK/gpt-2/.rendezvous" ] && pass "the rendezvous folder is removed" || fail "rendezvous folder left behind"
# Rank 0's stderr comes through as it is; every other rank's lines are prefixed "[rank R] " (each rank
# says once that bf16 widens its GEMMs where the CPU has no bf16 instructions, forced here).
SEQLAB_CPU_BF16_GEMM=widened "$SEQLAB" "$WORK/tiny.toml" --nproc 2 --set train.steps=1 --set optim.warmup_steps=1 \
  --set 'train.dtype="bf16"' --out "$WORK/prefix" > /dev/null 2> "$WORK/prefix.err" || fail "bf16 --nproc 2"
if grep -q '^seqlab: train.dtype = "bf16" on this CPU widens its GEMMs' "$WORK/prefix.err" && \
   grep -q '^\[rank 1\] seqlab: train.dtype = "bf16" on this CPU widens its GEMMs' "$WORK/prefix.err"; then
  pass "rank 1's stderr prefixed [rank 1], rank 0's as it is"
else
  fail "stderr prefixes"; cat "$WORK/prefix.err"
fi

# 3. Resume across world sizes: the uninterrupted one-process run gpt-1 against runs whose first 3
# steps ran on one world size and the last 3 on another.
for pair in "1 2" "2 1"; do
  set -- $pair
  d="$WORK/resume-$1-$2"
  "$SEQLAB" "$WORK/tiny.toml" --nproc "$1" --set train.steps=3 --out "$d" > /dev/null 2>&1 || fail "resume $1 -> $2: first part"
  "$SEQLAB" "$WORK/tiny.toml" --nproc "$2" --resume "$d" > /dev/null 2>&1 || fail "resume $1 -> $2: second part"
  close_losses "resumed from $1 to $2 ranks: the losses of an uninterrupted run" "$WORK/gpt-1" "$d"
done

# 3b. Two machines, simulated on this one: two launchers of 2 ranks each (--nnodes 2 --node-rank 0|1)
# meeting through a shared --rendezvous folder; machine 1 writes nothing into the run folder.
"$SEQLAB" "$WORK/tiny.toml" --nproc 2 --nnodes 2 --node-rank 1 --rendezvous "$WORK/rdv" --out "$WORK/nodes" \
  > "$WORK/node1.out" 2> "$WORK/node1.err" &
node1=$!
"$SEQLAB" "$WORK/tiny.toml" --nproc 2 --nnodes 2 --node-rank 0 --rendezvous "$WORK/rdv" --out "$WORK/nodes" \
  > /dev/null 2> "$WORK/node0.err" || { fail "--nnodes 2: machine 0"; cat "$WORK/node0.err"; }
wait "$node1" || { fail "--nnodes 2: machine 1"; cat "$WORK/node1.err"; }
close_losses "--nnodes 2 × --nproc 2: the losses of one process" "$WORK/gpt-1" "$WORK/nodes"
[ ! -s "$WORK/node1.out" ] && [ ! -e "$WORK/rdv" ] && pass "machine 1 printed nothing; machine 0 removed the rendezvous folder" \
  || fail "--nnodes 2: machine 1's output or the rendezvous folder"

# 3c. The same through a Redis server (Gloo's Redis store), where redis-server is installed: a private
# server on a port of its own, ended with the test.
if command -v redis-server > /dev/null; then
  port=$((20000 + $$ % 20000))
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no > "$WORK/redis.log" 2>&1 &
  redis=$!
  trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"; kill "$redis" 2> /dev/null' EXIT
  for _ in $(seq 50); do grep -q "Ready to accept" "$WORK/redis.log" && break; sleep 0.1; done
  address="redis://127.0.0.1:$port/job-$$"
  "$SEQLAB" "$WORK/tiny.toml" --nnodes 2 --node-rank 1 --rendezvous "$address" --out "$WORK/redis-run" \
    > /dev/null 2> "$WORK/redis1.err" &
  node1=$!
  "$SEQLAB" "$WORK/tiny.toml" --nnodes 2 --node-rank 0 --rendezvous "$address" --out "$WORK/redis-run" \
    > /dev/null 2> "$WORK/redis0.err" || { fail "--rendezvous redis://: machine 0"; cat "$WORK/redis0.err"; }
  wait "$node1" || { fail "--rendezvous redis://: machine 1"; cat "$WORK/redis1.err"; }
  close_losses "--nnodes 2 through redis://: the losses of one process" "$WORK/gpt-1" "$WORK/redis-run"
  kill "$redis" 2> /dev/null
  wait "$redis" 2> /dev/null
else
  echo "skip --rendezvous redis:// (no redis-server here)"
fi

# 4 and 5: long runs stopped from outside. run_until RUN: starts a 3000-step run of 2 ranks into RUN (its
# own unique folder name) with progress lines read here, until step 5 has been printed; LAUNCHER is its pid.
LONG=(--set train.steps=3000 --set checkpoint.every=1000 --set log.eval_every=1000 --set log.progress=plain)
run_until() {
  local line
  coproc TRAINING { exec "$SEQLAB" "$WORK/tiny.toml" "${LONG[@]}" --nproc 2 --out "$1" 2>&1; }
  LAUNCHER=$TRAINING_PID
  exec {OUT_FD}<&"${TRAINING[0]}"
  while IFS= read -r line <&$OUT_FD; do
    echo "$line" >> "$1.log"
    case "$line" in "step 5/"*) break;; esac
  done
}
finish_run() { cat <&$OUT_FD >> "$1.log"; wait "$LAUNCHER" 2> /dev/null; }

# 4. Rank 1 killed with SIGKILL: the launcher names it, exits non-zero, and leaves no rank running.
run_until "$WORK/dp-killed-rank"
for pid in $(pgrep -P "$LAUNCHER"); do  # the launcher's child whose environment says SEQLAB_RANK=1
  tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx SEQLAB_RANK=1 && kill -KILL "$pid"
done
finish_run "$WORK/dp-killed-rank"
rc=$?
sleep 0.2
left=$(pgrep -f -- "--out $WORK/dp-killed-rank" | wc -l)
if [ "$rc" -ne 0 ] && grep -q "rank 1 of 2 was killed by signal 9" "$WORK/dp-killed-rank.log" && [ "$left" -eq 0 ]; then
  pass "a rank killed: exit $rc, $(grep 'rank 1 of 2 was killed' "$WORK/dp-killed-rank.log"), no rank left running"
else
  fail "a rank killed: exit $rc, $left processes left"; cat "$WORK/dp-killed-rank.log"
fi

# 5. SIGINT to the launcher: every rank stops after the same step, rank 0 saves, exit 130; it resumes.
run_until "$WORK/dp-stopped"
kill -INT "$LAUNCHER"
finish_run "$WORK/dp-stopped"
rc=$?
saved=$(ls "$WORK/dp-stopped" | grep -c '^ckpt_')
if [ "$rc" -eq 130 ] && [ "$saved" -ge 1 ] && grep -q "continue with --resume" "$WORK/dp-stopped.log"; then
  pass "SIGINT: exit 130, $(grep -o 'stopped after step [0-9]*' "$WORK/dp-stopped.log"), a checkpoint saved"
  "$SEQLAB" --resume "$WORK/dp-stopped" --nproc 2 --set train.steps=12 > /dev/null 2>&1 \
    && [ "$(tail -n 1 "$WORK/dp-stopped/metrics.jsonl" | cut -d, -f1)" = '{"step": 12' ] \
    && pass "the stopped run resumes" || fail "resume after SIGINT"
  for i in 1 2 3; do  # every rank returns at once: each must still see the others connected first
    "$SEQLAB" --resume "$WORK/dp-stopped" --nproc 2 --set train.steps=12 2>&1 | grep -q "already complete" \
      || fail "resuming a complete run with 2 ranks"
  done
else
  fail "SIGINT: exit $rc, $saved checkpoints"; cat "$WORK/dp-stopped.log"
fi
[ "$(pgrep -f -- "--out $WORK/dp-" | wc -l)" -eq 0 ] || fail "rank processes left running"

# 6. Bad values: exit code 2, one line.
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
expect_usage_error "--nproc 0" "--nproc expects a number of processes, 1 or more, got '0'" "$WORK/tiny.toml" --nproc 0 --out "$WORK/x"
expect_usage_error "--nproc abc" "--nproc expects a number, got 'abc'" "$WORK/tiny.toml" --nproc abc --out "$WORK/x"
expect_usage_error "--nproc without a value" "--nproc needs a value" "$WORK/tiny.toml" --out "$WORK/x" --nproc
expect_usage_error "batch not divisible" "train.batch_size = 4 does not split across --nproc 3 ranks" \
  "$WORK/tiny.toml" --nproc 3 --out "$WORK/x"
expect_usage_error "--nproc with sample" "unknown flag '--nproc'" sample "$WORK/gpt-1" --nproc 2
expect_usage_error "--node-rank out of range" "--node-rank 2 is not a machine of --nnodes 2 (0 to 1)" \
  "$WORK/tiny.toml" --nnodes 2 --node-rank 2 --rendezvous "$WORK/r" --out "$WORK/x"
expect_usage_error "--nnodes without --rendezvous" "--nnodes needs --rendezvous DIR" "$WORK/tiny.toml" --nnodes 2 --out "$WORK/x"
expect_usage_error "--rendezvous redis:// without a job" "expected redis://HOST[:PORT]/JOB" \
  "$WORK/tiny.toml" --nnodes 2 --rendezvous redis://localhost:6379 --out "$WORK/x"
expect_usage_error "--rendezvous redis:// without a server" "cannot reach the Redis server at 127.0.0.1:1" \
  "$WORK/tiny.toml" --nnodes 2 --rendezvous redis://127.0.0.1:1/job --out "$WORK/x"
expect_usage_error "--node-rank without --nnodes" "--node-rank and --rendezvous go with --nnodes K" \
  "$WORK/tiny.toml" --node-rank 0 --out "$WORK/x"
"$SEQLAB" --help | grep -q -- "--nproc N" && pass "./train --help lists --nproc N" || fail "--help lacks --nproc"
[ ! -e "$WORK/x/metrics.jsonl" ] && pass "refused runs wrote nothing" || fail "a refused run wrote metrics"
echo "failures: $failures"
[ "$failures" -eq 0 ]
