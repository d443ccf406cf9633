#!/usr/bin/env bash
# The CPU test suite under sanitizers (docs/reliability.md, "Sanitizers"):
#   1. ASan + UBSan: every CPU test (ctest -L cpu) in build-asan/ (clang; the folder scripts/fuzz.sh
#      builds its targets in, so its tests also replay every fuzz seed);
#   2. TSan: the tests of the threaded CPU kernels in build-tsan/ (clang, LLVM's OpenMP runtime, whose
#      Archer tool tells TSan about OpenMP's barriers and locks).
# A sanitizer report ends the test that caused it with an error, so any report fails this script.
#
#   scripts/sanitize.sh [asan|tsan]...          (default: both)
set -euo pipefail
source "$(dirname "$0")/setup.sh"

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(asan tsan)
for s in "${steps[@]}"; do
  case "$s" in asan | tsan) ;; *) seqlab_say "sanitize.sh: unknown step '$s' (asan, tsan)"; exit 2 ;; esac
done
seqlab_install_packages "${SEQLAB_PACKAGES[@]}" "${SEQLAB_CLANG_PACKAGES[@]}"
seqlab_ensure_numpy
jobs="$(nproc)"

# The tests whose code runs OpenMP loops of the CPU kernels: the primitives of src/tensor/cpu, the
# fused variant ops, the caching pool (locked across threads) and the optimizer steps.
TSAN_TESTS=(tensor_test elementwise_test norm_test softmax_test index_test rope_test caching_pool_test optim_test
            attention_test gla_test retention_test linear_attention_test delta_net_test conv1d_test
            selective_scan_test ssd_test s4_test)

for s in "${steps[@]}"; do
  if [ "$s" = asan ]; then
    SEQLAB_BUILD="$SEQLAB_ROOT/build-asan"
    SEQLAB_CMAKE_ARGS="-DCMAKE_CXX_COMPILER=clang++ -DSEQLAB_CUDA=OFF -DSEQLAB_FUZZ=ON -DSEQLAB_SANITIZE=address,undefined"
    seqlab_build
    seqlab_say "ASan + UBSan: the CPU tests in $SEQLAB_BUILD"
    # Leaks inside third-party libraries on their error paths are suppressed (tests/lsan_suppressions.txt).
    # hf_export_test.py runs in the main build's Python environment rather than making a second one here.
    SEQLAB_PYENV="${SEQLAB_PYENV:-$SEQLAB_ROOT/build/pyenv}" \
    ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
      LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$SEQLAB_ROOT/tests/lsan_suppressions.txt:print_suppressions=0}" \
      ctest --test-dir "$SEQLAB_BUILD" -L cpu --output-on-failure -j "$jobs"
  else
    SEQLAB_BUILD="$SEQLAB_ROOT/build-tsan"
    SEQLAB_CMAKE_ARGS="-DCMAKE_CXX_COMPILER=clang++ -DSEQLAB_CUDA=OFF -DSEQLAB_SANITIZE=thread"
    seqlab_build "${TSAN_TESTS[@]}"
    seqlab_say "TSan: ${TSAN_TESTS[*]} in $SEQLAB_BUILD"
    # Two threads at least, even on a one-core machine, so that the kernels' parallel loops do run
    # in parallel; OpenBLAS single-threaded (its threads are not instrumented, and seqlab's own
    # parallel loops are what is checked). Archer (libarcher.so, beside libomp) is loaded as the
    # OpenMP tool so that TSan sees OpenMP's synchronisation; libomp's own internals, which are not
    # instrumented, are suppressed (tests/tsan_suppressions.txt).
    archer="$(dirname "$(readlink -f "$(command -v clang++)")")/../lib/libarcher.so"
    [ -f "$archer" ] || { seqlab_say "sanitize.sh: no $archer (package libomp-dev)"; exit 1; }
    regex="^($(IFS='|'; echo "${TSAN_TESTS[*]}"))\$"
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" OPENBLAS_NUM_THREADS=1 OMP_TOOL_LIBRARIES="$(readlink -f "$archer")" \
      TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1 suppressions=$SEQLAB_ROOT/tests/tsan_suppressions.txt}" \
      ctest --test-dir "$SEQLAB_BUILD" -R "$regex" --output-on-failure -j "$jobs"
  fi
done
