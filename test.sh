#!/usr/bin/env bash
# Builds everything and runs every test through CTest. Tests labelled `gpu` skip without a GPU;
# `./test.sh -L gpu` runs only those (on a machine with one).
set -euo pipefail
source "$(dirname "$0")/scripts/setup.sh"
seqlab_install_packages
seqlab_ensure_numpy
seqlab_build
exec ctest --test-dir "$SEQLAB_BUILD" --output-on-failure -j "$(nproc)" "$@"
