#!/usr/bin/env bash
# Installs what is missing, then configures and builds baton into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
  -DBATON_WERROR="${BATON_WERROR:-OFF}"
cmake --build build
