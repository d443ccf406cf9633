#!/usr/bin/env bash
# A short GPT run straight through and the same run resumed from its middle checkpoint log identical
# losses at every step; bad arguments to the trainer exit with code 2 and one line.
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 - "$WORK/corpus.txt" <<'PY'
import random, sys
random.seed(3)
words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        f.write(" ".join(random.choice(words) for _ in range(12)) + ".\n\n")
PY
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
steps = 6
batch_size = 2
seq_len = 16
[optim]
warmup_steps = 2
[log]
every = 1
eval_every = 3
eval_batches = 2
[checkpoint]
every = 3
TOML
failures=0
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/a" > /dev/null || { echo "FAIL straight run"; exit 1; }
cp -r "$WORK/a" "$WORK/b"
rm "$WORK/b/ckpt_0000006.safetensors"
"$SEQLAB" "$WORK/tiny.toml" --resume "$WORK/b" > /dev/null || { echo "FAIL resumed run"; exit 1; }
if [ "$(wc -l < "$WORK/a/metrics.jsonl")" -eq 6 ] && \
   diff <(sed 's/"tokens_per_s": [0-9.]*//' "$WORK/a/metrics.jsonl") \
        <(sed 's/"tokens_per_s": [0-9.]*//' "$WORK/b/metrics.jsonl"); then
  echo "ok   resumed run logs the same losses at every step"
else
  echo "FAIL resumed metrics differ"; failures=$((failures + 1))
fi
grep -q '"val_loss"' "$WORK/a/metrics.jsonl" && echo "ok   evaluation logged" || { echo "FAIL no val_loss"; failures=$((failures + 1)); }
[ -f "$WORK/a/recipe.toml" ] && echo "ok   resolved recipe written" || { echo "FAIL no recipe.toml"; failures=$((failures + 1)); }
for args in "--set train.steps=-1" "--frobnicate" "--resume $WORK/empty"; do
  mkdir -p "$WORK/empty"
  # shellcheck disable=SC2086
  "$SEQLAB" "$WORK/tiny.toml" $args > /dev/null 2> "$WORK/stderr"
  rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/stderr")" -eq 1 ]; then
    echo "ok   $args: $(cat "$WORK/stderr")"
  else
    echo "FAIL $args: exit $rc"; failures=$((failures + 1))
  fi
done
echo "failures: $failures"
[ "$failures" -eq 0 ]
