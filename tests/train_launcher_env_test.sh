#!/usr/bin/env bash
# The launcher's variables are honoured only from a live launcher (docs/reliability.md, "Results that never
# lie"; docs/distributed.md "Launcher"): SEQLAB_RANK, SEQLAB_WORLD_SIZE and SEQLAB_RENDEZVOUS left in an
# environment (or set by hand) made a plain `./train` a rank, which takes no lock and skips the check for an
# earlier run's checkpoints, and overwrote a finished run. Set by hand on a finished run — for a fresh run
# into its folder, for --resume, and with a forged SEQLAB_LAUNCH_TOKEN — each is refused in one line naming
# the variables, and the run's files stay byte for byte; `--nproc 2` still trains.
# Usage: train_launcher_env_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 8 200 12
tiny_model_and_data "$WORK/tiny.toml" "$WORK"
cat >> "$WORK/tiny.toml" <<TOML
[train]
device = "cpu"
steps = 4
batch_size = 2
seq_len = 16
[log]
every = 1
eval_every = 2
eval_batches = 1
sample_every = 0
progress = "plain"
[checkpoint]
every = 2
TOML
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/done" > /dev/null || { echo "FAIL straight run"; exit 1; }
fingerprint() { (cd "$1" && find . -type f ! -name .lock | sort | xargs sha256sum); }
fingerprint "$WORK/done" > "$WORK/before.sums"
WANT="SEQLAB_RANK is set but this process was not started by a seqlab launcher: unset SEQLAB_RANK SEQLAB_WORLD_SIZE SEQLAB_RENDEZVOUS"
refused() {  # NAME WANT ENV... -- ARGS...
  local name=$1 want=$2
  shift 2
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  env "${env[@]}" "$SEQLAB" "$@" > /dev/null 2> "$WORK/stderr"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/stderr")" -eq 1 ] && grep -qF -- "$want" "$WORK/stderr"; then
    pass "$name: $(cat "$WORK/stderr")"
  else
    fail "$name: exit $rc: $(cat "$WORK/stderr")"
  fi
  if diff <(fingerprint "$WORK/done") "$WORK/before.sums" > /dev/null; then pass "$name: the run is untouched"
  else fail "$name: the finished run changed"; fi
}
VARS=(SEQLAB_RANK=0 SEQLAB_WORLD_SIZE=1 "SEQLAB_RENDEZVOUS=$WORK/rendezvous")
refused "a fresh run into a finished run's folder" "$WANT" "${VARS[@]}" -- "$WORK/tiny.toml" --out "$WORK/done"
refused "--resume" "$WANT" "${VARS[@]}" -- --resume "$WORK/done" --set train.steps=6
refused "a forged token" "$WANT SEQLAB_LAUNCH_TOKEN" "${VARS[@]}" \
  "SEQLAB_LAUNCH_TOKEN=$$:0:0123456789abcdef0123456789abcdef" -- "$WORK/tiny.toml" --out "$WORK/done"
refused "SEQLAB_RENDEZVOUS alone" "SEQLAB_RENDEZVOUS is set but this process was not started by a seqlab launcher: unset SEQLAB_RENDEZVOUS" \
  "SEQLAB_RENDEZVOUS=$WORK/rendezvous" -- "$WORK/tiny.toml" --out "$WORK/done"

# The launcher's own ranks are honoured.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/two" --nproc 2 > /dev/null 2> "$WORK/stderr"
rc=$?
[ "$rc" -eq 0 ] && [ "$(wc -l < "$WORK/two/metrics.jsonl")" -eq 4 ] && pass "--nproc 2 trains" \
  || fail "--nproc 2: exit $rc: $(cat "$WORK/stderr")"
echo "failures: $failures"
[ "$failures" -eq 0 ]
