#!/usr/bin/env bash
# `seqlab sweep` at the command line (src/train/cli/sweep.cpp): a sweep of 2 mixers × 2 learning rates of a
# tiny recipe, 2 points at a time, writes results.csv, results.md and the plot against FLOPs and exits 0; run again it runs nothing;
# with one point's folder removed it runs that point alone; a point stopped with a checkpoint is resumed to the
# sweep's steps; a point that fails at run time (a diverging learning rate) and one whose recipe is refused
# are recorded with their reasons while the others finish, and the sweep exits 1; --report writes the same
# results again; --dry-run runs nothing; a missing or broken sweep file is refused with exit 2 and one line.
# Usage: sweep_cli_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 7 200 12
cat > "$WORK/base.toml" <<TOML
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
steps = 4
batch_size = 2
seq_len = 16
[optim]
warmup_steps = 1
[log]
every = 1
eval_every = 2
eval_batches = 1
sample_every = 0
[checkpoint]
every = 2
TOML
cat > "$WORK/s.toml" <<'TOML'
recipe = "base.toml"
metric = "val_loss"
best_over = ["optim.lr"]
rows = "model.mixer"
[grid]
"model.mixer" = ["attention", "gla"]
"optim.lr" = [1e-3, 3e-3]
TOML
OUT="$WORK/out"
logs_sum() { cat "$OUT"/*.log 2> /dev/null | md5sum; }

# 1. The whole sweep, 2 points at a time.
if "$SEQLAB" sweep "$WORK/s.toml" --jobs 2 --out "$OUT" > "$WORK/1.out" 2>&1; then
  ok_rows=$(grep -c ',ok,' "$OUT/results.csv")
  [ "$ok_rows" -eq 4 ] && grep -q '^| attention | ' "$OUT/results.md" && grep -q '^| gla | ' "$OUT/results.md" &&
    [ -s "$OUT/val_loss_vs_flops.png" ] &&
    pass "4 points, --jobs 2: exit 0, 4 ok rows in results.csv, a row per mixer in results.md, the FLOPs plot" ||
    { fail "results after the first sweep"; cat "$OUT/results.csv" "$OUT/results.md"; }
else
  fail "the first sweep"; cat "$WORK/1.out"
fi
# 2. Again: every point finished earlier; nothing runs (the logs do not grow).
before=$(logs_sum)
"$SEQLAB" sweep "$WORK/s.toml" --jobs 2 --out "$OUT" > "$WORK/2.out" 2>&1
[ $? -eq 0 ] && [ "$(grep -c 'finished earlier' "$WORK/2.out")" -eq 4 ] && [ "$(logs_sum)" = "$before" ] &&
  pass "run again: 4 points finished earlier, nothing ran" || { fail "second run"; cat "$WORK/2.out"; }
# 3. One point's folder removed: that point alone runs.
rm -rf "$OUT/mixer=gla,lr=0.003" "$OUT/mixer=gla,lr=0.003.log"
"$SEQLAB" sweep "$WORK/s.toml" --out "$OUT" > "$WORK/3.out" 2>&1
[ $? -eq 0 ] && [ "$(grep -c 'finished earlier' "$WORK/3.out")" -eq 3 ] && grep -q 'mixer=gla,lr=0.003: val_loss' "$WORK/3.out" &&
  pass "a removed point runs again, alone" || { fail "the removed point"; cat "$WORK/3.out"; }
# 4. A point stopped with a checkpoint at step 2 of 4 resumes to the sweep's 4 steps.
rm -rf "$OUT/mixer=attention,lr=0.001" "$OUT/mixer=attention,lr=0.001.log"
"$SEQLAB" "$WORK/base.toml" --set 'model.mixer="attention"' --set optim.lr=0.001 --set train.steps=2 \
  --out "$OUT/mixer=attention,lr=0.001" > /dev/null 2>&1 || fail "the partial run"
"$SEQLAB" sweep "$WORK/s.toml" --out "$OUT" > "$WORK/4.out" 2>&1
steps=$(python3 -c 'import json,sys; print([json.loads(l)["step"] for l in open(sys.argv[1]) if "loss" in l])' \
  "$OUT/mixer=attention,lr=0.001/metrics.jsonl")
[ $? -eq 0 ] && grep -q 'resumed at step 2' "$OUT/mixer=attention,lr=0.001.log" && [ "$steps" = "[1, 2, 3, 4]" ] &&
  pass "a point stopped at step 2 resumed to step 4: steps $steps" || { fail "resume of a point: $steps"; cat "$WORK/4.out"; }
# 5. --report writes the same results again.
cp "$OUT/results.md" "$WORK/results.before"
"$SEQLAB" sweep --report "$OUT" > /dev/null 2>&1 && cmp -s "$OUT/results.md" "$WORK/results.before" &&
  pass "--report writes results.md again, the same" || fail "--report"
# 6. Failures: a diverging learning rate fails at run time, d_model 7 is refused by its recipe; the other
# points finish, the table names both reasons, exit 1.
cat > "$WORK/f.toml" <<'TOML'
name = "f"
recipe = "base.toml"
[grid]
"model.d_model" = [16, 7]
"optim.lr" = [1e-3, 1e30]
TOML
"$SEQLAB" sweep "$WORK/f.toml" --jobs 2 --out "$WORK/f" > "$WORK/f.out" 2>&1
rc=$?
if [ "$rc" -eq 1 ] && [ "$(grep -c ',ok,' "$WORK/f/results.csv")" -eq 1 ] && [ "$(grep -c ',failed,' "$WORK/f/results.csv")" -eq 3 ] &&
   grep -q 'd_model=16,lr=1e+30: seqlab train: .*not finite' "$WORK/f/results.md" &&
   grep -q 'd_model=7,lr=0.001: .*model.n_heads = 2 must divide model.d_model = 7' "$WORK/f/results.md" &&
   grep -q '3 of 4 points did not finish' "$WORK/f.out"; then
  pass "failing points recorded with their reasons, the rest finished, exit 1"
else
  fail "failing points (exit $rc)"; cat "$WORK/f.out" "$WORK/f/results.md"
fi
# 7. --dry-run: the points and an estimate, nothing run.
"$SEQLAB" sweep "$WORK/s.toml" --dry-run --out "$WORK/dry" > "$WORK/dry.out" 2>&1
[ $? -eq 0 ] && grep -q '4 points' "$WORK/dry.out" && grep -q 'estimated' "$WORK/dry.out" && [ ! -e "$WORK/dry" ] &&
  pass "--dry-run: $(grep estimated "$WORK/dry.out")" || { fail "--dry-run"; cat "$WORK/dry.out"; }
# 8. Refusals: exit 2, one line.
refused() {  # NAME TEXT ARGS...
  local name=$1 text=$2
  shift 2
  "$SEQLAB" sweep "$@" > "$WORK/r.out" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/r.out")" -eq 1 ] && grep -qF -- "$text" "$WORK/r.out" &&
    pass "$name: $(cat "$WORK/r.out")" || { fail "$name (exit $rc)"; cat "$WORK/r.out"; }
}
refused "missing sweep file" "sweep file not found" "$WORK/none.toml"
printf 'recipe = "base.toml"\nmetrics = "val_loss"\n[grid]\n"optim.lr" = [1]\n' > "$WORK/bad.toml"
refused "a misspelt key" "unknown or mistyped key 'metrics'" "$WORK/bad.toml"
refused "--jobs 0" "--jobs expects 1 or more" "$WORK/s.toml" --jobs 0
printf 'recipe = "nowhere.toml"\n[grid]\n"optim.lr" = [1]\n' > "$WORK/norecipe.toml"
refused "a base recipe that does not exist" "its recipe $WORK/nowhere.toml does not exist" "$WORK/norecipe.toml"
refused "--report of a folder that is no sweep" "is not a sweep folder" --report "$WORK"
echo "failures: $failures"
[ "$failures" -eq 0 ]
