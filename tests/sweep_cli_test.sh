#!/usr/bin/env bash
# `seqlab sweep` at the command line (src/train/cli/sweep.cpp): a sweep of 2 mixers × 2 learning rates of a
# tiny recipe, 2 points at a time, writes results.csv, results.md and the plot against FLOPs and exits 0; run again it runs nothing;
# with one point's folder removed it runs that point alone; a point stopped with a checkpoint is resumed to the
# sweep's steps; a point that fails at run time (a diverging learning rate) and one whose recipe is refused
# are recorded with their reasons while the others finish, and the sweep exits 1; --report writes the same
# results again; --dry-run runs nothing; a missing or broken sweep file is refused with exit 2 and one line.
# Results that never lie (docs/reliability.md): values reach the points exactly, a non-finite metric is never
# the best, every JSON file strict, a changed sweep file refused (--rerun-changed), a misspelt metric refused
# before anything runs, unique folder names, SIGTERM stops the points (stopped, not failed), SIGKILL takes
# them along, no stale .failed, no gnuplot chatter, and the refusals of training named in the dry run.
# Fair comparisons: "auto" block keys pinned across a grid of mixers; what cannot be pinned flagged.
# Usage: sweep_cli_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 7 200 12
tiny_model_and_data "$WORK/base.toml" "$WORK"
cat >> "$WORK/base.toml" <<TOML
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
# 4. A point stopped with a checkpoint at step 2 of 4 resumes to the sweep's 4 steps: the point's own run,
# its step-4 checkpoint and log lines removed as a stop after step 2 leaves them.
P4="$OUT/mixer=attention,lr=0.001"
rm -rf "$P4" "$P4.log"
"$SEQLAB" "$WORK/base.toml" --set 'model.mixer="attention"' --set optim.lr=0.001 --set parallel.threads=1 \
  --set log.progress=plain --out "$P4" > /dev/null 2>&1 || fail "the partial run"
rm -f "$P4/ckpt_0000004.safetensors"
python3 -c 'import json,sys; p=sys.argv[1]; k=[l for l in open(p) if json.loads(l)["step"] <= 2]; open(p,"w").writelines(k)' \
  "$P4/metrics.jsonl"
"$SEQLAB" sweep "$WORK/s.toml" --out "$OUT" > "$WORK/4.out" 2>&1
steps=$(python3 -c 'import json,sys; print([json.loads(l)["step"] for l in open(sys.argv[1]) if "loss" in l])' \
  "$P4/metrics.jsonl")
[ $? -eq 0 ] && grep -q 'resumed at step 2' "$P4.log" && [ "$steps" = "[1, 2, 3, 4]" ] &&
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
refused "--jobs 0" "--jobs expects an integer from 1 to" "$WORK/s.toml" --jobs 0
printf 'recipe = "nowhere.toml"\n[grid]\n"optim.lr" = [1]\n' > "$WORK/norecipe.toml"
refused "a base recipe that does not exist" "its recipe $WORK/nowhere.toml does not exist" "$WORK/norecipe.toml"
refused "--report of a folder that is no sweep" "is not a sweep folder" --report "$WORK"
# 9. A point is its recipe, and a metric that is not finite is never the best: lr = 0.00012345678 trains at
# that value to the last digit (the 6-digit 0.000123457 before), 1e30 diverges and, with on_nonfinite =
# "skip", finishes with val_loss null; the best over lr is the finite point, exit 0, every JSON file strict.
cat > "$WORK/exact.toml" <<'TOML'
name = "exact"
recipe = "base.toml"
best_over = ["optim.lr"]
[grid]
"optim.lr" = [0.00012345678, 1e30]
[set]
"train.on_nonfinite" = "skip"
"train.max_skipped" = 1000
TOML
"$SEQLAB" sweep "$WORK/exact.toml" --out "$WORK/exact" > "$WORK/exact.out" 2>&1
rc=$?
lr=$(sed -n 's/^lr = \([^ ]*\) .*/\1/p' "$WORK/exact/lr=0.00012345678/recipe.toml")
if [ "$rc" -eq 0 ] && [ "$lr" = "0.00012345678" ] && grep -q '^|  | [0-9.]* (lr=0.00012345678) |$' "$WORK/exact/results.md" \
   && grep -q '^lr=1e+30,1e+30,not_finite,.*,$' "$WORK/exact/results.csv" && grep -q '^lr=0.00012345678,.*,ok,.*,[0-9.]*$' "$WORK/exact/results.csv"; then
  pass "exact lr ($lr), the finite point is the best, the diverged one not_finite, exit 0"
else
  fail "exact values and a non-finite metric (exit $rc, lr '$lr')"; cat "$WORK/exact.out" "$WORK/exact/results.csv"
fi
if python3 - "$WORK/exact" <<'PY'
import json, pathlib, sys
def refuse(name):
    raise ValueError(f"not JSON: {name}")
files = [p for p in pathlib.Path(sys.argv[1]).rglob("*") if p.suffix in (".json", ".jsonl")]
assert files, "no JSON files"
for p in files:
    text = p.read_text()
    for line in (text.splitlines() if p.suffix == ".jsonl" else [text]):
        json.loads(line, parse_constant=refuse)
PY
then pass "every .json and .jsonl of a sweep with a diverged point parses strictly"; else fail "strict JSON"; fi
# 10. The sweep file changed since its points ran ([set] train.seed): refused before anything runs, naming
# the point, the key and both values; --rerun-changed moves the old runs aside and trains them anew.
sed 's/^"train.max_skipped" = 1000$/"train.max_skipped" = 1000\n"train.seed" = 5/' "$WORK/exact.toml" > "$WORK/exact2.toml"
before=$(cat "$WORK/exact"/*.log | md5sum)
"$SEQLAB" sweep "$WORK/exact2.toml" --out "$WORK/exact" > "$WORK/changed.out" 2>&1
rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/changed.out")" -eq 1 ] &&
  grep -qF "exact/lr=0.00012345678 was trained with train.seed = 1337, the sweep now gives 5; 2 points differ so: retrain such points with --rerun-changed" "$WORK/changed.out" &&
  [ "$(cat "$WORK/exact"/*.log | md5sum)" = "$before" ] &&
  pass "a changed [set] is refused: $(cat "$WORK/changed.out")" || { fail "changed [set] (exit $rc)"; cat "$WORK/changed.out"; }
"$SEQLAB" sweep "$WORK/exact2.toml" --out "$WORK/exact" --rerun-changed > "$WORK/rerun.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ -f "$WORK/exact/replaced/lr=0.00012345678/recipe.toml" ] &&
  grep -q '^seed = 5 ' "$WORK/exact/lr=0.00012345678/recipe.toml" && [ "$(grep -c '^rerun: ' "$WORK/rerun.out")" -eq 2 ] &&
  pass "--rerun-changed: the old runs in replaced/, the points trained anew with seed 5" ||
  { fail "--rerun-changed (exit $rc)"; cat "$WORK/rerun.out"; }
# 11. A misspelt metric is refused before any point runs (no folder made), with the near miss.
printf 'recipe = "base.toml"\nmetric = "val_los"\n[grid]\n"optim.lr" = [1e-3]\n' > "$WORK/metric.toml"
refused_before() {
  "$SEQLAB" sweep "$WORK/metric.toml" --out "$WORK/metric" > "$WORK/m.out" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/m.out")" -eq 1 ] && [ ! -e "$WORK/metric" ] &&
    grep -qF 'metric = "val_los" is not logged by the runs of point lr=0.001 (did you mean "val_loss"?)' "$WORK/m.out" &&
    pass "a misspelt metric, before any point: $(cat "$WORK/m.out")" || { fail "misspelt metric (exit $rc)"; cat "$WORK/m.out"; }
}
refused_before
# 12. Values whose folder names clean up alike are two points in two folders; a name too long for a file
# name is cut and hashed; each point trained its own value.
long=$(printf 'x%.0s' $(seq 300))
printf 'recipe = "base.toml"\n[grid]\n"log.sample_prompt" = ["a b", "a_b", "%s"]\n' "$long" > "$WORK/names.toml"
"$SEQLAB" sweep "$WORK/names.toml" --out "$WORK/names" > "$WORK/names.out" 2>&1
rc=$?
n_dirs=$(find "$WORK/names" -mindepth 1 -maxdepth 1 -type d | wc -l)
prompts=$(cat "$WORK/names"/*/recipe.toml | sed -n 's/^sample_prompt = "\([^"]*\)".*/\1/p' | sort | cut -c1-5 | tr '\n' '|')
[ "$rc" -eq 0 ] && [ "$n_dirs" -eq 3 ] && [ "$prompts" = "a b|a_b|xxxxx|" ] && [ "$(grep -c ',ok,' "$WORK/names/results.csv")" -eq 3 ] &&
  pass "colliding and over-long folder names: 3 folders, each its own value" ||
  { fail "folder names (exit $rc, $n_dirs folders, prompts $prompts)"; cat "$WORK/names.out"; ls "$WORK/names"; }
# 13. A sweep owns its points: SIGTERM stops the running points at once (each saves a checkpoint, recorded
# as stopped, not failed); SIGKILL of the sweep takes its points with it (none trains on as an orphan).
printf 'recipe = "base.toml"\n[grid]\n"optim.lr" = [1e-3, 2e-3]\n[set]\n"train.steps" = 1000000\n"checkpoint.every" = 0\n"log.eval_every" = 1000000\n' \
  > "$WORK/long.toml"
started() {  # SWEEP_PID: waits until both points have logged a step
  for _ in $(seq 300); do
    [ -s "$WORK/long/lr=0.001/metrics.jsonl" ] && [ -s "$WORK/long/lr=0.002/metrics.jsonl" ] && return 0
    sleep 0.1
  done
  return 1
}
"$SEQLAB" sweep "$WORK/long.toml" --jobs 2 --out "$WORK/long" > "$WORK/long.out" 2>&1 &
sp=$!
started
# One sweep at a time in a folder: a second one (and --report) on it is refused at once, naming the first.
"$SEQLAB" sweep "$WORK/long.toml" --jobs 2 --out "$WORK/long" > "$WORK/second.out" 2>&1
rc2=$?
"$SEQLAB" sweep --report "$WORK/long" > "$WORK/report.out" 2>&1
rc3=$?
[ "$rc2" -eq 2 ] && [ "$rc3" -eq 2 ] && [ "$(wc -l < "$WORK/second.out")" -eq 1 ] &&
  grep -qF "$WORK/long is in use by another sweep (pid $sp " "$WORK/second.out" && grep -qF "in use by another sweep" "$WORK/report.out" &&
  pass "a second sweep on a running sweep's folder is refused: $(cat "$WORK/second.out")" ||
  { fail "a second sweep (exit $rc2, --report exit $rc3)"; cat "$WORK/second.out" "$WORK/report.out"; }
kill -TERM $sp
# The sweep and its points end at once (a few seconds at most); one that does not is a failure, not a hang.
for _ in $(seq 300); do kill -0 $sp 2> /dev/null || break; sleep 0.1; done
if kill -0 $sp 2> /dev/null; then
  fail "SIGTERM: the sweep still runs 30 s later"
  pkill -KILL -P $sp; kill -KILL $sp
fi
wait $sp
rc=$?
[ "$rc" -eq 143 ] && [ "$(grep -c ',stopped,' "$WORK/long/results.csv")" -eq 2 ] && ! ls "$WORK/long"/*.failed > /dev/null 2>&1 &&
  ls "$WORK/long/lr=0.001"/ckpt_*.safetensors > /dev/null 2>&1 && grep -q 'stopped by SIGTERM to the sweep after step' "$WORK/long/lr=0.002.stopped" &&
  pass "SIGTERM: both points stopped at once with a checkpoint, recorded as stopped, exit 143" ||
  { fail "SIGTERM (exit $rc)"; cat "$WORK/long.out"; }
"$SEQLAB" sweep "$WORK/long.toml" --jobs 2 --out "$WORK/long" > "$WORK/long2.out" 2>&1 &
sp=$!
for _ in $(seq 300); do  # both points resumed from their stop
  grep -q 'resumed at step' "$WORK/long/lr=0.001.log" && grep -q 'resumed at step' "$WORK/long/lr=0.002.log" && break
  sleep 0.1
done
kids=$(pgrep -P $sp | tr '\n' ' ')
kill -KILL $sp
wait $sp 2> /dev/null
alive=""
for _ in $(seq 100); do
  alive=""
  for k in $kids; do kill -0 "$k" 2> /dev/null && alive="$alive $k"; done
  [ -z "$alive" ] && break
  sleep 0.1
done
[ -n "$kids" ] && [ -z "$alive" ] && grep -q 'resumed at step' "$WORK/long/lr=0.001.log" &&
  pass "SIGKILL of the sweep: its points ($kids) ended with it; they had resumed from the stop" ||
  { fail "SIGKILL: points '$kids', alive '$alive'"; for k in $alive; do kill -KILL "$k"; done; }
# A second signal ends the points at once (SIGKILL), as a second Ctrl-C ends one run: the sweep is gone
# within seconds, its points with it, recorded as stopped.
"$SEQLAB" sweep "$WORK/long.toml" --jobs 2 --out "$WORK/long" > "$WORK/long3.out" 2>&1 &
sp=$!
for _ in $(seq 300); do
  [ "$(pgrep -P $sp | wc -l)" -eq 2 ] && grep -q '^step' "$WORK/long/lr=0.002.log" 2> /dev/null && break
  sleep 0.1
done
kids=$(pgrep -P $sp | tr '\n' ' ')
kill -TERM $sp; kill -TERM $sp
for _ in $(seq 100); do kill -0 $sp 2> /dev/null || break; sleep 0.1; done
alive=""
for k in $kids $sp; do kill -0 "$k" 2> /dev/null && alive="$alive $k"; done
wait $sp 2> /dev/null
rc=$?
[ -z "$alive" ] && [ "$rc" -eq 143 ] && [ "$(grep -c ',stopped,' "$WORK/long/results.csv")" -eq 2 ] &&
  pass "two signals: the sweep and its points ($kids) gone at once, both points stopped" ||
  { fail "two signals (exit $rc, alive '$alive')"; for k in $alive; do kill -KILL "$k"; done; cat "$WORK/long3.out"; }
# 14. A stale .failed beside a point that finished is gone after the next sweep, its status ok.
echo "seqlab train: an old failure" > "$OUT/mixer=gla,lr=0.001.failed"
"$SEQLAB" sweep "$WORK/s.toml" --out "$OUT" > "$WORK/stale.out" 2>&1
[ $? -eq 0 ] && [ ! -e "$OUT/mixer=gla,lr=0.001.failed" ] && grep -q '^"mixer=gla,lr=0.001",.*,ok,' "$OUT/results.csv" &&
  pass "a stale .failed does not outlive the finished point" || { fail "stale .failed"; cat "$WORK/stale.out"; }
# 15. gnuplot's own warnings (one point per line: "empty x range") stay out of the sweep's output.
! grep -qi 'warning' "$WORK/1.out" "$WORK/exact.out" && pass "no gnuplot warnings in the sweep's output" ||
  { fail "gnuplot warnings"; grep -i warning "$WORK/1.out" "$WORK/exact.out"; }
# 16. The dry run says which points training would refuse (a model too big for the host), and the sweep
# records that reason, not an exit status.
printf 'recipe = "base.toml"\n[grid]\n"model.d_model" = [16, 65536]\n[set]\n"model.n_layers" = 64\n' > "$WORK/big.toml"
"$SEQLAB" sweep "$WORK/big.toml" --out "$WORK/big" --dry-run > "$WORK/big.out" 2>&1
grep -q '^  d_model=65536: REFUSED (training would refuse it): .*model.d_model = 65536 makes the model too big' "$WORK/big.out" &&
  pass "--dry-run names the point training would refuse" || { fail "dry run of a model too big"; cat "$WORK/big.out"; }
"$SEQLAB" sweep "$WORK/big.toml" --out "$WORK/big" > "$WORK/big.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] && grep -q '^- d_model=65536: .*makes the model too big' "$WORK/big/results.md" &&
  pass "a point refused for its size: its own reason in results.md" || { fail "too big (exit $rc)"; cat "$WORK/big/results.md"; }
# 17. A fair comparison (docs/scaling.md): the base recipe leaves norm, FFN, positions and biases at "auto",
# which would resolve to GPT-2's block for attention and RMSNorm/SwiGLU for GLA; the sweep pins them to the
# base's resolution, says so, and the points' recipes are equal in every key but model.mixer.
if python3 - "$OUT/mixer=attention,lr=0.001/recipe.toml" "$OUT/mixer=gla,lr=0.001/recipe.toml" <<'PY'
import sys, tomllib
def flat(path):
    out = {}
    def walk(t, prefix):
        for k, v in t.items():
            if isinstance(v, dict):
                walk(v, prefix + k + ".")
            else:
                out[prefix + k] = v
    walk(tomllib.load(open(path, "rb")), "")
    return out
a, b = flat(sys.argv[1]), flat(sys.argv[2])
differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k] and k not in ("log.out_dir", "parallel.threads"))
assert differ == ["model.mixer"], differ
assert a["model.norm"] == b["model.norm"] == "layernorm" and a["model.mlp"] == "gelu", a
PY
then
  grep -q '^fair comparison: model.mlp = "gelu", model.norm = "layernorm", model.positions = "learned", model.bias = true for every point' "$WORK/1.out" &&
    grep -q "^Every point's block and training settings (resolved), besides the grid's keys: .*model.norm = \"layernorm\"" "$OUT/results.md" &&
    ! grep -q 'Not a fair comparison' "$OUT/results.md" &&
    pass "mixers compared on one block: the points' recipes differ in model.mixer alone, the pins said" ||
    { fail "fair comparison: the note or results.md"; head -3 "$WORK/1.out"; tail -5 "$OUT/results.md"; }
else
  fail "fair comparison: the points' recipes differ in more than model.mixer"
fi
# 18. What the sweep cannot pin is flagged: a base recipe in the older flat spelling of mixer options
# (model.chunk_size) keeps that spelling's meaning — recurrent blocks take the recurrent conventions whatever
# [model] says —, so GLA's points still differ from attention's in their block: the dry run and results.md
# name each such key with its values.
sed 's/^n_heads = 2$/n_heads = 2\nchunk_size = 16/' "$WORK/base.toml" > "$WORK/flat.toml"
printf 'recipe = "flat.toml"\n[grid]\n"model.mixer" = ["attention", "gla"]\n' > "$WORK/unfair.toml"
"$SEQLAB" sweep "$WORK/unfair.toml" --out "$WORK/unfair" --dry-run > "$WORK/unfair.out" 2>&1
n_dry=$(grep -c '^NOT A FAIR COMPARISON: model\.\(mlp\|norm\|positions\|bias\) differs between points' "$WORK/unfair.out")
"$SEQLAB" sweep "$WORK/unfair.toml" --out "$WORK/unfair" > /dev/null 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ "$n_dry" -eq 4 ] && grep -q '^\*\*Not a fair comparison\*\*' "$WORK/unfair/results.md" &&
  grep -q '^- model.norm: "layernorm" (mixer=attention), "rmsnorm" (mixer=gla)$' "$WORK/unfair/results.md" &&
  pass "confounds the sweep cannot pin are flagged in the dry run and results.md" ||
  { fail "confounds (exit $rc, $n_dry dry-run flags)"; cat "$WORK/unfair.out"; cat "$WORK/unfair/results.md"; }
echo "failures: $failures"
[ "$failures" -eq 0 ]
