#!/usr/bin/env bash
# `seqlab recipe check` on malformed recipes and overrides: each ends in exit code 2 and exactly one
# line on stderr that starts with the file (or the --set) and names the problem. Positive controls
# check that a good recipe passes and that its resolved form checks to the same text.
# Usage: recipe_errors_test.sh /path/to/seqlab
set -u
SEQLAB=${1:?usage: $0 /path/to/seqlab}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0

# expect_error NAME PREFIX WANT ARGS...: `seqlab recipe ARGS` must fail with one line on stderr that
# starts with PREFIX and contains WANT.
expect_error() {
  local name=$1 prefix=$2 want=$3
  shift 3
  "$SEQLAB" recipe "$@" > "$WORK/stdout" 2> "$WORK/stderr"
  local rc=$? problem="" lines
  lines=$(wc -l < "$WORK/stderr")
  if [ "$rc" -ne 2 ]; then problem="exit code $rc, not 2"
  elif [ "$lines" -ne 1 ]; then problem="$lines lines on stderr, not 1"
  elif [ "${prefix}" != "$(head -c ${#prefix} "$WORK/stderr")" ]; then problem="stderr does not start with '$prefix'"
  elif ! grep -qF -- "$want" "$WORK/stderr"; then problem="message lacks '$want'"
  elif [ -s "$WORK/stdout" ]; then problem="something was printed on stdout"
  fi
  if [ -n "$problem" ]; then
    echo "FAIL $name: $problem"
    sed 's/^/  stderr: /' "$WORK/stderr"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(cat "$WORK/stderr")"
  fi
}

# recipe NAME TEXT: writes $WORK/NAME.toml and sets F to its path.
recipe() {
  F=$WORK/$1.toml
  printf '%s\n' "$2" > "$F"
}

recipe unknown_key $'[train]\nstep = 100'
expect_error "unknown key" "$F:2: " "unknown key train.step (did you mean train.steps?)" check "$F"

recipe wrong_section $'[optim]\nlr = 1e-3\nsteps = 100'
expect_error "key in the wrong section" "$F:3: " "unknown key optim.steps (did you mean train.steps?)" check "$F"

recipe unknown_section $'[model]\nd_model = 128\n\n[trian]\nsteps = 10'
expect_error "unknown section" "$F:4: " "unknown section [trian] (did you mean [train]?)" check "$F"

recipe outside $'steps = 10\n[train]'
expect_error "key outside any section" "$F:1: " "steps is outside any section (did you mean train.steps" check "$F"

recipe wrong_type $'# a comment\n[train]\nbatch_size = 4\nsteps = "ten"'
expect_error "wrong type" "$F:4: " 'train.steps must be an integer ≥ 1, got a string "ten"' check "$F"

recipe negative_steps $'[train]\nsteps = -5'
expect_error "negative steps" "$F:2: " "train.steps must be an integer ≥ 1, got -5" check "$F"

recipe bad_range $'[model]\ndropout = 1.5'
expect_error "number out of range" "$F:2: " "model.dropout must be a number in [0, 1), got 1.5" check "$F"

recipe bad_choice $'[optim]\nschedule = "cosin"'
expect_error "bad choice" "$F:2: " \
  'optim.schedule must be one of "cosine", "linear", "constant", got "cosin" (did you mean "cosine"?)' check "$F"

recipe syntax $'[train]\nsteps = = 3'
expect_error "TOML syntax error" "$F:2:" "TOML syntax error" check "$F"

recipe duplicate $'[train]\nsteps = 3\nsteps = 4'
expect_error "key given twice" "$F:3:" "TOML syntax error" check "$F"

recipe heads $'[model]\nd_model = 256\nn_heads = 3'
expect_error "n_heads not dividing d_model" "$F:3: " "model.n_heads = 3 must divide model.d_model = 256" check "$F"

recipe kv_heads $'[model]\nn_kv_heads = 3'
expect_error "n_kv_heads not dividing n_heads" "$F:2: " "model.n_kv_heads = 3 must divide model.n_heads = 4" check "$F"

recipe bpe $'[data]\ntokenizer = "bpe"'
expect_error "bpe without tokenizer_path" "$F:2: " 'data.tokenizer = "bpe" needs data.tokenizer_path' check "$F"

expect_error "missing file" "recipe not found: $WORK/nope.toml" "nope.toml" check "$WORK/nope.toml"

recipe good $'[train]\nsteps = 100'
expect_error "override without =" "--set train.steps:" "expected section.key=value" check "$F" --set train.steps
expect_error "override without section" "--set steps=5:" "(did you mean train.steps?)" check "$F" --set steps=5
expect_error "override of unknown key" "--set train.stpes=5:" "unknown key train.stpes (did you mean train.steps?)" \
  check "$F" --set train.stpes=5
expect_error "override of unknown section" "--set trian.steps=5:" "unknown section [trian]" check "$F" --set trian.steps=5
expect_error "override of wrong type" "--set train.steps=abc:" "train.steps must be an integer ≥ 1, got abc" \
  check "$F" --set train.steps=abc
# An integer beyond TOML's 64 bits is not "a string": the message says what is wrong with it.
expect_error "override beyond 64 bits" "--set train.seed=99999999999999999999:" \
  "train.seed must be an integer ≥ 0, got 99999999999999999999, beyond the 64 bits of a TOML integer (at most 2^63 - 1)" \
  check "$F" --set train.seed=99999999999999999999
expect_error "override with bad choice" "--set model.norm=batchnorm:" 'one of "auto", "layernorm", "rmsnorm"' \
  check "$F" --set=model.norm=batchnorm
expect_error "override breaking a rule" "--set parallel.sp=3:" \
  "parallel.sp = 3 needs train.seq_len divisible by 2·sp = 6 (each rank holds 2 of the sequence's 2·sp chunks); train.seq_len = 256 is not" \
  check "$F" --set optim.lr=0.01 --set parallel.sp=3

# Misuse of the subcommand itself.
expect_error "no recipe" "seqlab recipe: " "check needs a recipe file" check
expect_error "--set without value" "seqlab recipe: " "--set needs section.key=value" check "$F" --set
expect_error "unknown flag" "seqlab recipe: " "unknown flag '--frobnicate'" check "$F" --frobnicate
expect_error "two recipes" "seqlab recipe: " "unexpected argument" check "$F" "$F"
expect_error "unknown subcommand" "seqlab recipe: " "unknown subcommand 'chekc'" chekc "$F"

# Positive controls: the shipped recipe passes with overrides, and its resolved form, checked again
# from another file name, prints the same keys and values.
if "$SEQLAB" recipe check "$SRC/recipes/gpt_small.toml" --set optim.lr=3e-4 --set optim.schedule=linear \
     > "$WORK/resolved.toml" 2> "$WORK/stderr" && [ ! -s "$WORK/stderr" ] &&
   grep -q '^lr = 3e-4 ' "$WORK/resolved.toml" && grep -q '^schedule = "linear" ' "$WORK/resolved.toml"; then
  echo "ok   gpt_small with overrides resolves"
else
  echo "FAIL gpt_small with overrides: $(cat "$WORK/stderr")"; failures=$((failures + 1))
fi
if "$SEQLAB" recipe check "$WORK/resolved.toml" > "$WORK/again.toml" 2> "$WORK/stderr" &&
   diff <(grep -v '^#' "$WORK/resolved.toml") <(grep -v '^#' "$WORK/again.toml") > /dev/null; then
  echo "ok   the resolved recipe checks to the same values"
else
  echo "FAIL resolved recipe round trip: $(cat "$WORK/stderr")"; failures=$((failures + 1))
fi
if "$SEQLAB" recipe --doc | cmp -s - "$SRC/docs/recipes.md"; then
  echo "ok   seqlab recipe --doc prints docs/recipes.md"
else
  echo "FAIL seqlab recipe --doc differs from docs/recipes.md"; failures=$((failures + 1))
fi

echo "failures: $failures"
[ "$failures" -eq 0 ]
