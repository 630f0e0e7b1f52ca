#!/usr/bin/env bash
# Quick start, part two: set up, build, and run every test CI runs.
# Extra arguments go to ctest (e.g. -L unit, -R WorkerGroup).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
bash scripts/build.sh
built=$SECONDS
ctest --test-dir build --output-on-failure -j2 "$@"
echo "test.sh: setup + build ${built} s, tests $((SECONDS - built)) s"
