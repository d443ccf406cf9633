#!/usr/bin/env bash
# A run is the run it says it is (docs/reliability.md, "Results that never lie"; docs/training.md, "Resume"):
# - resume takes the recipe from the checkpoint: a recipe.toml that is damaged, missing or edited is refused
#   in one line (naming the key and both values for an edit) and the run is left byte for byte as it was;
#   `seqlab recipe check CKPT` puts recipe.toml back; --set still changes a key (train.steps extends a run,
#   parallel.threads, log.progress); `RECIPE --resume RUN` may change only the keys a resume may change;
# - the resumed run keeps its recipe's name (its start line says "tiny", not "recipe");
# - every run has an identity (run.json, every checkpoint's metadata): another run's checkpoint given with
#   --checkpoint is refused naming both runs, and --checkpoint naming a folder lists its checkpoints;
# - a run refused after its folder was created leaves no folder behind (a folder that existed stays).
# Usage: train_run_identity_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 7 200 12
tiny_model_and_data "$WORK/tiny.toml" "$WORK"
cat >> "$WORK/tiny.toml" <<TOML
[train]
device = "cpu"
steps = 6
batch_size = 2
seq_len = 16
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
# fingerprint DIR: every file of DIR but its recipe.toml and lock, with its checksum
fingerprint() { (cd "$1" && find . -type f ! -name recipe.toml ! -name .lock | sort | xargs sha256sum); }
untouched() {  # NAME DIR: DIR holds what $WORK/before.sums says
  if diff <(fingerprint "$2") "$WORK/before.sums" > /dev/null; then pass "$1: the run is untouched"
  else fail "$1: the run changed"; diff <(fingerprint "$2") "$WORK/before.sums" | head -5; fi
}
ckpt_meta() {  # CKPT KEY: a key of a checkpoint's metadata
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    print(json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"].get(sys.argv[2], ""))
PY
}

"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/a" > /dev/null || { echo "FAIL straight run"; exit 1; }
CKPT="$WORK/a/ckpt_0000006.safetensors"

# 1. The identity: run.json and every checkpoint's metadata.
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$WORK/a/run.json" 2> /dev/null)
if [[ "$id" =~ ^[0-9a-f]{32}$ ]] && [ "$(ckpt_meta "$CKPT" run_id)" = "$id" ] \
   && [ "$(ckpt_meta "$WORK/a/ckpt_0000003.safetensors" run_id)" = "$id" ]; then
  pass "the run's id $id is in run.json and in its checkpoints"
else
  fail "run id: '$id', checkpoint's '$(ckpt_meta "$CKPT" run_id)'"
fi

# 2. recipe.toml damaged, missing, edited: refused, the run untouched.
fingerprint "$WORK/a" > "$WORK/before.sums"
cp "$WORK/a/recipe.toml" "$WORK/recipe.good"
echo "garbage [[[" > "$WORK/a/recipe.toml"
expect 2 "a damaged recipe.toml" "a/recipe.toml is damaged" --resume "$WORK/a" --set train.steps=9
untouched "damaged recipe.toml" "$WORK/a"
expect 2 "eval reads the recipe the same way" "a/recipe.toml is damaged" eval "$WORK/a"
expect 2 "sample too" "a/recipe.toml is damaged" sample "$WORK/a" --tokens 2
rm "$WORK/a/recipe.toml"
expect 2 "a missing recipe.toml" "a/recipe.toml is missing" --resume "$WORK/a"
sed -e 's/^steps = 6 /steps = 1000 /' -e "s|cache\"|other-cache\"|" "$WORK/recipe.good" > "$WORK/a/recipe.toml"
expect 2 "an edited recipe.toml" "data.cache_dir = \"$WORK/other-cache\" in recipe.toml, \"$WORK/cache\" in the checkpoint (and 1 other key)" \
  --resume "$WORK/a"
sed -e 's/^steps = 6 /steps = 1000 /' "$WORK/recipe.good" > "$WORK/a/recipe.toml"
expect 2 "recipe.toml with another train.steps" "train.steps = 1000 in recipe.toml, 6 in the checkpoint; " eval "$WORK/a"
untouched "edited recipe.toml" "$WORK/a"
"$SEQLAB" recipe check "$CKPT" > "$WORK/a/recipe.toml" 2> "$WORK/stderr" || fail "recipe check CKPT: $(cat "$WORK/stderr")"
"$SEQLAB" --resume "$WORK/a" > "$WORK/stdout" 2>&1 && grep -q "already complete" "$WORK/stdout" \
  && pass "recipe.toml put back from the checkpoint resumes" || fail "restored recipe: $(cat "$WORK/stdout")"

# 3. --set on resume, applied over the checkpoint's recipe; the name is the run's.
cp -r "$WORK/a" "$WORK/ext"
"$SEQLAB" --resume "$WORK/ext" --set train.steps=8 --set parallel.threads=1 --set log.progress=plain \
  > "$WORK/stdout" 2> "$WORK/stderr"
rc=$?
if [ "$rc" -eq 0 ] && [ "$(wc -l < "$WORK/ext/metrics.jsonl")" -eq 8 ] && grep -q '^steps = 8 ' "$WORK/ext/recipe.toml" \
   && grep -q '^threads = 1 ' "$WORK/ext/recipe.toml"; then
  pass "--resume RUN --set train.steps=8 extends the run, and recipe.toml says so"
else
  fail "extend: exit $rc: $(cat "$WORK/stderr")"
fi
grep -q '^seqlab: tiny: .*(resumed at step 6)' "$WORK/stdout" && pass "the resumed run keeps its name" \
  || fail "name on resume: $(head -1 "$WORK/stdout")"
head -n 1 "$WORK/ext/recipe.toml" | grep -q '^# Recipe "tiny" resolved' && pass "recipe.toml keeps the name" \
  || fail "recipe.toml: $(head -n 1 "$WORK/ext/recipe.toml")"
"$SEQLAB" --resume "$WORK/ext" | grep -q "already complete" && pass "the extended run is complete" || fail "extended run"

# 4. RECIPE --resume RUN: the keys a resume may change, and nothing else.
cp -r "$WORK/a" "$WORK/given"
"$SEQLAB" "$WORK/tiny.toml" --resume "$WORK/given" --set train.steps=7 --set parallel.threads=1 \
  --set 'log.progress="plain"' > "$WORK/stdout" 2> "$WORK/stderr" \
  && [ "$(wc -l < "$WORK/given/metrics.jsonl")" -eq 7 ] && grep -q '^seqlab: tiny: ' "$WORK/stdout" \
  && pass "RECIPE --resume RUN with train.steps, parallel.threads and log.progress" || fail "given recipe: $(cat "$WORK/stderr")"
expect 2 "RECIPE --resume RUN with another optim.lr" "optim.lr = 0.5 there, 0.001 in its checkpoint" \
  "$WORK/tiny.toml" --resume "$WORK/given" --set train.steps=9 --set optim.lr=0.5

# 5. Another run's checkpoint; a folder given as --checkpoint.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/b" > /dev/null || fail "second run"
fingerprint "$WORK/a" > "$WORK/before.sums"
other=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$WORK/b/run.json")
expect 2 "another run's checkpoint" "--checkpoint $WORK/b/ckpt_0000003.safetensors belongs to another run: it is run $other" \
  --resume "$WORK/a" --checkpoint "$WORK/b/ckpt_0000003.safetensors" --set train.steps=9
grep -qF "$WORK/a is run $id" "$WORK/stderr" && pass "... naming both runs" || fail "the run's id not named"
untouched "another run's checkpoint" "$WORK/a"
cp "$WORK/b/ckpt_0000006.safetensors" "$WORK/a/ckpt_0000009.safetensors"
expect 2 "another run's checkpoint copied in" "ckpt_0000009.safetensors belongs to another run" --resume "$WORK/a"
rm "$WORK/a/ckpt_0000009.safetensors"
expect 2 "--checkpoint DIR" "--checkpoint expects a checkpoint file, $WORK/b is a folder; its checkpoints: $WORK/b/ckpt_0000003.safetensors, $WORK/b/ckpt_0000006.safetensors" \
  --resume "$WORK/a" --checkpoint "$WORK/b"

# 6. A refused run leaves no folder it created; a folder that was there stays.
expect 2 "a model too big" "makes the model too big" "$WORK/tiny.toml" --out "$WORK/new/big" --set model.d_model=1000000000
[ ! -e "$WORK/new" ] && pass "... left no folder" || fail "the refused run left $(find "$WORK/new")"
expect 2 "bad data path" "$WORK/nothing" "$WORK/tiny.toml" --out "$WORK/nodata" --set data.path="$WORK/nothing"
[ ! -e "$WORK/nodata" ] && pass "... left no folder" || fail "the refused run left $(find "$WORK/nodata")"
expect 2 "--nproc 3 with a batch of 2" "does not split" "$WORK/tiny.toml" --out "$WORK/np" --nproc 3
[ ! -e "$WORK/np" ] && pass "... left no folder" || fail "the refused run left $(find "$WORK/np")"
mkdir "$WORK/kept"
expect 2 "a model too big, into a folder that exists" "makes the model too big" "$WORK/tiny.toml" --out "$WORK/kept" \
  --set model.d_model=1000000000
[ -d "$WORK/kept" ] && pass "... the folder stays" || fail "a folder that existed was removed"
echo "failures: $failures"
[ "$failures" -eq 0 ]
