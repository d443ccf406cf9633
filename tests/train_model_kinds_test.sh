#!/usr/bin/env bash
# BERT (model.arch = "encoder", data.objective = "masked_lm" with the next-sentence head) and T5
# ("encoder_decoder", "span_corruption") at the command line, tiny: each trains, logs its accuracy
# fields, resumes from a middle checkpoint with identical losses at every step, trains with --nproc 2
# to the losses of one process, evaluates a checkpoint (./train eval) and samples (BERT fills [MASK],
# T5 writes the sentinels' spans). Recipes that mix the kinds up are refused in one line.
# Usage: train_model_kinds_test.sh /path/to/seqlab
set -u
SEQLAB="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/train_script_util.sh"
word_corpus "$WORK/corpus.txt" 7 300 14
common() {
  cat <<TOML
[data]
path = "$WORK/corpus.txt"
format = "text"
val_fraction = 0.2
cache_dir = "$WORK/cache"
objective = "$1"
[train]
device = "cpu"
steps = 6
batch_size = 4
seq_len = 24
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
}
{ printf '[model]\narch = "encoder"\nd_model = 16\nn_layers = 2\nn_heads = 2\nsegments = 2\n'
  common masked_lm; } > "$WORK/bert.toml"
sed -i 's/^objective = "masked_lm"$/objective = "masked_lm"\nnext_sentence = true/' "$WORK/bert.toml"
{ printf '[model]\narch = "encoder_decoder"\nd_model = 16\nn_layers = 1\nn_heads = 2\ndecoder_layers = 2\n'
  printf '[model.attention]\nscale = 1.0\n'
  common span_corruption; } > "$WORK/t5.toml"

for model in bert t5; do
  "$SEQLAB" "$WORK/$model.toml" --out "$WORK/$model-a" > "$WORK/$model-a.log" 2>&1 || { fail "$model: training"; cat "$WORK/$model-a.log"; continue; }
  grep -q '"val_acc"' "$WORK/$model-a/metrics.jsonl" && pass "$model: val_acc logged" || fail "$model: no val_acc"
  if [ "$model" = bert ]; then
    grep -q '"val_nsp_acc"' "$WORK/$model-a/metrics.jsonl" && pass "bert: val_nsp_acc logged" || fail "bert: no val_nsp_acc"
    grep -q 'masked acc' "$WORK/$model-a.log" && pass "bert: progress line names the masked accuracy" || fail "bert: progress line"
  else
    grep -q 'span acc' "$WORK/$model-a.log" && pass "t5: progress line names the span accuracy" || fail "t5: progress line"
  fi
  cp -r "$WORK/$model-a" "$WORK/$model-b"
  rm "$WORK/$model-b/ckpt_0000006.safetensors"
  "$SEQLAB" --resume "$WORK/$model-b" > /dev/null 2>&1 || fail "$model: resumed run"
  same_losses "$model: resume from step 3" "$WORK/$model-a" "$WORK/$model-b"
  "$SEQLAB" "$WORK/$model.toml" --nproc 2 --out "$WORK/$model-2" > /dev/null 2> "$WORK/$model-2.err" \
    || { fail "$model: --nproc 2"; cat "$WORK/$model-2.err"; }
  close_losses "$model --nproc 2: the losses of one process" "$WORK/$model-a" "$WORK/$model-2"
  "$SEQLAB" eval "$WORK/$model-a" > "$WORK/$model-eval.out" 2>&1 && grep -q "val_loss" "$WORK/$model-eval.out" \
    && pass "$model: ./train eval" || { fail "$model: eval"; cat "$WORK/$model-eval.out"; }
done

out=$("$SEQLAB" sample "$WORK/bert-a" --prompt "the [MASK] sat on a [MASK]." --temperature 0 2>&1)
if [ $? -eq 0 ] && [ -n "$out" ] && ! grep -q '\[MASK\]' <<< "$out"; then pass "bert: sample fills every [MASK]"; else fail "bert: sample: $out"; fi
out=$("$SEQLAB" sample "$WORK/t5-a" --prompt "the <extra_id_0> sat on a mat." --temperature 0 --tokens 12 2>&1)
if [ $? -eq 0 ] && grep -q '^(decoder: ' <<< "$out"; then pass "t5: sample writes the decoder's spans"; else fail "t5: sample: $out"; fi

# Refusals, one line and exit code 2.
refused() {
  local name="$1" want="$2"; shift 2
  out=$("$SEQLAB" recipe check "$@" 2>&1); rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <<< "$out")" -eq 1 ] && grep -qF -- "$want" <<< "$out"; then pass "$name"; else fail "$name: rc $rc: $out"; fi
}
refused "masked_lm on a decoder" 'data.objective = "masked_lm" trains model.arch = "encoder", but model.arch = "decoder"' \
  "$WORK/bert.toml" --set 'model.arch="decoder"' --set model.segments=0
refused "an encoder of a causal mixer" 'needs bidirectional blocks, but mixer '"'"'gla'"'"' is causal only' \
  "$WORK/bert.toml" --set 'model.mixer="gla"'
refused "sequence parallelism on an encoder" 'trains model.arch = "decoder" only' "$WORK/bert.toml" --set parallel.sp=2
refused "segments on a decoder" 'model.segments = 2 is read only by model.arch = "encoder"' \
  "$WORK/t5.toml" --set model.segments=2

[ "$failures" -eq 0 ] || exit 1
