#!/usr/bin/env bash
# The whole GPU validation of the CUDA backend in one command, for a machine with a GPU but without apt or
# network (docs/gpu.md). Run from the repository root after scripts/gpu_debs.sh has filled .debs/ on a
# machine that has apt:
#
#   1. deps       unpacks every .debs/*.deb with `dpkg -x` (or ar and tar) into a prefix (never into /)
#   2. configure  a CUDA build (SEQLAB_CUDA=ON, sm_80;sm_90 as CI) in build-gpu, dependencies from the prefix
#   3. build      seqlab, the GPU test programs and the benchmarks; or, where .debs/prebuilt.tar.gz exists
#                 (scripts/gpu_pack.sh, a CUDA build made where apt works), that build unpacked instead of
#                 2 and 3, if its programs start here (else it builds as above)
#   4. tests      ctest -L gpu: every CUDA kernel against the CPU kernel
#   5. train      tests/train_gpu_test.sh: 50 steps on CPU f32, GPU f32 and GPU bf16, losses compared
#   6. recipe     recipes/gpt_small.toml and the main job recipes/gla_small.toml trained on the GPU
#                 (train.device = "cuda"), each within 150 s
#   7. bench      bench/gpu_vs_torch.sh: GPT-2 124M training, attention and GLA against PyTorch
#
# Every stage runs even when an earlier one failed (a stage whose programs are missing fails at once), each
# one under a time limit so that the whole stays under SEQLAB_GPU_DEADLINE seconds, and a summary ends the
# output. Logs go to OUTDIR as at most 8 files (summary.txt, env.txt, build.log, gpu_tests.log,
# train_gpu.log, gpt_small.log, gla_small.log, bench.log).
#
# Usage: scripts/gpu_check.sh [OUTDIR]        OUTDIR default: $OUT if set, else build-gpu/check
# Exit status: 0 every stage passed; 1 a stage failed; 3 none failed but no GPU was usable (the GPU stages
# were skipped, nothing was validated on a GPU).
# Environment (all optional):
#   SEQLAB_GPU_STAGES    stages after the build, default "tests train recipe bench" (e.g. "bench" for a
#                        second call that only measures; deps, configure and build always run, and are
#                        quick when already done)
#   SEQLAB_GPU_DEADLINE  seconds the whole may take (default 570, inside a 600 s command limit)
#   SEQLAB_GPU_BUILD     build folder (default build-gpu);  SEQLAB_GPU_PREFIX  prefix (default BUILD/prefix)
#   SEQLAB_GPU_DEBS      folder of .deb files (default .debs; if it has none, the system's packages are used)
#   SEQLAB_GPU_PREBUILT  tarball of scripts/gpu_pack.sh (default .debs/prebuilt.tar.gz, used where it exists)
#   SEQLAB_GPU_ARCHS     CUDA architectures (default "80;90");  SEQLAB_GPU_CMAKE_ARGS  more -D arguments
#   SEQLAB_GPU_RECIPES   the recipes of stage 6 (default "gpt_small gla_small")
#   SEQLAB_GPU_RECIPE_STEPS  steps of their runs (default: the recipes' own)
#   SEQLAB_GPU_BENCH_ARGS    arguments for bench/gpu_vs_torch.sh (default "--rounds 2"; e.g. "--rounds 3")
#   SEQLAB_GPU_IGNORE_SYSTEM=1  configure with CMAKE_IGNORE_PREFIX_PATH=/usr, so that CMake finds nothing
#                        of the system's /usr: checks on a machine that has the packages installed that the
#                        prefix alone satisfies the build
set -u -o pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2
out="${1:-${OUT:-$root/build-gpu/check}}"
build="${SEQLAB_GPU_BUILD:-$root/build-gpu}"
prefix="${SEQLAB_GPU_PREFIX:-$build/prefix}"
debs="${SEQLAB_GPU_DEBS:-$root/.debs}"
stages=" ${SEQLAB_GPU_STAGES:-tests train recipe bench} "
archs="${SEQLAB_GPU_ARCHS:-80;90}"
start=$(date +%s)
deadline=$((start + ${SEQLAB_GPU_DEADLINE:-570}))
mkdir -p "$out" "$build" || { echo "gpu_check: cannot create $out or $build" >&2; exit 2; }
for f in summary.txt env.txt build.log gpu_tests.log train_gpu.log bench.log; do : > "$out/$f"; done

# CMake 4 refuses package files that ask for policies older than 3.5; the Debian ones say "2.6...3.21",
# which it accepts, and this keeps it so should one not (CMake 3 ignores the variable).
export CMAKE_POLICY_VERSION_MINIMUM=3.5
# OpenMP threads sleep when idle (as scripts/setup.sh sets for ./train and ./test.sh).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

summary=()
failed=0
note() { summary+=("                 $1"); }  # a line under the last stage's
record() {  # STAGE STATUS DETAIL   (STATUS: ok, FAIL or skip)
  local line
  line="$(printf '%-9s %-4s  %s' "$1" "$2" "$3")"
  summary+=("$line")
  [ "$2" = FAIL ] && failed=$((failed + 1))
  printf '\n==== %s\n' "$line"
}
# Seconds a stage may take: its cap, or what is left before the deadline (less 20 s for the summary).
budget() {
  local left=$((deadline - $(date +%s) - 20))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
# run LOG CAP CMD...: runs CMD with a time limit, appending its output to LOG and to stdout; returns its
# status (124 when the limit ended it).
run() {
  local log=$1 cap
  cap=$(budget "$2")
  shift 2
  if [ "$cap" -le 0 ]; then
    echo "gpu_check: no time left for: $*" | tee -a "$log"
    return 124
  fi
  echo "\$ $* (limit ${cap}s)" >> "$log"
  timeout --kill-after=10 "$cap" "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
wanted() { [[ "$stages" == *" $1 "* ]]; }
how() { [ "$1" -eq 124 ] && echo "stopped at its time limit" || echo "exit $1"; }  # how a command ended
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

# ---- the machine ----
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   host: $(uname -n)   kernel: $(uname -r)"
  echo "os: $(. /etc/os-release 2> /dev/null && echo "$PRETTY_NAME")   glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "cpus: $(nproc)   g++: $(g++ --version 2>&1 | head -n 1)   cmake: $(cmake --version 2>&1 | head -n 1)"
  echo "ninja: $(ninja --version 2>&1)   nvcc: $(nvcc --version 2>&1 | grep -i release)"
  echo "--- nvidia-smi"
  nvidia-smi 2>&1 | head -n 20
  echo "--- python3 / torch"
  python3 -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU for torch")' 2>&1 | tail -n 1
  echo "--- CUDA libraries next to nvcc"
  for f in "$(dirname "$(dirname "$(command -v nvcc 2> /dev/null || echo /usr/local/cuda/bin/nvcc)")")"/lib*/lib{cudart,cublas,cublasLt,nccl}.so; do
    [ -e "$f" ] && printf '%s ' "$f"
  done
  echo
} > "$out/env.txt" 2>&1
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n 1)"
cat "$out/env.txt"

# ---- 1. deps: the .deb files unpacked into the prefix ----
lib="$prefix/usr/lib/x86_64-linux-gnu"
cmake_deps=()
t=$(date +%s)
shopt -s nullglob
deb_files=("$debs"/*.deb)
shopt -u nullglob
if [ ${#deb_files[@]} -eq 0 ]; then
  record deps ok "no .deb files in $debs: using the system's packages (run scripts/gpu_debs.sh where apt works)"
else
  rm -rf "$prefix" && mkdir -p "$prefix"
  # dpkg -x, or where there is no dpkg the same by hand: a .deb is an ar archive holding data.tar.*.
  unpack() {
    if command -v dpkg > /dev/null; then
      dpkg -x "$1" "$prefix"
    else
      local member tmp="$prefix/.data.tar"
      member="$(ar t "$1" | grep '^data\.tar')" && ar p "$1" "$member" > "$tmp$member" &&
        tar -xf "$tmp$member" -C "$prefix" && rm -f "$tmp$member"
    fi
  }
  bad=0
  for f in "${deb_files[@]}"; do
    unpack "$f" >> "$out/build.log" 2>&1 || { echo "unpacking failed: $f" | tee -a "$out/build.log"; bad=1; }
  done
  # OpenBLAS lives in a subfolder that Debian's alternatives would link into $lib on installation.
  cmake_deps=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$lib/openblas-pthread")
  # The linker (for libraries' own dependencies, e.g. libgfortran, libgloo's libhiredis) and every program
  # run below. Gloo installs into /usr/lib, and some packages still ship /lib/x86_64-linux-gnu.
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread:$prefix/usr/lib:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ "$bad" -eq 0 ]; then
    record deps ok "${#deb_files[@]} packages unpacked into $prefix ($(elapsed "$t"))"
  else
    record deps FAIL "a .deb file did not unpack (build.log)"
  fi
fi
# NCCL: next to the CUDA toolkit (found by CMakeLists.txt), else the copy in PyTorch's nvidia-nccl wheel.
cuda_root="$(dirname "$(dirname "$(command -v nvcc 2> /dev/null || echo /usr/local/cuda/bin/nvcc)")")"
# The toolkit's runtime libraries (cudart, cuBLAS) for programs built elsewhere (a prebuilt build's run path
# names only its own folder), after the prefix.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda_root/lib64:$cuda_root/lib"
if ! ls "$cuda_root"/lib*/libnccl.so > /dev/null 2>&1; then
  nccl_dir="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2> /dev/null)"
  nccl_lib="$(ls "$nccl_dir"/lib/libnccl.so* 2> /dev/null | head -n 1)"
  if [ -n "$nccl_lib" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
    echo "NCCL from PyTorch's wheel: $nccl_lib" | tee -a "$out/env.txt"
    cmake_deps+=(-DNCCL_LIBRARY="$nccl_lib" -DNCCL_INCLUDE_DIR="$nccl_dir/include")
    export LD_LIBRARY_PATH="$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "NCCL: not next to the toolkit ($cuda_root) nor in an nvidia.nccl wheel: left to CMake's search" |
      tee -a "$out/env.txt"
  fi
fi
[ "${SEQLAB_GPU_IGNORE_SYSTEM:-0}" = 1 ] && cmake_deps+=(-DCMAKE_IGNORE_PREFIX_PATH=/usr)
# shellcheck disable=SC2206  # extra CMake arguments, split on spaces on purpose
cmake_deps+=(${SEQLAB_GPU_CMAKE_ARGS:-})

# ---- 2 and 3, or a build made elsewhere (scripts/gpu_pack.sh): unpacked at its own absolute path ----
prebuilt_tar="${SEQLAB_GPU_PREBUILT:-$debs/prebuilt.tar.gz}"
prebuilt=0
if [ -f "$prebuilt_tar" ]; then
  t=$(date +%s)
  manifest="$(tar -xzOf "$prebuilt_tar" prebuilt_manifest.txt 2> /dev/null)"
  p_root="$(sed -n 's/^root=//p' <<<"$manifest")" p_build="$(sed -n 's/^build=//p' <<<"$manifest")"
  # Its programs name their libraries and CTest its programs and scripts by absolute paths under p_root:
  # where that path does not exist here, it becomes a link to this checkout.
  if [ -n "$p_root" ] && [ ! -e "$p_root" ]; then
    mkdir -p "$(dirname "$p_root")" 2> /dev/null && ln -s "$root" "$p_root" 2> /dev/null
  fi
  why=""
  if [ -z "$p_build" ]; then
    why="no manifest in $prebuilt_tar"
  elif [ "$(cd "$p_root" 2> /dev/null && pwd -P)" != "$(pwd -P)" ]; then
    why="its path $p_root is not (and cannot be linked to) this checkout"
  elif ! { mkdir -p "$p_build" && tar -xzf "$prebuilt_tar" -C "$p_build"; } >> "$out/build.log" 2>&1; then
    why="it did not unpack into $p_build"
  elif ! "$p_build/seqlab" --version >> "$out/build.log" 2>&1; then
    why="its seqlab does not start here: $("$p_build/seqlab" --version 2>&1 | head -n 1 | cut -c 1-120)"
  fi
  if [ -z "$why" ]; then
    prebuilt=1
    build="$p_build"
    record build ok "prebuilt, unpacked into $p_build ($(elapsed "$t")): $(grep -E '^(commit|cuda_architectures|made)=' <<<"$manifest" | tr '\n' ' ')"
  else
    echo "prebuilt build not used: $why" | tee -a "$out/build.log"
    note "prebuilt build not used ($why): building here"
  fi
fi
if [ "$prebuilt" = 0 ]; then
  # ---- 2. configure ----
  t=$(date +%s)
  run "$out/build.log" 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEQLAB_CUDA=ON \
    -DSEQLAB_CUDA_ARCHITECTURES="$archs" "${cmake_deps[@]}" > /dev/null
  rc=$?
  if [ "$rc" -eq 0 ]; then
    found="$(grep -E '^(absl_DIR|tomlplusplus_DIR|GTest_DIR|BLAS_openblas_LIBRARY|NCCL_LIBRARY)[:=]' \
             "$build/CMakeCache.txt" | sed -E 's/^([A-Za-z_]+):[A-Z]+=/\1=/' | tr '\n' ' ')"
    echo "found: $found" >> "$out/build.log"
    record configure ok "CUDA archs $archs ($(elapsed "$t")); $found"
  else
    tail -n 25 "$out/build.log"
    record configure FAIL "cmake exited $rc (build.log)"
  fi

  # ---- 3. build: seqlab, the GPU test programs and the benchmarks (-k 0: as much as compiles) ----
  t=$(date +%s)
  targets=(seqlab gpt_train_bench attention_bench gla_kernel_bench)
  for f in tests/*_gpu_test.cc; do targets+=("$(basename "$f" .cc)"); done
  if [ -f "$build/build.ninja" ]; then
    run "$out/build.log" 420 ninja -C "$build" -k 0 "${targets[@]}" > /dev/null
    rc=$?
    warnings=$(grep -c 'warning' "$out/build.log")
    if [ "$rc" -eq 0 ]; then
      record build ok "${#targets[@]} targets ($(elapsed "$t")), $warnings warning lines in build.log"
    else
      grep -E 'error|FAILED' -A 3 "$out/build.log" | head -n 40
      record build FAIL "ninja exited $rc (build.log); built: $(for x in "${targets[@]}"; do
        [ -x "$build/$x" ] && printf '%s ' "$x"; done)"
    fi
  else
    record build FAIL "not configured"
  fi
fi
if [ -x "$build/seqlab" ]; then
  "$build/seqlab" --version 2>&1 | tee -a "$out/env.txt"
fi
gpu_usable=0
"$build/seqlab" --version 2> /dev/null | grep -q 'GPU(s) usable' && gpu_usable=1

# ---- 4. tests: ctest -L gpu (the end-to-end training test runs in its own stage) ----
if wanted tests; then
  t=$(date +%s)
  run "$out/gpu_tests.log" 300 ctest --test-dir "$build" -L gpu -E train_gpu_test --output-on-failure --timeout 240 -j "${SEQLAB_GPU_TEST_JOBS:-4}"
  rc=$?
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$out/gpu_tests.log")
  skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$out/gpu_tests.log")
  total=$(grep -cE 'Test +#[0-9]+: ' "$out/gpu_tests.log")
  detail="$passed passed, $skipped skipped, $((total - passed - skipped)) failed of $total ($(elapsed "$t"))"
  if [ "$rc" -ne 0 ] || [ "$total" -eq 0 ]; then
    record tests FAIL "$detail; ctest exited $rc (gpu_tests.log)"
  elif [ "$skipped" -gt 0 ]; then
    record tests skip "$detail: no usable GPU"
  else
    record tests ok "$detail"
  fi
fi

# ---- 5. train: the GPU end-to-end training test ----
if wanted train; then
  t=$(date +%s)
  if [ -x "$build/seqlab" ]; then
    run "$out/train_gpu.log" 240 bash tests/train_gpu_test.sh "$build/seqlab"
    rc=$?
    detail="$(grep -c '^ok' "$out/train_gpu.log") checks ok, $(grep -c '^FAIL' "$out/train_gpu.log") failed ($(elapsed "$t"))"
    case $rc in
      0) record train ok "$detail" ;;
      77) record train skip "$(tail -n 1 "$out/train_gpu.log")" ;;
      *) record train FAIL "$(how "$rc"): $detail (train_gpu.log)" ;;
    esac
    # The loss comparisons, one line each: "ok GPU f32 train loss against CPU f32: 1.2e-05 at step 7 (tol 0.001)".
    while IFS= read -r l; do note "$l"; done < <(grep -E '^(ok|FAIL) .*max rel diff' "$out/train_gpu.log" |
      sed -E 's/^(ok|FAIL) +(.*): max rel diff ([^ ]+) at ([^(]*[^ (]) +\(.*tolerance ([^;]+).*/\1 \2: \3 at \4 (tol \5)/')
  else
    record train FAIL "no seqlab binary (build failed)"
  fi
fi

# ---- 6. recipe: gpt_small and the main job gla_small as a user trains them, on the GPU ----
if wanted recipe; then
  fortunes="$prefix/usr/share/games/fortunes"
  [ -d "$fortunes" ] || fortunes=/usr/share/games/fortunes
  for recipe in ${SEQLAB_GPU_RECIPES:-gpt_small gla_small}; do
    t=$(date +%s)
    run_dir="$build/runs/$recipe"
    log="$out/$recipe.log"
    : > "$log"
    if [ ! -x "$build/seqlab" ]; then
      record recipe FAIL "$recipe: no seqlab binary (build failed)"
    elif [ "$gpu_usable" -eq 0 ]; then
      record recipe skip "$recipe: no usable GPU (seqlab --version)"
    elif [ ! -d "$fortunes" ]; then
      record recipe FAIL "$recipe: no fortunes corpus (run scripts/gpu_debs.sh where apt works)"
    else
      rm -rf "$run_dir"
      steps=()
      if [ -n "${SEQLAB_GPU_RECIPE_STEPS:-}" ]; then  # the recipes warm up for 30 steps
        n=$SEQLAB_GPU_RECIPE_STEPS
        steps=(--set "train.steps=$n" --set "optim.warmup_steps=$((n < 30 ? n : 30))")
      fi
      run "$log" 150 "$build/seqlab" "recipes/$recipe.toml" --set 'train.device="cuda"' \
        --set "data.path=\"$fortunes\"" --set "data.cache_dir=\"$build/data_cache\"" --set 'log.progress="plain"' \
        "${steps[@]}" --out "$run_dir"
      rc=$?
      if [ -f "$run_dir/metrics.jsonl" ]; then
        { echo "--- metrics.jsonl (every 50th line and the last)"; awk 'NR % 50 == 1' "$run_dir/metrics.jsonl"
          tail -n 1 "$run_dir/metrics.jsonl"; } >> "$log"
      fi
      last_val="$(grep -o '"val_loss": [0-9.]*' "$run_dir/metrics.jsonl" 2> /dev/null | tail -n 1)"
      tps="$(grep -o '"tokens_per_s": [0-9.]*' "$run_dir/metrics.jsonl" 2> /dev/null | tail -n 1)"
      if [ "$rc" -eq 0 ] && [ -n "$last_val" ]; then
        record recipe ok "$recipe on the GPU: last $last_val, $tps ($(elapsed "$t"))"
      else
        record recipe FAIL "$recipe: $(how "$rc"); last ${last_val:-val_loss: none}; $(grep -v '^\$' "$log" |
          grep -m 1 -iE 'error|seqlab train:|must' | cut -c 1-150) ($recipe.log)"
      fi
    fi
  done
fi

# ---- 7. bench: against PyTorch on the same GPU ----
if wanted bench; then
  t=$(date +%s)
  if [ "$gpu_usable" -eq 0 ]; then
    record bench skip "no usable GPU (seqlab --version)"
  else
    # shellcheck disable=SC2086  # word splitting of the extra arguments is wanted
    SEQLAB_BUILD="$build" run "$out/bench.log" 420 bash bench/gpu_vs_torch.sh ${SEQLAB_GPU_BENCH_ARGS:---rounds 2}
    rc=$?
    if [ "$rc" -eq 0 ]; then
      record bench ok "bench/gpu_vs_torch.sh ($(elapsed "$t"))"
    else
      record bench FAIL "bench/gpu_vs_torch.sh: $(how "$rc") (bench.log)"
    fi
    while IFS= read -r l; do note "$l"; done < <(grep -E '^(GPU: |gpt |attention |gla |check |flash-linear|FAILED)' "$out/bench.log")
  fi
fi

# ---- summary ----
{
  # What ran: a prebuilt build's own commit (its manifest), else the checkout's. (A checkout copied to the
  # GPU machine may carry an older .git than its files, so its HEAD does not name a prebuilt build.)
  what="commit $(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown)"
  [ "${prebuilt:-0}" = 1 ] && what="prebuilt build of commit $(sed -n 's/^commit=//p' <<<"$manifest")"
  echo "seqlab GPU check: $what on ${gpu_name:-no GPU}, $(elapsed "$start") in all"
  printf '%s\n' "${summary[@]}"
  if [ "$failed" -gt 0 ]; then
    echo "RESULT: $failed stage(s) FAILED"
  elif [ "$gpu_usable" -eq 0 ]; then
    echo "RESULT: nothing failed, but no GPU was usable: nothing was validated on a GPU"
  else
    echo "RESULT: every stage passed"
  fi
} > "$out/summary.txt"
printf '\n'
cat "$out/summary.txt"
[ "$failed" -gt 0 ] && exit 1
[ "$gpu_usable" -eq 0 ] && exit 3
exit 0
