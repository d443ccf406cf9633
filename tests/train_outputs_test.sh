#!/usr/bin/env bash
# What a run leaves for a person: `seqlab sample` (reproducible by seed, flags checked), `seqlab plot`
# (a PNG), the progress bar with MFU and ETA, and a synthetic task's accuracy in the metrics.
# Usage: train_outputs_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failures=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
python3 - "$WORK/corpus.txt" <<'PY'
import random, sys
random.seed(5)
words = ["red", "fox", "jumps", "over", "lazy", "dogs", "while", "owls", "sleep", "at", "noon"]
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        f.write(" ".join(random.choice(words) for _ in range(10)) + ".\n%\n")
PY
cat > "$WORK/tiny.toml" <<TOML
[model]
d_model = 16
n_layers = 1
n_heads = 2
[data]
path = "$WORK/corpus.txt"
format = "fortune"
cache_dir = "$WORK/cache"
[train]
device = "cpu"          # these tests check the CPU path on any machine
steps = 30
batch_size = 4
seq_len = 32
[optim]
lr = 3e-3
warmup_steps = 3
[log]
every = 5
eval_every = 10
eval_batches = 2
sample_every = 15
sample_tokens = 20
sample_prompt = "red "
progress = "bar"
TOML

# The progress bar: redrawn in place, with MFU and ETA.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/run" > "$WORK/out.txt" 2>&1 || { cat "$WORK/out.txt"; echo "FAIL training"; exit 1; }
if grep -q $'\r' "$WORK/out.txt" && grep -q "MFU [0-9.]*%  ETA" "$WORK/out.txt" && grep -q "^done: 30 steps" "$WORK/out.txt"; then
  pass "progress bar with MFU and ETA, then a summary"
else
  fail "progress output"; cat -A "$WORK/out.txt" | head -5
fi
grep -q '^### step 30' "$WORK/run/samples.txt" && grep -q '^red ' "$WORK/run/samples.txt" \
  && pass "samples.txt continues the prompt at steps 15 and 30" || fail "samples.txt"

# seqlab sample: the same seed gives the same text; another seed another; greedy ignores the seed.
s1=$("$SEQLAB" sample "$WORK/run" --prompt "red fox " --tokens 40 --seed 1) || fail "sample exit code"
s2=$("$SEQLAB" sample "$WORK/run" --prompt "red fox " --tokens 40 --seed 1)
s3=$("$SEQLAB" sample "$WORK/run" --prompt "red fox " --tokens 40 --seed 2 --top-k 5 --top-p 0.9)
g1=$("$SEQLAB" sample "$WORK/run" --prompt "red fox " --tokens 40 --seed 1 --temperature 0)
g2=$("$SEQLAB" sample "$WORK/run" --prompt "red fox " --tokens 40 --seed 7 --temperature 0)
[ "$s1" = "$s2" ] && pass "same seed, same sample" || fail "same seed gave different samples"
[ "$s1" != "$s3" ] && pass "another seed, another sample" || fail "different seeds gave the same sample"
[ "$g1" = "$g2" ] && pass "greedy decoding does not depend on the seed" || fail "greedy decoding varied"
case "$s1" in "red fox "*) pass "the sample starts with the prompt: $(printf '%s' "$s1" | head -c 60 | tr '\n' ' ')";;
  *) fail "sample does not start with the prompt";; esac

# seqlab plot: a PNG (its 8-byte signature), written into the run directory.
"$SEQLAB" plot "$WORK/run" > /dev/null || fail "plot exit code"
[ "$(head -c 8 "$WORK/run/loss.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] \
  && pass "plot wrote a PNG" || fail "loss.png is not a PNG"
ls "$WORK/run" | grep -q '\.tmp$' && fail "temporary files left behind" || pass "no temporary files left"

# A synthetic task: accuracy at every evaluation; sampling text is refused.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/mqar" --set data.source=mqar --set data.task_vocab=16 \
  --set data.task_num_pairs=4 --set train.seq_len=24 --set log.progress=plain > "$WORK/mqar.txt" 2>&1 \
  || { cat "$WORK/mqar.txt"; fail "mqar training"; }
grep -q '"val_acc": [0-9.]*' "$WORK/mqar/metrics.jsonl" && grep -q "accuracy [0-9.]*%" "$WORK/mqar.txt" \
  && pass "mqar logs its accuracy" || fail "no val_acc for mqar"
grep -q $'\r' "$WORK/mqar.txt" && fail "plain progress drew a bar" || pass "plain progress lines"

# Bad arguments: exit code 2 and one line.
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
expect_usage_error "sample: top-p out of range" "--top-p must be in (0, 1]" sample "$WORK/run" --top-p 1.5
expect_usage_error "sample: not a number" "--tokens expects an integer from 1 to 2^63 - 1, got 'many'" sample "$WORK/run" --tokens many
expect_usage_error "sample: --top-k below its range" "--top-k expects an integer from 0 to 2^63 - 1, got '-1'" sample "$WORK/run" --top-k -1
expect_usage_error "sample: --tokens beyond 64 bits" "--tokens expects an integer from 1 to 2^63 - 1, got '99999999999999999999'" \
  sample "$WORK/run" --tokens 99999999999999999999
expect_usage_error "sample: no run directory" "no such run directory" sample "$WORK/nowhere"
expect_usage_error "sample: synthetic run" "no text to sample" sample "$WORK/mqar"
expect_usage_error "plot: no metrics" "metrics.jsonl: cannot be read" plot "$WORK"
# --out checked before gnuplot runs: a missing folder printed gnuplot's own errors over 9 lines, and a
# folder was taken for a plot written (exit 0, no PNG).
expect_usage_error "plot: --out in a missing folder" "--out $WORK/nowhere/x.png: the folder $WORK/nowhere does not exist" \
  plot "$WORK/run" --out "$WORK/nowhere/x.png"
expect_usage_error "plot: --out a folder" "--out $WORK is a folder: give the name of the PNG file to write" \
  plot "$WORK/run" --out "$WORK"
echo "failures: $failures"
[ "$failures" -eq 0 ]
