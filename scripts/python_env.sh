#!/usr/bin/env bash
# The Python environment of the tests that check seqlab against code no one here wrote: PyTorch 2.x (used
# on the CPU), Hugging Face `transformers` and `safetensors`, in a virtual environment that later runs reuse
# (tests/hf_export_test.py keeps it in the build folder: build/pyenv). Prints the environment's python on
# stdout; progress and errors go to stderr.
#
#   scripts/python_env.sh VENV [PYTHON]      PYTHON makes the environment (default: python3)
#
# A warm environment costs one import check (a few seconds). A cold one is made from PyPI without the
# multi-GB set of CUDA wheels that `pip install torch` pulls in: the torch wheel itself with --no-deps, the
# few small pure-Python packages torch imports, and the four small nvidia wheels whose libraries the CUDA
# toolkit of this machine kind (/usr/local/cuda, found through ldconfig) lacks; torch loads the rest of its
# CUDA libraries from that toolkit at import and then runs on the CPU. transformers and safetensors come
# from PyPI with their own dependencies. Versions are pinned (each one listed by `pip index versions`), so
# every machine tests against the same transformers.
#
# Exit status: 0 with the python printed; 1 with one line naming the step that failed (its pip output is
# in VENV.log); 2 for a wrong invocation.
set -euo pipefail

TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.24.0
SAFETENSORS_VERSION=0.8.0
# The nvidia wheels torch 2.15's CUDA libraries load that the CUDA 13 toolkit does not ship (the versions
# torch's own metadata requires).
NVIDIA_WHEELS=(nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2 nvidia-cufile==1.17.1.22
               nvidia-nccl-cu13==2.30.7)
# What torch imports that --no-deps leaves out (its metadata's requirements, minus the CUDA wheels).
TORCH_DEPS=(filelock 'typing-extensions>=4.13.0' 'setuptools>=77.0.3' 'sympy>=1.13.3' networkx jinja2 fsspec numpy)

say() { printf 'python_env: %s\n' "$*" >&2; }

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  say "usage: scripts/python_env.sh VENV [PYTHON]"
  exit 2
fi
venv="$1"
python="${2:-python3}"
log="$venv.log"
if ! command -v "$python" >/dev/null 2>&1; then
  say "no '$python' to make the environment with (Debian: apt-get install python3 python3-venv)"
  exit 1
fi

# The check a warm environment passes: every package imports at its pinned version.
check_env() {
  "$venv/bin/python" - "$TORCH_VERSION" "$TRANSFORMERS_VERSION" "$SAFETENSORS_VERSION" <<'PY' 2>/dev/null
import sys
import safetensors, torch, transformers
want = dict(zip(("torch", "transformers", "safetensors"), sys.argv[1:]))
have = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
        "safetensors": safetensors.__version__}
sys.exit(0 if have == want else 1)
PY
}

mkdir -p "$(dirname "$venv")"
# One installer at a time per environment (two build folders' test runs may share one: SEQLAB_PYENV).
exec 9>"$venv.lock"
flock 9

if [ -x "$venv/bin/python" ] && check_env; then
  echo "$(cd "$venv" && pwd)/bin/python"
  exit 0
fi

start=$SECONDS
: >"$log"
# Runs one install step with its output in the log; on failure names the step and shows the log's end.
step() {
  local what="$1"
  shift
  say "$what"
  if ! "$@" >>"$log" 2>&1; then
    tail -n 15 "$log" >&2
    say "failed: $what (full log: $log; pip needs PyPI, or the index that pip's configuration names)"
    exit 1
  fi
}

say "making the Python environment $venv (first use: downloads about 1 GB from PyPI; log: $log)"
if [ -e "$venv" ]; then
  # A half-made or outdated environment is rebuilt from scratch rather than patched; anything else at
  # that path is left alone.
  if [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ]; then
    say "$venv exists and is not a Python environment (no pyvenv.cfg): name another folder"
    exit 1
  fi
  rm -rf -- "$venv"
fi
step "python venv ($("$python" --version 2>&1))" "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
step "torch $TORCH_VERSION (the wheel alone, --no-deps)" "${pip[@]}" install --no-cache-dir --no-deps "torch==$TORCH_VERSION"
step "torch's Python dependencies" "${pip[@]}" install "${TORCH_DEPS[@]}"
step "the nvidia libraries the CUDA toolkit lacks" "${pip[@]}" install --no-deps "${NVIDIA_WHEELS[@]}"
step "transformers $TRANSFORMERS_VERSION and safetensors $SAFETENSORS_VERSION" \
  "${pip[@]}" install "transformers==$TRANSFORMERS_VERSION" "safetensors==$SAFETENSORS_VERSION"
step "checking that torch runs" "$venv/bin/python" -c 'import torch; print(torch.randn(3) @ torch.randn(3))'
if ! check_env; then
  say "failed: the environment does not import torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION and" \
      "safetensors $SAFETENSORS_VERSION (log: $log)"
  exit 1
fi
say "ready in $((SECONDS - start)) s: $venv"
echo "$(cd "$venv" && pwd)/bin/python"
