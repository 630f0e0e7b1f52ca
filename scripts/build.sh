#!/usr/bin/env bash
# Installs what is missing, then configures and builds baton.
#   BUILD_DIR      build directory (default build/)
#   BUILD_TYPE     CMake build type (default RelWithDebInfo)
#   BUILD_TARGETS  targets to build (default: all)
#   BATON_WERROR   ON to turn warnings into errors
#   BATON_CUDA     OFF to build against a CPU-only LibTorch (default ON)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python="${BATON_VENV:-/opt/baton-venv}/bin/python"
dir="${BUILD_DIR:-build}"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DBATON_PYTHON="$python" -DBATON_CUDA="${BATON_CUDA:-ON}" \
  -DBATON_WERROR="${BATON_WERROR:-OFF}"
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$dir" "${targets[@]}"
