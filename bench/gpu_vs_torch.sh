#!/usr/bin/env bash
# seqlab against PyTorch on one GPU, in bf16 (issues 5 and 16), each pair run alternately in the same
# session so that clock and thermal drift hit both alike:
#   gpt        GPT-2 124M training (d 768, 12 layers, 12 heads, T 1024, vocab 50304, batch --B): seqlab's
#              gpt_train_bench against bench/peers/torch_gpt.py eager and with --compile; tokens/s and MFU
#              (model FLOPs, the same formula on both sides, against the GPU's dense bf16 peak)
#   attention  the fused causal attention, forward + backward: seqlab's attention_bench against
#              bench/peers/torch_attention.py (scaled_dot_product_attention) at each --attn shape
#   gla        GLA forward + backward at the same shapes: seqlab's gla_kernel_bench against
#              bench/peers/torch_gla.py --impl chunk (the chunkwise algorithm in PyTorch, checked first against
#              a float64 recurrence), --impl fla (flash-linear-attention's chunk_gla, where installed; its
#              Triton kernels compile and autotune in their first runs, so give them a larger limit) and the
#              SDPA time of the attention section at that shape
# Prints every run, then one line per comparison with the medians and the ratios seqlab / PyTorch
# (the goals: gpt ≥ 1.0× eager PyTorch, attention ≥ 0.9× SDPA; for GLA, speed = the peer's time / seqlab's).
# Every program runs under a time limit (SEQLAB_BENCH_RUN_LIMIT seconds, default 90; three times that for
# the GPT runs, as torch.compile compiles in its run). Exits non-zero if a run failed.
#
# --narrow also times seqlab with its narrow attention tile shapes (SEQLAB_ATTENTION_TC_SHAPE=narrow: one m-tile
# per warp; the default is wide, src/cuda/attention/attention_tc.cu) in the gpt and attention sections.
#
# Usage: bench/gpu_vs_torch.sh [--rounds 3] [--gpt-rounds N (default: --rounds)] [--steps 10] [--B 8] [--no-compile] [--no-gpt] [--no-attention]
#                              [--no-gla] [--no-fla] [--narrow] [--attn "B H T d" (repeatable; default T = 1024 … 8192 at
#                              B·T = 16384, H 16, d 64: "16 16 1024 64" … "2 16 8192 64")]
# Environment: SEQLAB_BUILD (build folder with gpt_train_bench, attention_bench and gla_kernel_bench,
# default build-gpu/, else build/), TORCH_PYTHON (default python3), TORCH_PEERS (folder of the peers, default
# bench/peers), SEQLAB_PEAK_TFLOPS (dense bf16 peak for MFU; default from the GPU's name).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds=3 gpt_rounds="" steps=10 B=8 compile=1 do_gpt=1 do_attn=1 do_gla=1 do_fla=1 do_narrow=0 shapes=()
fail() { printf 'gpu_vs_torch: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --gpt-rounds) gpt_rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --B) B=$2; shift 2 ;;
    --attn) shapes+=("$2"); shift 2 ;;
    --no-compile) compile=0; shift ;;
    --no-gpt) do_gpt=0; shift ;;
    --no-attention) do_attn=0; shift ;;
    --no-gla) do_gla=0; shift ;;
    --no-fla) do_fla=0; shift ;;
    --narrow) do_narrow=1; shift ;;
    *) fail "unknown argument $1 (see the usage at the top of $0)" ;;
  esac
done
[ ${#shapes[@]} -eq 0 ] && shapes=("16 16 1024 64" "8 16 2048 64" "4 16 4096 64" "2 16 8192 64")
limit="${SEQLAB_BENCH_RUN_LIMIT:-90}"
export PYTHONUNBUFFERED=1  # a run stopped at its limit keeps what it printed
gpt_rounds="${gpt_rounds:-$rounds}"
build="${SEQLAB_BUILD:-}"
if [ -z "$build" ]; then
  build="$root/build-gpu"
  [ -x "$build/gpt_train_bench" ] || build="$root/build"
fi
python="${TORCH_PYTHON:-python3}"
peers="${TORCH_PEERS:-$root/bench/peers}"
for f in "$build/gpt_train_bench" "$build/attention_bench" "$build/gla_kernel_bench"; do
  [ -x "$f" ] || fail "$f not found: build it first (ninja -C $build gpt_train_bench attention_bench gla_kernel_bench)"
done
for f in torch_gpt.py torch_attention.py torch_gla.py; do [ -f "$peers/$f" ] || fail "the PyTorch peer $peers/$f is missing"; done
gpu="$("$python" -c 'import torch; assert torch.cuda.is_available(); print(torch.cuda.get_device_name(0))' 2>&1)" ||
  fail "PyTorch ($python) sees no CUDA GPU: ${gpu##*$'\n'}"

# Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from NVIDIA's data sheets.
peak="${SEQLAB_PEAK_TFLOPS:-}"
if [ -z "$peak" ]; then
  case "$gpu" in
    *H100*PCIe*) peak=756 ;;
    *H100*|*H200*) peak=989 ;;
    *A100*) peak=312 ;;
    *L40S*) peak=362 ;;
    *) peak=0 ;;
  esac
fi
echo "GPU: $gpu; dense bf16 peak for MFU: $([ "$peak" = 0 ] && echo "unknown (set SEQLAB_PEAK_TFLOPS)" || echo "$peak TFLOP/s")"

field() { sed -n "s|.* $1=\([0-9.]*\).*|\1|p" <<<"$2"; }  # field NAME LINE: the value of NAME= in LINE
median() { sort -g | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print 0}'; }
mfu() { awk -v t="$1" -v p="$peak" 'BEGIN {if (p > 0) printf "%.1f%%", 100 * t / p; else printf "n/a"}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else printf "n/a"}'; }
failures=0
# run NAME CMD...: runs one benchmark program, prints its line, appends "tokens/s-or-TFLOP/s model_TFLOP/s"
# to the array named NAME; a failure is counted and printed, and the others go on.
run() {
  local -n acc=$1
  shift
  local line
  if line="$(timeout --kill-after=5 "${run_limit:-$limit}" "$@" 2>&1)"; then
    line="$(tail -n 1 <<<"$line")"
    echo "$line"
    acc+=("$line")
  else
    failures=$((failures + 1))
    echo "FAILED: $* :: $(tail -n 3 <<<"$line" | tr '\n' ' ')"
  fi
}

results=()
if [ "$do_gpt" = 1 ]; then
  shape=(--d 768 --layers 12 --heads 12 --T 1024 --vocab 50304 --B "$B" --steps "$steps")
  ours=() eager=() compiled=() narrow=()
  run_limit=$((3 * limit))  # torch.compile compiles the model in its first run
  for ((r = 1; r <= gpt_rounds; r++)); do
    run ours "$build/gpt_train_bench" "${shape[@]}" --device cuda --dtype bf16
    [ "$do_narrow" = 1 ] && run narrow env SEQLAB_ATTENTION_TC_SHAPE=narrow "$build/gpt_train_bench" "${shape[@]}" --device cuda --dtype bf16
    run eager "$python" "$peers/torch_gpt.py" "${shape[@]}" --device cuda --dtype bf16
    [ "$compile" = 1 ] && run compiled "$python" "$peers/torch_gpt.py" "${shape[@]}" --device cuda --dtype bf16 --compile
  done
  summarise() {  # NAME LINES...: "NAME X tokens/s (MFU Y)" from the medians
    local name=$1 tps tf
    shift
    tps="$(for l in "$@"; do field 'tokens/s' "$l"; done | median)"
    tf="$(for l in "$@"; do field 'model_TFLOP/s' "$l"; done | median)"
    printf '%s %.0f tokens/s (MFU %s)' "$name" "$tps" "$(mfu "$tf")"
  }
  tps_of() { for l in "$@"; do field 'tokens/s' "$l"; done | median; }
  a="$(tps_of "${ours[@]}")" b="$(tps_of "${eager[@]}")"
  line="gpt bf16 124M B=$B T=1024, median of $gpt_rounds: $(summarise seqlab "${ours[@]}"), $(summarise torch "${eager[@]}")"
  tail_="ratio seqlab/torch $(ratio "$a" "$b")"
  if [ "$compile" = 1 ]; then
    line+=", $(summarise torch.compile "${compiled[@]}")"
    tail_+=", seqlab/torch.compile $(ratio "$a" "$(tps_of "${compiled[@]}")")"
  fi
  if [ "$do_narrow" = 1 ]; then
    line+=", $(summarise "seqlab (narrow tiles)" "${narrow[@]}")"
    tail_+=", narrow/torch $(ratio "$(tps_of "${narrow[@]}")" "$b")"
  fi
  results+=("$line; $tail_")
fi

unset run_limit
ms_of() { for l in "$@"; do field 'fwd+bwd_ms' "$l"; done | median; }
if [ "$do_attn" = 1 ] || [ "$do_gla" = 1 ]; then
  # The GLA peer first checks itself against a float64 recurrence on small shapes (one line).
  if [ "$do_gla" = 1 ]; then
    timeout "$limit" "$python" "$peers/torch_gla.py" --device cuda --dtype bf16 --impl chunk --check --T 64 --reps 1 ||
      { failures=$((failures + 1)); echo "FAILED: torch_gla.py --impl chunk --check"; }
    if [ "$do_fla" = 1 ]; then
      timeout "$limit" "$python" "$peers/torch_gla.py" --device cuda --dtype bf16 --impl fla --check --T 64 --reps 1 ||
        { do_fla=0; echo "flash-linear-attention: not available, too slow to compile in ${limit}s, or failed its check (left out)"; }
    fi
  fi
  for s in "${shapes[@]}"; do
    read -r b h t d <<<"$s"
    args=(--B "$b" --H "$h" --T "$t" --d "$d" --device cuda --dtype bf16 --reps 10)
    ours=() sdpa=() gla=() chunk=() fla=() narrow=()
    for ((r = 1; r <= rounds; r++)); do
      if [ "$do_attn" = 1 ] || [ "$do_gla" = 1 ]; then run sdpa "$python" "$peers/torch_attention.py" "${args[@]}"; fi
      [ "$do_attn" = 1 ] && run ours "$build/attention_bench" "${args[@]}"
      [ "$do_attn" = 1 ] && [ "$do_narrow" = 1 ] && run narrow env SEQLAB_ATTENTION_TC_SHAPE=narrow "$build/attention_bench" "${args[@]}"
      if [ "$do_gla" = 1 ]; then
        run gla "$build/gla_kernel_bench" "${args[@]}"
        run chunk "$python" "$peers/torch_gla.py" "${args[@]}" --impl chunk
        [ "$do_fla" = 1 ] && run fla "$python" "$peers/torch_gla.py" "${args[@]}" --impl fla
      fi
    done
    c="$(for l in "${sdpa[@]}"; do field 'TFLOP/s' "$l"; done | median)"
    if [ "$do_attn" = 1 ]; then
      a="$(for l in "${ours[@]}"; do field 'TFLOP/s' "$l"; done | median)"
      results+=("$(printf 'attention bf16 causal B=%s H=%s T=%s d=%s, median of %s: seqlab %.1f TFLOP/s (%s ms), torch SDPA %.1f TFLOP/s (%s ms); ratio seqlab/SDPA %s' \
        "$b" "$h" "$t" "$d" "$rounds" "$a" "$(ms_of "${ours[@]}")" "$c" "$(ms_of "${sdpa[@]}")" "$(ratio "$a" "$c")")")
      if [ "$do_narrow" = 1 ]; then
        n="$(for l in "${narrow[@]}"; do field 'TFLOP/s' "$l"; done | median)"
        results[-1]+="$(printf '; narrow tiles %.1f TFLOP/s (%s ms), ratio %s' "$n" "$(ms_of "${narrow[@]}")" "$(ratio "$n" "$c")")"
      fi
    fi
    if [ "$do_gla" = 1 ]; then
      mine="$(ms_of "${gla[@]}")" line="gla bf16 B=$b H=$h T=$t d=$d fwd+bwd, median of $rounds: seqlab $mine ms"
      speeds="speed (peer ms / seqlab ms):"
      line+=", torch chunkwise $(ms_of "${chunk[@]}") ms"
      speeds+=" vs torch chunkwise $(ratio "$(ms_of "${chunk[@]}")" "$mine")"
      if [ "$do_fla" = 1 ]; then
        line+=", fla chunk_gla $(ms_of "${fla[@]}") ms"
        speeds+=", vs fla $(ratio "$(ms_of "${fla[@]}")" "$mine")"
      fi
      line+=", SDPA $(ms_of "${sdpa[@]}") ms"
      speeds+=", vs SDPA $(ratio "$(ms_of "${sdpa[@]}")" "$mine")"
      results+=("$line; $speeds")
    fi
  done
fi

echo
printf '%s\n' "${results[@]}"
[ "$failures" -eq 0 ] || { echo "$failures run(s) failed"; exit 1; }
