#!/usr/bin/env bash
# scripts/gpu_check.sh builds only the test binaries it names: each binary that
# holds a *_CUDA test must be among them, or that test never runs on a GPU (as
# happened on 2026-11-28, when the list missed engine_unit_tests).
# Usage: gpu_check_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
binaries=$(cd "$build" && ctest --show-only=json-v1 -R '_CUDA$' |
  grep -A2 '"command"' | grep -oE '"/[^"]+"' | tr -d '"' | xargs -r -n1 basename | sort -u)
[[ -n "$binaries" ]] || { echo "no *_CUDA test found in $build"; exit 1; }
list=$(sed -n '/^tests=(/,/)/p' "$src/scripts/gpu_check.sh")
missing=0
for b in $binaries; do
  if ! grep -qw "$b" <<<"$list"; then
    echo "scripts/gpu_check.sh: tests=(...) lacks $b, which holds *_CUDA tests"
    missing=1
  fi
done
((missing == 0)) && echo "gpu_check.sh builds every binary with a *_CUDA test: $(echo $binaries)"
exit $missing
