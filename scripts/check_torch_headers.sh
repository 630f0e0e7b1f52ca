#!/usr/bin/env bash
# Compiles baton against another LibTorch's headers, without linking: every
# translation unit of the modules, examples and tools (and, with --tests, the
# tests) is checked with -fsyntax-only against torch==VERSION's include tree,
# with the exact flags of the configured build. It keeps the supported range
# (LibTorch 2.11 to the pinned 2.15, README "Dependencies") true.
#
#   bash scripts/check_torch_headers.sh [VERSION] [--tests]    (default 2.11.0)
#
# Needs a configured build directory ($BUILD_DIR, default build/; it reads
# its compile_commands.json and its generated Cap'n Proto headers). The wheel
# is downloaded once from PyPI into .whl/ (about 530 MB) and only its headers
# are unpacked. A few minutes on 2 cores; not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.11.0
scope='^(base|net|runtime|dispatch|engine|text|data|workers|trainer|examples|tools)/'
for arg in "$@"; do
  case "$arg" in
    --tests) scope='^(base|net|runtime|dispatch|engine|text|data|workers|trainer|examples|tools|tests)/' ;;
    *) version="$arg" ;;
  esac
done
build="${BUILD_DIR:-build}"
python="${BATON_VENV:-/opt/baton-venv}/bin/python"
[[ -f "$build/compile_commands.json" ]] || {
  echo "check_torch_headers: no $build/compile_commands.json (run scripts/build.sh first)" >&2
  exit 2
}
root=".whl/torch-$version"
if [[ ! -d "$root/torch/include" ]]; then
  mkdir -p .whl
  "$python" -m pip download --no-deps "torch==$version" --python-version 3.11 \
    --only-binary=:all: --platform manylinux_2_28_x86_64 -d .whl
  wheel=$(ls .whl/torch-"$version"-*.whl | head -1)
  mkdir -p "$root"
  (cd "$root" && unzip -q -o "../$(basename "$wheel")" 'torch/include/*')
fi
theirs="$(cd "$root" && pwd)/torch/include"
ours=$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")

"$python" - "$build" "$ours" "$theirs" "$scope" "$(nproc)" <<'EOF'
import json, os, re, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

build, ours, theirs, scope, jobs = sys.argv[1:]
source_root = os.getcwd()
entries = json.load(open(os.path.join(build, "compile_commands.json")))
commands = []
for e in entries:
    rel = os.path.relpath(e["file"], source_root)
    if not re.match(scope, rel) or not rel.endswith(".cpp"):
        continue
    args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-MD", "-Winvalid-pch", "-c") or a.startswith("-fpch"):
            continue
        if a == "-include" and i + 1 < len(args) and "cmake_pch" in args[i + 1]:
            skip = True
            continue
        out.append(a.replace(ours, theirs))
    commands.append((rel, out + ["-fsyntax-only"], e["directory"]))

def check(item):
    rel, cmd, cwd = item
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return rel, r.returncode, r.stderr

failed = []
with ThreadPoolExecutor(int(jobs)) as pool:
    for rel, rc, err in pool.map(check, commands):
        print(("ok    " if rc == 0 else "FAIL  ") + rel, flush=True)
        if rc != 0:
            failed.append(rel)
            print("\n".join(err.splitlines()[:30]))
print(json.dumps({"torch_headers": theirs, "files": len(commands), "failed": failed}))
sys.exit(1 if failed else 0)
EOF
