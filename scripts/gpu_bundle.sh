#!/usr/bin/env bash
# Packs what the GPU machine needs from a build made here (no GPU needed to
# build) into .gpu_bundle/ (git-ignored, well under the 64 MiB carry limit):
# the CLI, the test binaries and the benches. Then, on the GPU machine:
#   tar xJf .gpu_bundle.tar.xz && scripts/gpu_check.sh .gpu_bundle
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
rm -rf .gpu_bundle
mkdir -p .gpu_bundle/bench
cp "$BUILD/turbodiff" .gpu_bundle/
cp "$BUILD/tests/turbodiff_tests" .gpu_bundle/
[ -f "$BUILD/tests/turbodiff_gpu_tests" ] && cp "$BUILD/tests/turbodiff_gpu_tests" .gpu_bundle/
for b in "$BUILD"/bench/bench_*; do
  [ -x "$b" ] && [ -f "$b" ] && cp "$b" .gpu_bundle/bench/
done
# Shared libraries from this machine's Debian packages that the GPU machine's
# image may hold in another, ABI-incompatible version (seen: libsentencepiece.so.0
# there returned garbage ids). gpu_check.sh puts .gpu_bundle/lib first on the
# loader path. CUDA libraries are not carried: the GPU machine's own match its driver.
mkdir -p .gpu_bundle/lib
for lib in $(ldd "$BUILD/turbodiff" | awk '/=> \// {print $3}' | grep -E 'libsentencepiece'); do
  cp -L "$lib" .gpu_bundle/lib/
done
strip --strip-debug .gpu_bundle/turbodiff .gpu_bundle/turbodiff_* .gpu_bundle/bench/* 2>/dev/null || true
du -sh .gpu_bundle
# The binaries each carry every kernel; compressed they travel in a fraction
# of the carry limit. On the GPU machine: tar xJf .gpu_bundle.tar.xz
tar cf - .gpu_bundle | xz -T2 -3 > .gpu_bundle.tar.xz
ls -la .gpu_bundle.tar.xz
