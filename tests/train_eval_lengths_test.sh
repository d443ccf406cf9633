#!/usr/bin/env bash
# Evaluation at other lengths than training (eval.seq_len): every evaluation line holds val_loss@L, val_ppl@L,
# val_bpb@L (val_acc@L for a synthetic task) for each listed length, finite; at L = train.seq_len the very
# values of val_loss; the training itself is the run's without eval.seq_len, field for field; and what cannot
# be evaluated (learned positions past train.seq_len, a val split too short for L, a synthetic task that
# does not fit in L) is one line naming eval.seq_len[i] and exit code 2, before any step. Sequence
# parallelism puts no condition on the lengths. `seqlab eval RUN` scores a finished run's checkpoint the same
# way, at the recipe's lengths or others given with --set.
# Usage: train_eval_lengths_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"

word_corpus "$WORK/corpus.txt" 7 300 12
cat > "$WORK/tiny.toml" <<TOML
[model]
d_model = 16
n_layers = 1
n_heads = 2
positions = "rope"      # attention that runs at any length
[data]
path = "$WORK/corpus.txt"
cache_dir = "$WORK/cache"
[train]
device = "cpu"
steps = 12
batch_size = 4
seq_len = 32
[optim]
lr = 3e-3
warmup_steps = 2
[log]
every = 3
eval_every = 6
eval_batches = 2
sample_every = 0
progress = "plain"
TOML

# FIELDS... must be in every evaluation line of RUN, finite; prints nothing, exits 1 naming what is wrong.
check_fields() {
  python3 - "$@" <<'PY'
import json, math, sys
run, fields = sys.argv[1], sys.argv[2:]
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
evals = [l for l in lines if "val_loss" in l]
if len(evals) < 2:
    sys.exit(f"{len(evals)} evaluation lines")
for l in evals:
    for f in fields:
        if f not in l or not math.isfinite(l[f]):
            sys.exit(f"step {l['step']}: {f} missing or not finite: {l}")
PY
}

# The plain run, then the same recipe scored at 16, 32 (= train.seq_len) and 64 tokens.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/plain" > "$WORK/plain.txt" 2>&1 || { cat "$WORK/plain.txt"; fail "plain run"; }
grep -q '@' "$WORK/plain/metrics.jsonl" && fail "a run without eval.seq_len logged per-length fields" \
  || pass "without eval.seq_len: no per-length fields"
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/lengths" --set 'eval.seq_len=[16, 32, 64]' > "$WORK/lengths.txt" 2>&1 \
  || { cat "$WORK/lengths.txt"; fail "run with eval.seq_len"; }
if out=$(check_fields "$WORK/lengths" val_loss@16 val_ppl@16 val_bpb@16 val_loss@32 val_loss@64 val_ppl@64 val_bpb@64 2>&1); then
  pass "val_loss, val_ppl and val_bpb at 16, 32 and 64 tokens, finite, at every evaluation"
else
  fail "per-length fields: $out"
fi
# At train.seq_len the per-length fields are val_loss's own (the same text in the line).
if python3 - "$WORK/lengths/metrics.jsonl" <<'PY'
import json, sys
for text in open(sys.argv[1]):
    l = json.loads(text)
    if "val_loss" not in l:
        continue
    for f in ("val_loss", "val_ppl", "val_bpb"):
        if l[f + "@32"] != l[f]:
            sys.exit(f"step {l['step']}: {f}@32 = {l[f + '@32']} but {f} = {l[f]}")
    if len({l["val_loss@16"], l["val_loss@32"], l["val_loss@64"]}) != 3:
        sys.exit(f"step {l['step']}: the lengths gave the same loss, as if one length had been scored thrice")
PY
then pass "val_loss@32 is val_loss (train.seq_len), the other lengths differ"; else fail "val_loss@32 against val_loss"; fi
# Evaluating at other lengths changes nothing of the training: every field of the plain run is there, equal.
if python3 - "$WORK/plain/metrics.jsonl" "$WORK/lengths/metrics.jsonl" <<'PY'
import json, sys
timing = {"tokens_per_s", "mfu", "elapsed_s"}
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
if len(a) != len(b):
    sys.exit(f"{len(a)} lines against {len(b)}")
for x, y in zip(a, b):
    for k, v in x.items():
        if k not in timing and y.get(k) != v:
            sys.exit(f"step {x['step']}: {k} = {v} without eval.seq_len, {y.get(k)} with it")
PY
then pass "the same training and val_loss with and without eval.seq_len"; else fail "eval.seq_len changed the training"; fi
grep -q "step 12: at 64 tokens: val_loss" "$WORK/lengths.txt" && pass "the progress lines show each length" \
  || fail "no progress line for 64 tokens"
grep -q '^seq_len = \[16, 32, 64\]' "$WORK/lengths/recipe.toml" && pass "the resolved recipe holds eval.seq_len" \
  || fail "eval.seq_len not in recipe.toml"

# Sequence parallelism leaves the lengths free (evaluation runs on rank 0 alone, on whole sequences): lengths
# that 2·sp does not divide, under parallel.sp = 2, give the values of one process.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/sp" --nproc 2 --set parallel.sp=2 --set parallel.threads=1 \
  --set eval.seq_len=17,50 > "$WORK/sp.txt" 2>&1 || { cat "$WORK/sp.txt"; fail "run with parallel.sp = 2"; }
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/one" --set parallel.threads=1 --set eval.seq_len=17,50 > "$WORK/one.txt" 2>&1 \
  || { cat "$WORK/one.txt"; fail "run in one process"; }
if out=$(check_fields "$WORK/sp" val_loss@17 val_loss@50 2>&1) && python3 - "$WORK/sp/metrics.jsonl" "$WORK/one/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l]
b = [json.loads(l) for l in open(sys.argv[2]) if "val_loss" in l]
for x, y in zip(a, b):
    for k in ("val_loss@17", "val_loss@50"):
        if abs(x[k] - y[k]) > 1e-5 * abs(y[k]):
            sys.exit(f"step {x['step']}: {k} {x[k]} with sp = 2, {y[k]} in one process")
PY
then pass "parallel.sp = 2: lengths 17 and 50 scored as in one process"; else fail "sequence parallelism: $out"; fi

# A synthetic task at longer sequences: induction generated at 48 tokens for a GLA model trained at 16.
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/induction" --set data.source=induction --set data.task_vocab=12 \
  --set model.mixer=gla --set train.seq_len=16 --set eval.seq_len=16,48 > "$WORK/induction.txt" 2>&1 \
  || { cat "$WORK/induction.txt"; fail "induction run"; }
if out=$(check_fields "$WORK/induction" val_acc val_acc@16 val_acc@48 val_loss@48 2>&1) && python3 - "$WORK/induction/metrics.jsonl" <<'PY'
import json, sys
for text in open(sys.argv[1]):
    l = json.loads(text)
    if "val_loss" in l and (l["val_acc@16"] != l["val_acc"] or l["val_loss@16"] != l["val_loss"]):
        sys.exit(f"step {l['step']}: at 16 tokens {l['val_acc@16']}, {l['val_loss@16']}; val_acc {l['val_acc']}, val_loss {l['val_loss']}")
    if "val_loss" in l and not 0 <= l["val_acc@48"] <= 1:
        sys.exit(f"step {l['step']}: val_acc@48 = {l['val_acc@48']}")
PY
then pass "induction: val_acc@48 beside val_acc, which val_acc@16 repeats"; else fail "induction: $out"; fi

# What cannot be evaluated: exit code 2, one line naming the key, before any step.
expect_usage_error() {  # NAME WANT ARGS...
  local name=$1 want=$2
  shift 2
  rm -rf "$WORK/bad"
  "$SEQLAB" "$@" --out "$WORK/bad" > /dev/null 2> "$WORK/stderr"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/stderr")" -eq 1 ] && grep -qF -- "$want" "$WORK/stderr" \
     && ! ls "$WORK/bad" 2> /dev/null | grep -q safetensors; then
    pass "$name: $(cat "$WORK/stderr")"
  else
    fail "$name: exit $rc: $(cat "$WORK/stderr")"
  fi
}
expect_usage_error "learned positions past train.seq_len" \
  "--set eval.seq_len=[16,64]: eval.seq_len[1] = 64 is longer than train.seq_len = 32: model.positions = \"learned\"" \
  "$WORK/tiny.toml" --set model.positions=learned --set 'eval.seq_len=[16,64]'
expect_usage_error "a length beyond the val split" "eval.seq_len[1] = 100000: " \
  "$WORK/tiny.toml" --set 'eval.seq_len=[64,100000]'
expect_usage_error "a synthetic task that does not fit" "eval.seq_len[0] = 8: data: mqar: 2 × (num_pairs + num_queries) = 16 tokens exceed seq_len 8" \
  "$WORK/tiny.toml" --set data.source=mqar --set data.task_vocab=16 --set data.task_num_pairs=4 --set eval.seq_len=8
expect_usage_error "a length of 0" "--set eval.seq_len=[32,0]: eval.seq_len[1] must be an integer ≥ 1, got 0" \
  "$WORK/tiny.toml" --set 'eval.seq_len=[32,0]'

# seqlab eval: a finished run scored again from its last checkpoint gives its last evaluation's fields, bit for
# bit; at lengths the run never evaluated, the same fields named @L; what cannot be scored, exit 2 and one line.
"$SEQLAB" eval "$WORK/plain" > "$WORK/eval.txt" 2>&1 || { cat "$WORK/eval.txt"; fail "seqlab eval RUN"; }
if python3 - "$WORK/plain/metrics.jsonl" "$WORK/eval.txt" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][-1]
got = json.loads(open(sys.argv[2]).read().splitlines()[-1])
want = {k: v for k, v in last.items() if k == "step" or k.startswith("val_")}
if got != want:
    sys.exit(f"seqlab eval printed {got}, the run's last evaluation was {want}")
PY
then pass "seqlab eval RUN: the run's last evaluation again"; else fail "seqlab eval RUN: $(tail -n 1 "$WORK/eval.txt")"; fi
"$SEQLAB" eval "$WORK/lengths" --set 'eval.seq_len=[64,128]' > "$WORK/eval2.txt" 2>&1 \
  || { cat "$WORK/eval2.txt"; fail "seqlab eval RUN --set eval.seq_len"; }
if python3 - "$WORK/lengths/metrics.jsonl" "$WORK/eval2.txt" <<'PY'
import json, math, sys
last = [json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][-1]
got = json.loads(open(sys.argv[2]).read().splitlines()[-1])
if got["val_loss"] != last["val_loss"] or got["val_loss@64"] != last["val_loss@64"]:
    sys.exit(f"{got} against the run's {last}")
if "val_loss@16" in got or not math.isfinite(got.get("val_loss@128", math.nan)):
    sys.exit(f"expected the lengths 64 and 128 only: {got}")
PY
then pass "seqlab eval --set eval.seq_len=[64,128]: 64 as the run scored it, 128 new"; else fail "seqlab eval at new lengths"; fi
expect_eval_error() {  # NAME WANT ARGS...
  local name=$1 want=$2
  shift 2
  "$SEQLAB" eval "$@" > /dev/null 2> "$WORK/stderr"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/stderr")" -eq 1 ] && grep -qF -- "$want" "$WORK/stderr"; then
    pass "seqlab eval, $name: $(cat "$WORK/stderr")"
  else
    fail "seqlab eval, $name: exit $rc: $(cat "$WORK/stderr")"
  fi
}
expect_eval_error "no run" "no such run directory" "$WORK/none"
expect_eval_error "a missing checkpoint" "cannot open" "$WORK/plain" --checkpoint "$WORK/none.safetensors"
expect_eval_error "a model the checkpoint does not hold" "the recipe's model has" "$WORK/plain" --set model.d_model=32
expect_eval_error "learned positions past train.seq_len" "is longer than train.seq_len = 32" \
  "$WORK/plain" --set model.positions=learned --set 'eval.seq_len=[64]'
echo "failures: $failures"
[ "$failures" -eq 0 ]
