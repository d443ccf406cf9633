#!/usr/bin/env bash
# Fetches, on a machine where apt works, the Debian .deb files that a GPU machine without apt or network
# needs to build seqlab: Abseil, toml++, OpenBLAS (pthread flavour), GoogleTest and Gloo, with the runtime
# libraries they pull in beyond what any machine with g++ has (libc6, libgcc-s1, libstdc++6 and
# gcc-12-base are left out), and the fortunes corpus. The files land in .debs/ (ignored by git, carried
# to the GPU machine), where scripts/gpu_check.sh unpacks them with `dpkg -x` into a prefix. Nothing is
# installed here.
#
# Usage: scripts/gpu_debs.sh [DIR]      (default: .debs in the repository root)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.debs}"

# The dependency closure, read off `apt-cache depends` on Debian 12 (bookworm):
#   libabsl-dev -> libabsl20220623;  libtomlplusplus-dev -> libtomlplusplus3;
#   libopenblas-dev -> libopenblas0 (empty) | libopenblas-pthread-dev -> libopenblas0-pthread -> libgfortran5
#   -> libquadmath0;  libgmock-dev -> libgtest-dev -> googletest (GTest's CMake targets name gmock's
#   libraries too, so CMake refuses GTest without libgmock-dev's files);  libgloo-dev -> libgloo0 (in
#   /usr/lib) -> libhiredis0.14 (+ libhiredis-dev: Gloo's redis_store.h includes its header), libibverbs1
#   -> libnl-3-200, libnl-route-3-200 (the ibverbs headers are not needed: seqlab uses Gloo's TCP
#   transport, so libibverbs-dev and its own closure are left out); libgomp1 (OpenMP's runtime, which a
#   machine with g++ has, but one that only runs a prebuilt build may not). fortunes and fortunes-min are the
#   corpus of recipes/gpt_small.toml (/usr/share/games/fortunes), for the check that gpt_small trains.
packages=(libabsl-dev libabsl20220623
          libtomlplusplus-dev libtomlplusplus3
          libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
          libgtest-dev libgmock-dev googletest
          libgloo-dev libgloo0 libhiredis-dev libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
          libgomp1
          fortunes fortunes-min)

say() { printf 'gpu_debs: %s\n' "$*" >&2; }
command -v apt-get > /dev/null || { say "apt-get not found: run this on a Debian machine"; exit 1; }

mkdir -p "$dir"
rm -f "$dir"/*.deb
# apt-get download writes into the current folder; as root it warns that the _apt user cannot write there.
if ! (cd "$dir" && apt-get download -q "${packages[@]}" 2> >(grep -v "unsandboxed as root" >&2) > /dev/null); then
  say "apt-get download failed (try: apt-get update)"
  exit 1
fi

printf '%-60s %8s\n' "fetched into $dir:" "KiB"
total=0
for f in "$dir"/*.deb; do
  size=$(stat -c %s "$f")
  total=$((total + size))
  printf '  %-58s %8d\n' "$(basename "$f")" $((size / 1024))
done
printf '%-60s %8d\n' "total ($(ls "$dir"/*.deb | wc -l) files)" $((total / 1024))

# The newest glibc and libstdc++ symbol versions the shared libraries ask for: the GPU machine's must be at
# least these (gpu_check.sh prints its own glibc for comparison).
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for f in "$dir"/*.deb; do dpkg -x "$f" "$tmp"; done
symbols=$(find "$tmp" -name '*.so*' -type f -exec objdump -T {} + 2> /dev/null)
newest() { grep -o "$1[0-9.]*" <<<"$symbols" | sort -uV | tail -n 1; }
echo "the libraries need $(newest GLIBC_) and $(newest GLIBCXX_) (this machine: glibc $(ldd --version | head -n 1 | grep -o '[0-9.]*$'))"
