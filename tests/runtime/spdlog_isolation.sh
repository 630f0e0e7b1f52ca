#!/usr/bin/env bash
# spdlog (built against Debian's fmt 9) and LibTorch's headers (which carry
# fmt 12) must never meet in one translation unit (base/log.h). Fails if a
# source file that includes spdlog includes a LibTorch header, directly or
# through the project's own headers, or is compiled with LibTorch's include
# directories (compile_commands.json of the build).
#
#   bash tests/runtime/spdlog_isolation.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
torch_header='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](ATen|torch|c10|caffe2)/'
project_include='^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)"'

# The project headers a file reaches through "..." includes, transitively.
reach() {
  local -A seen=()
  local queue=("$1")
  while ((${#queue[@]})); do
    local f=${queue[0]}
    queue=("${queue[@]:1}")
    [[ -n "${seen[$f]:-}" ]] && continue
    seen[$f]=1
    echo "$f"
    while IFS= read -r inc; do
      [[ -f "$src/$inc" ]] && queue+=("$src/$inc")
    done < <(sed -nE "s|$project_include|\1|p" "$f")
  done
}

users=$(grep -rlE '#[[:space:]]*include[[:space:]]*[<"]spdlog/' "$src" \
  --include='*.cpp' --include='*.h' --exclude-dir=build --exclude-dir='build-*' \
  --exclude-dir=.whl --exclude-dir=.git || true)
if [[ -z "$users" ]]; then
  echo "no file includes spdlog (base/log.cpp should)"
  exit 1
fi
status=0
for f in $users; do
  while IFS= read -r h; do
    if grep -qE "$torch_header" "$h"; then
      echo "FAIL: $f includes spdlog and reaches a LibTorch header through $h:"
      grep -nE "$torch_header" "$h" | head -3
      status=1
    fi
  done < <(reach "$f")
  if [[ $f == *.cpp ]]; then
    cmd=$(python3 -c 'import json,sys
for e in json.load(open(sys.argv[1])):
    if e["file"] == sys.argv[2]: print(e.get("command") or " ".join(e["arguments"]))' \
      "$build/compile_commands.json" "$(realpath "$f")")
    if [[ -z "$cmd" ]]; then
      echo "FAIL: $f is not in $build/compile_commands.json"
      status=1
    elif grep -qE 'torch/include' <<<"$cmd"; then
      echo "FAIL: $f includes spdlog and is compiled with LibTorch's include directories"
      status=1
    fi
  fi
done
((status == 0)) && echo "ok: $(wc -w <<<"$users") file(s) include spdlog, none reaches LibTorch"
exit $status
