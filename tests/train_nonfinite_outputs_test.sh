#!/usr/bin/env bash
# Non-finite numbers never reach a JSON file, nor a sample (docs/reliability.md, "Results that never lie"):
# a tiny run made to diverge (optim.lr = 1e30) under train.on_nonfinite = "skip" and "stop"; every *.json
# and *.jsonl file of both run folders and the JSON line of `./train eval` must parse under a strict
# reader (Python's json with NaN and Infinity refused), the diverged evaluations being null — the
# @L fields of eval.seq_len too. `./train sample` of the diverged model, whose logits are NaN, is refused
# in one line with exit code 2 instead of printing NUL bytes, and samples.txt says there was no sample.
# Usage: train_nonfinite_outputs_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 5 200 12
tiny_model_and_data "$WORK/tiny.toml" "$WORK"
cat >> "$WORK/tiny.toml" <<TOML
[train]
device = "cpu"
steps = 6
batch_size = 2
seq_len = 16
max_skipped = 100
[optim]
lr = 1e30               # diverges at once: every update after the first is not finite
warmup_steps = 1
[eval]
seq_len = [8]
[log]
every = 1
eval_every = 3
eval_batches = 2
sample_every = 3
sample_tokens = 4
progress = "plain"
[checkpoint]
every = 3
TOML

# strict_json NAME FILE...: every line of every FILE is a JSON value under a reader that refuses NaN and
# Infinity (and -nan, inf: not JSON at all); prints how many lines held a null.
strict_json() {
  local name=$1
  shift
  if python3 - "$@" > "$WORK/json.out" 2>&1 <<'PY'
import json, sys
def refuse(constant):
    raise ValueError(f"not JSON: {constant}")
nulls = lines = 0
for path in sys.argv[1:]:
    for number, line in enumerate(open(path), 1):
        try:
            value = json.loads(line, parse_constant=refuse)
        except ValueError as e:
            sys.exit(f"{path}:{number}: {e}: {line.strip()}")
        lines += 1
        nulls += isinstance(value, dict) and any(v is None for v in value.values())
print(f"{lines} lines, {nulls} with null")
PY
  then pass "$name: $(cat "$WORK/json.out")"; else fail "$name: $(cat "$WORK/json.out")"; fi
}

"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/skip" --set train.on_nonfinite=skip > /dev/null 2> "$WORK/skip.err"
rc=$?
[ "$rc" -eq 0 ] && pass "a run that skips its non-finite steps ends" || fail "skip run: exit $rc: $(cat "$WORK/skip.err")"
"$SEQLAB" "$WORK/tiny.toml" --out "$WORK/stop" > /dev/null 2> "$WORK/stop.err"
rc=$?
[ "$rc" -eq 3 ] && pass "a run that stops on its first non-finite step exits with 3" || fail "stop run: exit $rc"
"$SEQLAB" eval "$WORK/skip" > "$WORK/eval.out" 2> "$WORK/eval.err" || fail "eval: $(cat "$WORK/eval.err")"
tail -n 1 "$WORK/eval.out" > "$WORK/eval.jsonl"

strict_json "every JSON file of the skipping run" $(find "$WORK/skip" -name '*.json' -o -name '*.jsonl')
strict_json "every JSON file of the stopped run" $(find "$WORK/stop" -name '*.json' -o -name '*.jsonl')
strict_json "the JSON line of ./train eval" "$WORK/eval.jsonl"
python3 - "$WORK/skip/metrics.jsonl" "$WORK/eval.jsonl" 2> /dev/null <<'PY' && pass "diverged evaluations are null, @8 included" || fail "null fields"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
scored = json.loads(open(sys.argv[2]).read())
for line in (last, scored):
    for key in ("val_loss", "val_ppl", "val_bpb", "val_loss@8", "val_ppl@8"):
        if line.get(key, 0) is not None:
            sys.exit(f"{key} is {line.get(key, 'missing')} in {line}")
PY

# The diverged model's logits are NaN: sample refuses, training wrote no NUL bytes.
"$SEQLAB" sample "$WORK/skip" --tokens 4 > "$WORK/sample.out" 2> "$WORK/sample.err"
rc=$?
if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/sample.err")" -eq 1 ] && grep -q "logits are not finite" "$WORK/sample.err" \
   && ! tr -d '\n' < "$WORK/sample.out" | grep -q .; then
  pass "sample refuses NaN logits: $(cat "$WORK/sample.err")"
else
  fail "sample of NaN logits: exit $rc: $(cat "$WORK/sample.err") stdout $(od -c "$WORK/sample.out" | head -2)"
fi
if grep -q "^(no sample: .*logits are not finite" "$WORK/skip/samples.txt" && ! tr -d '\n' < "$WORK/skip/samples.txt" | grep -qP '\x00'; then
  pass "samples.txt says there was no sample"
else
  fail "samples.txt: $(od -c "$WORK/skip/samples.txt" | head -3)"
fi
echo "failures: $failures"
[ "$failures" -eq 0 ]
