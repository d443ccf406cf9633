#!/usr/bin/env bash
# Builds everything and runs every test through CTest; then the CPU tests again under ASan + UBSan
# (scripts/sanitize.sh asan: clang, in build-asan/) and 20 s of fuzzing per parser (scripts/fuzz.sh 20,
# in the same build). Tests labelled `gpu` skip without a GPU. The Python environment that checks the
# export against Hugging Face transformers (build/pyenv, scripts/python_env.sh) is made first when missing.
# With arguments, they go to ctest and the sanitized run and the fuzzing are left out: `./test.sh -L gpu`
# runs only the GPU tests (on a machine with one), `./test.sh -R gla` the tests whose name holds "gla".
set -euo pipefail
source "$(dirname "$0")/scripts/setup.sh"
seqlab_install_packages "${SEQLAB_PACKAGES[@]}" "${SEQLAB_TEST_PACKAGES[@]}"
seqlab_ensure_numpy
seqlab_build
if [ $# -eq 0 ]; then
  # Made here rather than inside the test, so that a first run shows the install's progress; the test
  # (and the sanitized run's, which shares it through SEQLAB_PYENV) then finds it ready. A failure is
  # reported by hf_export_test.py, which tries again; the other tests run regardless.
  seqlab_python_env || seqlab_say "the Python environment of hf_export_test.py could not be made (above)"
fi
ctest --test-dir "$SEQLAB_BUILD" --output-on-failure -j "$(nproc)" "$@"
if [ $# -eq 0 ]; then
  SEQLAB_PYENV="${SEQLAB_PYENV:-$SEQLAB_BUILD/pyenv}" "$SEQLAB_ROOT/scripts/sanitize.sh" asan
  "$SEQLAB_ROOT/scripts/fuzz.sh" 20
fi
