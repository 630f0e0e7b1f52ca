#!/usr/bin/env bash
# Installs this build into a scratch prefix, then configures, builds and runs
# tests/install/external (a driver that knows baton only through
# find_package(baton)) and README.md's custom-worker example (built from its
# one include, workers/worker_api.h). Fails if any step does, or if an
# internal header was installed.
#   install_test.sh BUILD_DIR SOURCE_DIR MODEL_DIR
set -euo pipefail
build="$(realpath "$1")"
src="$(realpath "$2")"
model="$(realpath "$3")"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null

# The public headers only: nothing of runtime/internal/, the relay, the agent
# protocol, the store's server and protocol, or the generated wire schema.
internal="$(cd "$scratch/prefix/include/baton" &&
  find . -path '*/internal/*' -o -name relay.h -o -name agent_protocol.h \
    -o -name store_protocol.h -o -name store_server.h -o -name '*.capnp.h')"
if [[ -n "$internal" ]]; then
  echo "install_test: internal headers were installed:" >&2
  echo "$internal" >&2
  exit 1
fi

# The external project, plus the README's example as my_worker.cpp.
cp -r "$src/tests/install/external" "$scratch/external"
awk '/<!-- custom-worker-example/ {armed = 1; next}
     armed && /^```cpp/ {inside = 1; next}
     inside && /^```/ {exit}
     inside {print}' "$src/README.md" >"$scratch/external/my_worker.cpp"
if ! grep -q 'BATON_WORKER(' "$scratch/external/my_worker.cpp"; then
  echo "install_test: README.md has no custom-worker example block" >&2
  exit 1
fi
if grep '#include "' "$scratch/external/my_worker.cpp" | grep -v '"workers/worker_api.h"'; then
  echo "install_test: the custom-worker example includes more than workers/worker_api.h" >&2
  exit 1
fi

cmake -S "$scratch/external" -B "$scratch/build" -G Ninja \
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
out="$("$scratch/build/my_worker" "$model")"
echo "$out"
[[ "$out" == *"custom worker ok: ref_log_prob [2, 2]"* ]]
