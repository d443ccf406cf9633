#!/usr/bin/env bash
# The launcher's faults that used to end in Gloo's own text, a crash or leftovers (issue 26), each now one
# line naming what the user gave, or a clean-up said in one line:
#   1. SEQLAB_GLOO_HOST / SEQLAB_GLOO_IFACE that this machine cannot use: exit 2, one line naming the
#      variable and its value, before any rank starts (a name that did not resolve crashed rank 1 with
#      SIGSEGV inside Gloo; the others showed Gloo's "bind_rv == 0. Unable to find address ...");
#   2. two machines of one job (--nnodes 2, simulated by two launchers here) that disagree on --nproc or
#      --nnodes: each launcher refuses in one line naming the flag and both values (before: Gloo's
#      "sizeof(impl_) == bytes.size(). 136 vs 226", or a hang until the rendezvous timed out);
#   3. a launcher killed with SIGKILL: its ranks die with it, and the next launcher on the run folder
#      removes the rendezvous folder it left (one line) and resumes.
# Usage: launcher_faults_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 7 200 12
tiny_model_and_data "$WORK/tiny.toml" "$WORK"
cat >> "$WORK/tiny.toml" <<TOML
[train]
device = "cpu"
steps = 4
batch_size = 12  # splits across 2, 4 and 6 ranks
seq_len = 16
[log]
every = 1
eval_every = 1000
sample_every = 0
[checkpoint]
every = 1
[parallel]
threads = 1
TOML

# expect_refusal NAME WANT FILE RC: the command that wrote FILE (its stderr) and exited RC: exit 2 and
# exactly the one line WANT (without the "seqlab train: " prefix).
expect_refusal() {
  if [ "$4" -eq 2 ] && [ "$(cat "$3")" = "seqlab train: $2" ]; then
    pass "$1: $(cat "$3")"
  else
    fail "$1: exit $4: $(head -c 600 "$3")"
  fi
}

# 1. Transport variables this machine cannot use.
for case in "SEQLAB_GLOO_HOST=nosuchhost.invalid|cannot resolve the host name" \
            "SEQLAB_GLOO_HOST=192.0.2.1|no address of this name is one of this machine's" \
            "SEQLAB_GLOO_IFACE=nosuchif0|no network interface of this name"; do
  setting=${case%%|*}
  want=${case#*|}
  env "$setting" timeout 60 "$SEQLAB" "$WORK/tiny.toml" --nproc 2 --out "$WORK/transport" > /dev/null 2> "$WORK/transport.err"
  rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/transport.err")" -eq 1 ] && grep -q "^seqlab train: $setting: $want" "$WORK/transport.err"; then
    pass "$setting: $(cat "$WORK/transport.err")"
  else
    fail "$setting: exit $rc: $(head -c 600 "$WORK/transport.err")"
  fi
done
[ ! -e "$WORK/transport/metrics.jsonl" ] && pass "no rank started" || fail "a rank trained with a bad transport"

# 2. Two launchers of one job that disagree: machine 1 gives --nproc 1 (or --nnodes 3) where machine 0
# gives --nproc 2 --nnodes 2. Both refuse; neither starts a rank.
disagree() {  # NAME "MACHINE 1'S FLAGS" WANT0 WANT1
  local rdv="$WORK/rdv-${1//[^a-z]/}"
  # shellcheck disable=SC2086
  timeout 60 "$SEQLAB" "$WORK/tiny.toml" $2 --node-rank 1 --rendezvous "$rdv" --out "$WORK/nodes" \
    > /dev/null 2> "$WORK/node1.err" &
  local node1=$!
  timeout 60 "$SEQLAB" "$WORK/tiny.toml" --nproc 2 --nnodes 2 --node-rank 0 --rendezvous "$rdv" --out "$WORK/nodes" \
    > /dev/null 2> "$WORK/node0.err"
  local rc0=$?
  wait "$node1"
  local rc1=$?
  expect_refusal "$1, machine 0" "$3" "$WORK/node0.err" "$rc0"
  expect_refusal "$1, machine 1" "$4" "$WORK/node1.err" "$rc1"
  [ ! -e "$WORK/nodes/metrics.jsonl" ] || fail "$1: a rank trained"
}
disagree "--nproc differs" "--nproc 1 --nnodes 2" \
  "--nproc differs between the machines of the job: this machine has --nproc 2, machine 1 has --nproc 1 (every machine must give the same --nproc and --nnodes)" \
  "--nproc differs between the machines of the job: this machine has --nproc 1, machine 0 has --nproc 2 (every machine must give the same --nproc and --nnodes)"
# The folder keeps both machines' keys (a rendezvous is fresh for each job): machine 0 started again on
# it is told so, in one line.
timeout 60 "$SEQLAB" "$WORK/tiny.toml" --nproc 2 --nnodes 2 --node-rank 0 --rendezvous "$WORK/rdv-nprocdiffers" \
  --out "$WORK/nodes" > /dev/null 2> "$WORK/again.err"
rc=$?
if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/again.err")" -eq 1 ] &&
   grep -qF "seqlab train: --rendezvous $WORK/rdv-nprocdiffers: cannot publish this machine's --nproc and --nnodes as --node-rank 0 (File already exists: " "$WORK/again.err" &&
   grep -qF "Give each machine its own --node-rank, and each job a fresh --rendezvous" "$WORK/again.err"; then
  pass "machine 0 again on the same folder: $(cat "$WORK/again.err")"
else
  fail "machine 0 again on the same folder: exit $rc: $(head -c 600 "$WORK/again.err")"
fi
disagree "--nnodes differs" "--nproc 2 --nnodes 3" \
  "--nnodes differs between the machines of the job: this machine has --nnodes 2, machine 1 has --nnodes 3 (every machine must give the same --nproc and --nnodes)" \
  "--nnodes differs between the machines of the job: this machine has --nnodes 3, machine 0 has --nnodes 2 (every machine must give the same --nproc and --nnodes)"

# 3. SIGKILL to the launcher of a 2-rank run once it has printed step 3.
RUN="$WORK/killed"
coproc TRAINING { exec "$SEQLAB" "$WORK/tiny.toml" --nproc 2 --out "$RUN" --set train.steps=100000 \
  --set log.progress=plain 2>&1; }
LAUNCHER=$TRAINING_PID
exec {OUT_FD}<&"${TRAINING[0]}"
while IFS= read -r line <&$OUT_FD; do
  case "$line" in "step 3/"*) break;; esac
done
ranks=$(pgrep -P "$LAUNCHER" | tr '\n' ' ')
kill -KILL "$LAUNCHER"
wait "$LAUNCHER" 2> /dev/null
exec {OUT_FD}<&-
# A rank is gone once no process of its pid runs (a zombie no longer runs).
running() { local s; s=$(ps -o stat= -p "$1" 2> /dev/null); [ -n "$s" ] && [ "${s#Z}" = "$s" ]; }
left=""
for _ in $(seq 100); do  # up to 10 s
  left=""
  for pid in $ranks; do running "$pid" && left="$left $pid"; done
  [ -z "$left" ] && break
  sleep 0.1
done
[ -n "$ranks" ] && [ -z "$left" ] && pass "launcher killed: its ranks ($ranks) ended with it" \
  || fail "launcher killed: ranks '$ranks', still running:$left"
leftover="$RUN/.rendezvous/$LAUNCHER"
[ -d "$leftover" ] || fail "the killed launcher left no $leftover (the test expects it)"
# (Not a NAME.tmp.PID that the kill may have left: the resume removes those.)
newest=$(ls "$RUN" | grep -E '^ckpt_[0-9]+\.safetensors$' | sort | tail -n 1)
step=$((10#$(echo "$newest" | tr -dc 0-9)))
"$SEQLAB" --resume "$RUN" --nproc 2 --set train.steps=$((step + 2)) > /dev/null 2> "$WORK/resume.err"
rc=$?
want="seqlab: removed $leftover, left behind by a launcher that was killed"
if [ "$rc" -eq 0 ] && grep -qxF "$want" "$WORK/resume.err" && [ ! -e "$RUN/.rendezvous" ] &&
   [ "$(tail -n 1 "$RUN/metrics.jsonl" | cut -d, -f1)" = "{\"step\": $((step + 2))" ]; then
  pass "--resume after the kill: $want; resumed from step $step to $((step + 2))"
else
  fail "--resume after the kill: exit $rc: $(head -c 600 "$WORK/resume.err"); $(ls -a "$RUN/.rendezvous" 2>&1 | tr '\n' ' ')"
fi

echo "failures: $failures"
[ "$failures" -eq 0 ]
