#!/usr/bin/env bash
# Installs this build into a scratch prefix, then configures, builds and runs
# tests/install/external (a driver that knows baton only through
# find_package(baton)). Fails if any step does.
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$(realpath "$1")"
src="$(realpath "$2")"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$src/tests/install/external" -B "$scratch/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$scratch/prefix" >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log" >&2; exit 1; }
cmake --build "$scratch/build" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log" >&2; exit 1; }
# Nothing of the source tree may be needed: the include path is the install's.
if grep -qE -- "(-I|-isystem )$src( |$)" "$scratch/build/build.ninja"; then
  echo "install_test: the external build reached into the source tree $src" >&2
  exit 1
fi
out="$("$scratch/build/my_driver")"
echo "$out"
[[ "$out" == *"external driver ok"* ]]
