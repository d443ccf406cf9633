#!/usr/bin/env bash
# Each way `seqlab op` can be misused ends in exit code 2, exactly one line on stderr starting with
# "seqlab op: ", and an output folder left as it was. Usage: op_runner_errors_test.sh /path/to/seqlab
# The .npy inputs are written byte by byte here, so the test needs nothing but bash.
set -u
SEQLAB=${1:?usage: $0 /path/to/seqlab}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0

# npy FILE DESCR SHAPE DATA: a version 1.0 .npy file; DATA is printf escapes of the raw bytes, so
# it is passed as printf's format on purpose.
# shellcheck disable=SC2059
npy() {
  local dict="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
  local pad=$(( (64 - (10 + ${#dict} + 1) % 64) % 64 ))
  local len=$(( ${#dict} + pad + 1 ))
  {
    printf '\x93NUMPY\x01\x00'
    printf "\\x$(printf %02x $((len & 255)))\\x$(printf %02x $((len >> 8)))"
    printf '%s%*s\n' "$dict" "$pad" ''
    printf "$4"
  } > "$1"
}
F64_1='\x00\x00\x00\x00\x00\x00\xf0\x3f'
F64_2='\x00\x00\x00\x00\x00\x00\x00\x40'
F32_0='\x00\x00\x00\x00'
F32_1='\x00\x00\x80\x3f'

# fresh NAME: an input folder $WORK/NAME/in and an output folder holding only a marker file.
fresh() {
  IN=$WORK/$1/in OUT=$WORK/$1/out
  mkdir -p "$IN" "$OUT"
  echo keep > "$OUT/marker"
}

# expect_error NAME WANT ARGS...: runs seqlab op ARGS, which must fail cleanly with WANT in its message.
expect_error() {
  local name=$1 want=$2
  shift 2
  "$SEQLAB" op "$@" > "$WORK/stdout" 2> "$WORK/stderr"
  local rc=$? problem=""
  local lines
  lines=$(wc -l < "$WORK/stderr")
  if [ "$rc" -ne 2 ]; then problem="exit code $rc, not 2"
  elif [ "$lines" -ne 1 ]; then problem="$lines lines on stderr, not 1"
  elif [ "$(head -c 11 "$WORK/stderr")" != "seqlab op: " ]; then problem="stderr does not start with 'seqlab op: '"
  elif ! grep -qF -- "$want" "$WORK/stderr"; then problem="message lacks '$want'"
  elif [ -d "$OUT" ] && [ "$(ls -A "$OUT")" != "marker" ]; then problem="out dir written: $(ls -A "$OUT" | tr '\n' ' ')"
  fi
  if [ -n "$problem" ]; then
    echo "FAIL $name: $problem"
    sed 's/^/  stderr: /' "$WORK/stderr"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(cat "$WORK/stderr")"
  fi
}

fresh unknown_op
npy "$IN/x.npy" '<f8' '(1,)' "$F64_1"
expect_error "unknown op" "did you mean 'exp'" exq --in "$IN" --out "$OUT"

fresh missing_input
npy "$IN/a.npy" '<f8' '(1,)' "$F64_1"
expect_error "missing input file" "b.npy" add --in "$IN" --out "$OUT"

fresh misshaped
npy "$IN/a.npy" '<f8' '(3,)' "$F64_1$F64_1$F64_1"
npy "$IN/b.npy" '<f8' '(2,)' "$F64_1$F64_2"
rm -r "$OUT"  # and an out folder that does not exist yet must not be created
expect_error "mis-shaped input" "op add" add --in "$IN" --out "$OUT"

fresh misshaped_cotangent
npy "$IN/x.npy" '<f8' '(2,)' "$F64_1$F64_2"
npy "$IN/grad_y.npy" '<f8' '(1,)' "$F64_1"
expect_error "mis-shaped cotangent" "grad_y.npy has shape" exp --in "$IN" --out "$OUT"

fresh truncated
npy "$IN/x.npy" '<f8' '(2,)' "$F64_1"
expect_error "truncated input" "truncated data" exp --in "$IN" --out "$OUT"

fresh wrong_dtype
npy "$IN/x.npy" '<i8' '(1,)' "$F64_1"
expect_error "wrong dtype" "must be f32 or f64" exp --in "$IN" --out "$OUT"

fresh mixed_dtypes
npy "$IN/a.npy" '<f8' '(1,)' "$F64_1"
npy "$IN/b.npy" '<f4' '(1,)' "$F32_1"
expect_error "floating dtypes disagree" "--dtype" add --in "$IN" --out "$OUT"

fresh bad_attr
npy "$IN/x.npy" '<f8' '(1,)' "$F64_1"
expect_error "bad attribute value" "must be a number" mul_scalar --in "$IN" --out "$OUT" --attr s=abc
expect_error "unknown attribute" "no attribute 'foo'" exp --in "$IN" --out "$OUT" --attr foo=1
# An integer too large for 64 bits is told the range, not "must be an integer".
expect_error "attribute beyond 64 bits" "attribute block='99999999999999999999' must be an integer from -2^63 to 2^63 - 1" \
  attention --in "$IN" --out "$OUT" --attr block=99999999999999999999
expect_error "attribute without =" "key=value" mul_scalar --in "$IN" --out "$OUT" --attr s
expect_error "unknown flag" "unknown flag '--frobnicate'" exp --in "$IN" --out "$OUT" --frobnicate
expect_error "flag without value" "--out needs a value" exp --in "$IN" --out
expect_error "bad --dtype" "--dtype must be f32 or f64" exp --in "$IN" --out "$OUT" --dtype f16
expect_error "missing --in" "--in DIR is required" exp --out "$OUT"
expect_error "missing --in folder" "does not exist" exp --in "$WORK/nowhere" --out "$OUT"
expect_error "no op named" "no op named" --in "$IN" --out "$OUT"

# Positive controls, so the failures above fail for their stated reason: exp of f32 zeros is ones,
# the out folder is created, and grad_x appears only when a cotangent is given.
# Absurd attributes: a tile or chunk of 2^40 once aborted (std::bad_alloc inside an OpenMP region); it
# is now the same single tile or chunk as any size beyond the sequence, so the results equal the default's.
fresh absurd
Q4="$F64_1$F64_2$F64_2$F64_1"
for x in q k v; do npy "$IN/$x.npy" '<f8' '(1, 2, 1, 2)' "$Q4"; done
npy "$IN/g.npy" '<f8' '(1, 2, 1, 2)' '\x00\x00\x00\x00\x00\x00\xe0\xbf\x00\x00\x00\x00\x00\x00\xe0\xbf\x00\x00\x00\x00\x00\x00\xe0\xbf\x00\x00\x00\x00\x00\x00\xe0\xbf'
for op_attr in "attention block" "gla chunk" "gla sub_chunk"; do
  set -- $op_attr
  rm -rf "$WORK/absurd/a" "$WORK/absurd/b"
  "$SEQLAB" op "$1" --in "$IN" --out "$WORK/absurd/a" --attr "$2=1099511627776" 2> "$WORK/stderr"
  rc=$?
  "$SEQLAB" op "$1" --in "$IN" --out "$WORK/absurd/b" 2>> "$WORK/stderr"
  if [ "$rc" -eq 0 ] && cmp -s "$WORK/absurd/a/o.npy" "$WORK/absurd/b/o.npy"; then
    echo "ok   $1 --attr $2=2^40: exit 0, the default's output"
  else
    echo "FAIL $1 --attr $2=2^40: exit $rc"; sed 's/^/  stderr: /' "$WORK/stderr"; failures=$((failures + 1))
  fi
done
expect_error "negative chunk" "chunk must be positive" gla --in "$IN" --out "$OUT" --attr chunk=-5

fresh success
npy "$IN/x.npy" '<f4' '(2,)' "$F32_0$F32_0"
npy "$WORK/ones.npy" '<f4' '(2,)' "$F32_1$F32_1"
rm -r "$OUT"
if "$SEQLAB" op exp --in "$IN" --out "$OUT" 2> "$WORK/stderr" && cmp -s "$OUT/y.npy" "$WORK/ones.npy" &&
   [ ! -e "$OUT/grad_x.npy" ] && [ ! -s "$WORK/stderr" ]; then
  echo "ok   success: exp of f32 zeros wrote ones and no gradient"
else
  echo "FAIL success: exp did not write y.npy of ones alone"; failures=$((failures + 1))
fi
npy "$IN/grad_y.npy" '<f4' '(2,)' "$F32_1$F32_1"
if "$SEQLAB" op exp --in "$IN" --out "$OUT" && cmp -s "$OUT/grad_x.npy" "$WORK/ones.npy"; then
  echo "ok   success: with grad_y, grad_x = grad_y * exp(0)"
else
  echo "FAIL success: grad_x missing or wrong"; failures=$((failures + 1))
fi

# The top-level command reports its misuse the same way.
for args in "no_such_recipe.toml --set train.steps=1" "frobnicate" "sample no_run --temperature nan"; do
  # shellcheck disable=SC2086
  "$SEQLAB" $args > /dev/null 2> "$WORK/stderr"
  rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l < "$WORK/stderr")" -eq 1 ]; then
    echo "ok   seqlab $args: $(cat "$WORK/stderr")"
  else
    echo "FAIL seqlab $args: exit $rc, $(wc -l < "$WORK/stderr") lines on stderr"; failures=$((failures + 1))
  fi
done

# A negative seed is told the range of seeds (it used to be told "expects a number").
"$SEQLAB" sample no_run --seed -1 > /dev/null 2> "$WORK/stderr"
rc=$?
if [ "$rc" -eq 2 ] && [ "$(cat "$WORK/stderr")" = "seqlab sample: --seed expects an integer from 0 to 2^64 - 1, got '-1'" ]; then
  echo "ok   seqlab sample no_run --seed -1: $(cat "$WORK/stderr")"
else
  echo "FAIL seqlab sample no_run --seed -1: exit $rc, $(cat "$WORK/stderr")"; failures=$((failures + 1))
fi

echo "failures: $failures"
[ "$failures" -eq 0 ]
