#!/usr/bin/env bash
# Training throughput of seqlab's GPT (build/gpt_train_bench) against the PyTorch peer
# (bench/peers/torch_gpt.py, a copy of the shared bench folder's) at the same shapes and thread count, run
# alternately (seqlab, torch, seqlab, torch, ...) so that drift on a shared machine hits both alike.
# Prints every run, both medians and the ratio seqlab / torch in tokens/s. On the CPU by default; the
# extra flags reach both programs, so `-- --device cuda --dtype bf16` compares them on a GPU
# (bench/gpu_vs_torch.sh does that at GPT-2 124M shapes, with torch.compile and MFU).
#
# Usage: bench/gpt_vs_torch.sh [rounds (3)] [steps per run (10)] [-- extra flags for both, e.g. --threads 2]
# Environment: SEQLAB_BUILD (build folder, default build/), TORCH_PYTHON (default /usr/bin/python3,
# Debian's python3 with python3-torch), TORCH_GPT (default bench/peers/torch_gpt.py).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${1:-3}"
steps="${2:-10}"
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
extra=("$@")
bench_bin="${SEQLAB_BUILD:-$root/build}/gpt_train_bench"
python="${TORCH_PYTHON:-/usr/bin/python3}"
torch_gpt="${TORCH_GPT:-$root/bench/peers/torch_gpt.py}"

fail() { printf 'gpt_vs_torch: %s\n' "$*" >&2; exit 1; }
[ -x "$bench_bin" ] || fail "$bench_bin not found: build it first (ninja -C ${SEQLAB_BUILD:-build} gpt_train_bench)"
[ -f "$torch_gpt" ] || fail "the PyTorch peer $torch_gpt is missing (set TORCH_GPT)"
if ! err="$("$python" -c 'import torch' 2>&1)"; then
  fail "torch is not importable by $python (install Debian's python3-torch, or set TORCH_PYTHON): ${err##*$'\n'}"
fi

# tokens/s=X from a bench line.
tps() { sed -n 's/.*tokens\/s=\([0-9.]*\).*/\1/p' <<<"$1"; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

ours=() theirs=()
for ((r = 1; r <= rounds; r++)); do
  line="$("$bench_bin" --steps "$steps" "${extra[@]}")" || fail "gpt_train_bench failed"
  echo "$line"
  ours+=("$(tps "$line")")
  line="$("$python" "$torch_gpt" --steps "$steps" "${extra[@]}")" || fail "torch_gpt.py failed"
  echo "$line"
  theirs+=("$(tps "$line")")
done
a="$(printf '%s\n' "${ours[@]}" | median)"
b="$(printf '%s\n' "${theirs[@]}" | median)"
awk -v a="$a" -v b="$b" -v n="$rounds" \
  'BEGIN {printf "median of %d alternating runs: seqlab %.0f tokens/s, torch %.0f tokens/s, ratio seqlab/torch %.2f\n", n, a, b, a / b}'
