#!/usr/bin/env bash
# Installs every dependency of turbodiff from the package registries (Debian,
# PyPI) by name, then configures and builds. Idempotent; safe to re-run.
#
#   scripts/setup.sh                 # install + build into ./build (CUDA archs 90a;80 when nvcc is found)
#   TURBODIFF_CUDA_ARCHS=90a scripts/setup.sh   # Hopper only (what CI builds)
#   TURBODIFF_SKIP_APT=1 ...         # skip the apt step (already installed)
#   TURBODIFF_BUILD_DIR=dir ...      # build elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# Pinned versions of the header-only packages that come from PyPI.
CUTLASS_VERSION=4.2.0.0          # nvidia-cutlass: CUTLASS/CuTe headers
CUDNN_FRONTEND_VERSION=1.32.0    # nvidia-cudnn-frontend: cuDNN graph API headers

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache clang libclang-rt-14-dev
  nlohmann-json3-dev libcli11-dev libsentencepiece-dev
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev ffmpeg
  libstb-dev libpng-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pip unzip
)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

if [ "${TURBODIFF_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

# ---- pinned headers from PyPI, unpacked into .deps/ (git-ignored) ----------
DEPS="$ROOT/.deps"
mkdir -p "$DEPS"
PY=${PYTHON:-python3}
fetch_wheel() {  # name version dest-subdir path-inside-wheel
  local name=$1 version=$2 dest=$3 inner=$4
  local stamp="$DEPS/$dest/.version"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then return; fi
  local tmp
  tmp=$(mktemp -d)
  echo "setup: fetching $name==$version from PyPI"
  "$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$name==$version"
  rm -rf "${DEPS:?}/$dest"
  mkdir -p "$DEPS/$dest/unpacked"
  unzip -q "$tmp"/*.whl "$inner/*" -d "$DEPS/$dest/unpacked"
  ln -sfn "unpacked/$inner" "$DEPS/$dest/include"
  echo "$version" > "$stamp"
  rm -rf "$tmp"
}
fetch_wheel nvidia-cutlass "$CUTLASS_VERSION" cutlass cutlass_library/source/include
fetch_wheel nvidia-cudnn-frontend "$CUDNN_FRONTEND_VERSION" cudnn_frontend include
test -f "$DEPS/cutlass/include/cute/tensor.hpp"
test -f "$DEPS/cudnn_frontend/include/cudnn_frontend.h"

# ---- configure and build ------------------------------------------------------
BUILD=${TURBODIFF_BUILD_DIR:-build}
ARCHS=${TURBODIFF_CUDA_ARCHS:-90a;80}
launcher=()
if command -v ccache >/dev/null; then
  # Paths relative to the checkout, so another clone on the same machine (CI) hits the cache.
  export CCACHE_BASEDIR="$ROOT"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DTURBODIFF_CUDA_ARCHS=$ARCHS" "${launcher[@]}" \
  ${TURBODIFF_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "${TURBODIFF_JOBS:-$(nproc)}"
echo "setup: built $BUILD/turbodiff"
