#!/usr/bin/env bash
# Each side's best CPU mode, in one run: seqlab's GPT (build/gpt_train_bench) in f32 and bf16 against the
# PyTorch peer (bench/peers/torch_gpt.py) in f32, bf16 autocast, and each of those under torch.compile, at the
# same shapes and thread count. One round runs every mode once, in a fixed order; rounds repeat so that
# drift on a shared machine hits every mode alike. Prints every run, each mode's median tokens/s, and the
# ratio of seqlab's best median to torch's best median (the issue's "best CPU mode of each").
#
# Usage: bench/gpt_best_vs_torch.sh [rounds (3)] [steps per run (10)] [-- extra flags for both, e.g. --threads 2]
# Environment: SEQLAB_BUILD (build folder, default build/), TORCH_PYTHON (a python with PyTorch 2.x, e.g. the venv
# of scripts/python_env.sh: build/pyenv/bin/python3), TORCH_GPT (default bench/peers/torch_gpt.py),
# TORCH_COMPILE=0 to leave out the torch.compile modes (they need a C++ compiler and take a minute to compile).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-10}"
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
extra=("$@")
bench_bin="${SEQLAB_BUILD:-$root/build}/gpt_train_bench"
python="${TORCH_PYTHON:-$root/build/pyenv/bin/python3}"
torch_gpt="${TORCH_GPT:-$root/bench/peers/torch_gpt.py}"

fail() { printf 'gpt_best_vs_torch: %s\n' "$*" >&2; exit 1; }
[ -x "$bench_bin" ] || fail "$bench_bin not found: build it first (ninja -C ${SEQLAB_BUILD:-build} gpt_train_bench)"
[ -f "$torch_gpt" ] || fail "the PyTorch peer $torch_gpt is missing (set TORCH_GPT)"
if ! err="$("$python" -c 'import torch' 2>&1)"; then
  fail "torch is not importable by $python (scripts/python_env.sh makes build/pyenv; or set TORCH_PYTHON): ${err##*$'\n'}"
fi

modes=("seqlab f32" "seqlab bf16" "torch f32" "torch bf16")
if [ "${TORCH_COMPILE:-1}" != 0 ]; then modes+=("torch f32 compile" "torch bf16 compile"); fi

tps() { sed -n 's/.*tokens\/s=\([0-9.]*\).*/\1/p' <<<"$1"; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

declare -A runs
for ((r = 1; r <= rounds; r++)); do
  for mode in "${modes[@]}"; do
    read -r who dtype compile <<<"$mode"
    if [ "$who" = seqlab ]; then
      line="$("$bench_bin" --steps "$steps" --dtype "$dtype" "${extra[@]}")" || fail "gpt_train_bench failed ($mode)"
    else
      line="$("$python" "$torch_gpt" --steps "$steps" --dtype "$dtype" ${compile:+--compile} "${extra[@]}")" ||
        fail "torch_gpt.py failed ($mode)"
    fi
    echo "[$mode] $line"
    runs["$mode"]+="$(tps "$line") "
  done
done

best_ours=0 best_ours_mode="" best_theirs=0 best_theirs_mode=""
for mode in "${modes[@]}"; do
  m="$(printf '%s\n' ${runs["$mode"]} | median)"
  printf 'median of %d: %-20s %8.0f tokens/s\n' "$rounds" "$mode" "$m"
  if [[ "$mode" == seqlab* ]]; then
    if awk -v a="$m" -v b="$best_ours" 'BEGIN {exit !(a > b)}'; then best_ours="$m" best_ours_mode="$mode"; fi
  elif awk -v a="$m" -v b="$best_theirs" 'BEGIN {exit !(a > b)}'; then
    best_theirs="$m" best_theirs_mode="$mode"
  fi
done
awk -v a="$best_ours" -v b="$best_theirs" -v am="$best_ours_mode" -v bm="$best_theirs_mode" \
  'BEGIN {printf "best of each: %s %.0f tokens/s, %s %.0f tokens/s, ratio seqlab/torch %.2f\n", am, a, bm, b, a / b}'
