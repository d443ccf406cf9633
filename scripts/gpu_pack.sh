#!/usr/bin/env bash
# Packs a CUDA build made on this machine so that scripts/gpu_check.sh can run it on a GPU machine instead of
# building there (a GPU machine's time is scarce; building for one architecture here costs none of it). The
# tarball holds what the GPU stages run: seqlab, the benchmarks, every test program and script that CTest
# names, the project's shared libraries and the CTest files, and a manifest with the build's absolute path
# (its programs find their libraries and tests by it). gpu_check.sh unpacks it at that path (linking the path
# to its own checkout where the path does not exist), checks that the programs start there, and otherwise
# falls back to building. The build must come from this checkout's sources, CUDA on (SEQLAB_CUDA=ON or AUTO
# with nvcc found); third-party libraries come from .debs/ on the GPU machine as for a build there.
#
# Usage: scripts/gpu_pack.sh [BUILD [TARBALL]]   (defaults: build, .debs/prebuilt.tar.gz)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
tarball="${2:-$root/.debs/prebuilt.tar.gz}"
say() { printf 'gpu_pack: %s\n' "$*" >&2; }
[ -f "$build/CMakeCache.txt" ] || { say "$build is not a CMake build folder"; exit 1; }
[ -f "$build/libseqlab_cuda.so" ] || { say "$build has no libseqlab_cuda.so: not a CUDA build (configure with -DSEQLAB_CUDA=ON)"; exit 1; }
programs=(seqlab gpt_train_bench attention_bench gla_kernel_bench)
for f in "$root"/tests/*_gpu_test.cc; do programs+=("$(basename "$f" .cc)"); done
ninja -C "$build" "${programs[@]}" > /dev/null || { say "ninja failed in $build"; exit 1; }
mkdir -p "$(dirname "$tarball")"
manifest="$build/prebuilt_manifest.txt"
{
  echo "root=$root"
  echo "build=$build"
  echo "commit=$(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2> /dev/null || echo +changes)"
  echo "cuda_architectures=$(sed -n 's/^SEQLAB_CUDA_ARCHITECTURES:STRING=//p' "$build/CMakeCache.txt")"
  echo "made=$(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n), $(ldd --version | head -n 1)"
} > "$manifest"
(cd "$build" && tar -czf "$tarball" prebuilt_manifest.txt "${programs[@]}" lib*.so* $(find . -name CTestTestfile.cmake))
say "$(du -h "$tarball" | cut -f 1) in $tarball ($(cat "$manifest" | tr '\n' ' '))"
