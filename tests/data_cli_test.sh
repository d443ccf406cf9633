#!/usr/bin/env bash
# `seqlab tokenizer` and `seqlab prepare` end to end on a tiny corpus, and each misuse ending in exit
# code 2 with exactly one line on stderr. Usage: data_cli_test.sh /path/to/seqlab
set -u
SEQLAB=${1:?usage: $0 /path/to/seqlab}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for i in $(seq 1 30); do printf 'the fortune number %d says hello\n%%\n' "$i"; done > "$WORK/corpus"

# tokenizer train + encode
"$SEQLAB" tokenizer train --input "$WORK/corpus" --vocab 300 --out "$WORK/bpe.txt" > "$WORK/out" 2>&1 || fail "tokenizer train: $(cat "$WORK/out")"
[ "$(head -n 1 "$WORK/bpe.txt")" = "seqlab-bpe 1" ] || fail "merges file header"
[ "$(wc -l < "$WORK/bpe.txt")" -eq 26 ] || fail "expected 25 merges, got $(($(wc -l < "$WORK/bpe.txt") - 1))"
ids=$("$SEQLAB" tokenizer encode --text "hi!" | head -n 1)
[ "$ids" = "104 105 33" ] || fail "byte encode gave '$ids'"
n=$("$SEQLAB" tokenizer encode --tokenizer "$WORK/bpe.txt" --text " fortune" | head -n 1 | wc -w)
[ "$n" -eq 1 ] || fail "' fortune' should be one BPE token, got $n"

# prepare: shards and meta.json
"$SEQLAB" prepare --input "$WORK/corpus" --out "$WORK/data" --val-fraction 0.1 --seed 2 > "$WORK/out" 2>&1 || fail "prepare: $(cat "$WORK/out")"
for f in train_000000.bin val_000000.bin meta.json; do [ -f "$WORK/data/$f" ] || fail "prepare did not write $f"; done
grep -q '"val_documents": 3,' "$WORK/data/meta.json" || fail "meta.json: $(cat "$WORK/data/meta.json")"
magic=$(od -An -t d4 -N 12 "$WORK/data/train_000000.bin" | tr -s ' ')
count=$(grep -o '"train_tokens": [0-9]*' "$WORK/data/meta.json" | grep -o '[0-9]*$')
[ "$magic" = " 20240520 1 $count" ] || fail "shard header '$magic' (train tokens $count)"
"$SEQLAB" prepare --input "$WORK/corpus" --out "$WORK/bpe_data" --tokenizer-path "$WORK/bpe.txt" > "$WORK/out" 2>&1 ||
  fail "prepare with bpe: $(cat "$WORK/out")"
grep -q '"tokenizer": "bpe"' "$WORK/bpe_data/meta.json" || fail "bpe meta.json"

# expect_error WANT ARGS...: exit 2, one line on stderr containing WANT.
expect_error() {
  local want=$1
  shift
  "$SEQLAB" "$@" > /dev/null 2> "$WORK/err"
  local rc=$?
  [ $rc -eq 2 ] || fail "$* exited $rc, not 2"
  [ "$(wc -l < "$WORK/err")" -eq 1 ] || fail "$* wrote $(wc -l < "$WORK/err") lines on stderr: $(cat "$WORK/err")"
  grep -qF -- "$want" "$WORK/err" || fail "$*: '$(cat "$WORK/err")' lacks '$want'"
}
printf 'seqlab-bpe 1\n104 101\n999 1\n' > "$WORK/bad.txt"
expect_error "seqlab prepare: --out DIR is required" prepare
expect_error "$WORK/absent: no such file or folder" prepare --out "$WORK/x" --input "$WORK/absent"
expect_error "--val-fraction expects a number" prepare --out "$WORK/x" --val-fraction half
expect_error "--val-fraction expects a number in [0, 1), got '1.5'" prepare --out "$WORK/x" --input "$WORK/corpus" --val-fraction 1.5
# A numeric flag out of its range is told the range, naming the flag (issue 26).
expect_error "--seed expects an integer from 0 to 2^64 - 1, got '-1'" prepare --out "$WORK/x" --input "$WORK/corpus" --seed -1
expect_error "--shard-tokens expects an integer from 1 to 2^63 - 1, got '0'" prepare --out "$WORK/x" --input "$WORK/corpus" --shard-tokens 0
expect_error "--vocab expects an integer from -2^31 to 2^31 - 1, got '99999999999'" tokenizer train --input "$WORK/corpus" --vocab 99999999999 --out "$WORK/y"
expect_error "unknown flag '--vocab'" prepare --out "$WORK/x" --vocab 3
expect_error "$WORK/bad.txt:3: id 999 is not defined yet" prepare --out "$WORK/x" --input "$WORK/corpus" --tokenizer-path "$WORK/bad.txt"
expect_error "unknown document format 'csv'" prepare --out "$WORK/x" --format csv
expect_error "expected train or encode" tokenizer
expect_error "unknown subcommand 'learn'" tokenizer learn
expect_error "--vocab N is required" tokenizer train --out "$WORK/y"
expect_error "below 275" tokenizer train --input "$WORK/corpus" --vocab 10 --out "$WORK/y"
[ -e "$WORK/x" ] && fail "a failed prepare left $WORK/x behind"

if [ $failures -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all data CLI checks passed"
