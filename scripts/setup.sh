# Shared set-up for ./train and ./test.sh: Debian packages, then a configured and up-to-date build/.
# Sourced, not run. Every step is a no-op when already done.

SEQLAB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEQLAB_BUILD="${SEQLAB_BUILD:-$SEQLAB_ROOT/build}"

# Debian packages the build, the tests, the default corpus and `seqlab plot` need (libgloo-dev: the
# CPU collectives of src/dist; libdnnl-dev: oneDNN, for bf16 GEMMs on the CPU's bf16 instructions;
# ccache: the compiler cache the build uses where it is installed).
SEQLAB_PACKAGES=(cmake ninja-build ccache g++ git libabsl-dev googletest libgtest-dev libtomlplusplus-dev
                 libopenblas-dev libdnnl-dev libgloo-dev python3 fortunes fortunes-min gnuplot-nox)

# What ./test.sh adds for the fuzzing and sanitizer builds (scripts/fuzz.sh, scripts/sanitize.sh): clang,
# its sanitizer and libFuzzer runtimes, and LLVM's OpenMP runtime, which clang's -fopenmp links.
SEQLAB_CLANG_PACKAGES=(clang libclang-rt-14-dev libomp-dev)
# What ./test.sh adds for the tests alone: a Redis server, for the multi-node launch through Gloo's Redis
# store (tests/train_dp_test.sh starts a private one; without it that case is skipped); Python's venv
# module, for the environment of PyTorch and transformers that tests/hf_export_test.py runs in
# (scripts/python_env.sh).
SEQLAB_TEST_PACKAGES=(redis-server python3-venv)

# Idle OpenMP threads spin only briefly, then sleep: on a machine shared with other work, threads that
# keep spinning steal the cores the busy ones need (a GPT step measured 2-4x slower under load with
# libgomp's default), while a short spin (GOMP_SPINCOUNT, libgomp's) catches the next parallel region of a
# training step without a wake-up (docs/perf.md, "Idle OpenMP threads"). Override by setting either.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-3000}"

seqlab_say() { printf 'seqlab: %s\n' "$*" >&2; }

# Installs the Debian packages named (by default SEQLAB_PACKAGES) that are missing.
seqlab_install_packages() {
  local missing=() pkg wanted=("$@")
  [ $# -gt 0 ] || wanted=("${SEQLAB_PACKAGES[@]}")
  for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    seqlab_say "missing Debian packages; install them with:"
    printf '  sudo apt-get update && sudo apt-get install -y %s\n' "${missing[*]}" >&2
    return 1
  fi
  seqlab_say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null || {
    seqlab_say "apt-get install failed for: ${missing[*]}"
    return 1
  }
}

# Configures build/ on first use (or when its configuration is gone) and rebuilds what changed.
# Extra arguments name targets; by default everything is built.
seqlab_build() {
  local log="$SEQLAB_BUILD/build.log"
  if [ ! -f "$SEQLAB_BUILD/build.ninja" ]; then
    seqlab_say "configuring and building $SEQLAB_BUILD (the first build takes a few minutes; log: $log)"
    mkdir -p "$SEQLAB_BUILD"
    if ! cmake -S "$SEQLAB_ROOT" -B "$SEQLAB_BUILD" -G Ninja ${SEQLAB_CMAKE_ARGS:-} >"$SEQLAB_BUILD/configure.log" 2>&1; then
      tail -n 30 "$SEQLAB_BUILD/configure.log" >&2
      seqlab_say "configuration failed (full log: $SEQLAB_BUILD/configure.log)"
      rm -f "$SEQLAB_BUILD/build.ninja"
      return 1
    fi
  fi
  if ! ninja -C "$SEQLAB_BUILD" "$@" >"$log" 2>&1; then
    grep -E 'error|FAILED' -A 5 "$log" | head -n 40 >&2
    seqlab_say "build failed (full log: $log)"
    return 1
  fi
}

# The virtual environment of PyTorch, transformers and safetensors that tests/hf_export_test.py runs in
# (scripts/python_env.sh): made in $SEQLAB_PYENV, by default build/pyenv, on first use (about 2 minutes and
# 1 GB from PyPI), only checked afterwards. Its progress goes to stderr.
seqlab_python_env() {
  "$SEQLAB_ROOT/scripts/python_env.sh" "${SEQLAB_PYENV:-$SEQLAB_BUILD/pyenv}" python3 >/dev/null
}

seqlab_ensure_numpy() {
  python3 -c 'import numpy' 2>/dev/null && return 0
  seqlab_say "installing numpy for the op-runner tests"
  python3 -m pip install -q numpy >/dev/null 2>&1 || {
    seqlab_say "could not install numpy: run  python3 -m pip install numpy"
    return 1
  }
}
