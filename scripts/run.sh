#!/usr/bin/env bash
# Quick start, part one: set up, build, and run the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/examples/hello_workers
