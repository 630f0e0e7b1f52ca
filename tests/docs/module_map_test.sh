#!/usr/bin/env bash
# docs/architecture.md's module map names exactly the folders that hold code:
# every folder with a .h or .cpp file (tests/ counts as one) is in the table
# after the "module-map" marker, and every folder the table names exists and
# holds code. A folder added, moved or removed without the map fails here.
#   module_map_test.sh SOURCE_DIR
set -euo pipefail
src="$(realpath "$1")"
doc="$src/docs/architecture.md"

documented="$(awk '/<!-- module-map/ {armed = 1; next}
  armed && /^\|/ {in_table = 1; split($0, cells, "|"); cell = cells[2]
                  if (match(cell, /`[^`]+\/`/)) print substr(cell, RSTART + 1, RLENGTH - 2); next}
  in_table {exit}' "$doc" | sort -u)"
if [[ -z "$documented" ]]; then
  echo "module_map_test: no module-map table in $doc" >&2
  exit 1
fi

actual="$(cd "$src" && find . \( -path ./.git -o -path './build*' \) -prune -o \
    -type f \( -name '*.h' -o -name '*.cpp' \) -print |
  sed -e 's|^\./||' -e 's|/[^/]*$|/|' -e 's|^tests/.*|tests/|' | sort -u)"

missing="$(comm -13 <(echo "$documented") <(echo "$actual"))"
stale="$(comm -23 <(echo "$documented") <(echo "$actual"))"
status=0
if [[ -n "$missing" ]]; then
  echo "module_map_test: folders with code that docs/architecture.md's module map does not name:" >&2
  echo "$missing" >&2
  status=1
fi
if [[ -n "$stale" ]]; then
  echo "module_map_test: folders docs/architecture.md's module map names that hold no code:" >&2
  echo "$stale" >&2
  status=1
fi
[[ $status -eq 0 ]] && echo "module map: $(echo "$actual" | wc -l) folders, all documented"
exit $status
