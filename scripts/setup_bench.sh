#!/usr/bin/env bash
# Optional: installs the peers baton's benchmarks compare with into the venv
# that scripts/setup_python.sh made: HF TRL's GRPOTrainer (bench/e2e_bench.py
# --with-trl, bench/trl_grpo_toy.py) and Ray (bench/ray_compare.py). Neither setup.sh nor test.sh calls it; no
# build or test needs it.
#
# Idempotent: pip runs only when an installed version differs from the pins.
# torch and transformers are held at the versions installed (a constraints
# file), so the build's LibTorch and the HF-parity references do not move.
#
#   scripts/setup_bench.sh        # venv at /opt/baton-venv (or $BATON_VENV)
set -euo pipefail

venv="${BATON_VENV:-/opt/baton-venv}"

# trl 1.16.0 is the newest that pip resolves against transformers 5.23.0 and
# torch 2.15.0 without changing them; accelerate and datasets as it resolved them.
pip_pins=(
  trl==1.16.0
  accelerate==1.15.0
  datasets==5.2.0
  ray==2.60.0
)

if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup_bench: no venv at $venv; run scripts/setup_python.sh first" >&2
  exit 1
fi

sudo_cmd=()
[[ -w "$venv" ]] || sudo_cmd=(sudo)

stale="$("$venv/bin/python" - "${pip_pins[@]}" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != want:
        print(pin)
PY
)"
if [[ -z "$stale" ]]; then
  echo "setup_bench: pinned packages present in $venv" >&2
  exit 0
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$venv/bin/python" - >"$constraints" <<'PY'
from importlib.metadata import version
for name in ("torch", "transformers", "tokenizers", "safetensors", "numpy"):
    print(f"{name}=={version(name)}")
PY
echo "setup_bench: pip installing $(echo $stale)" >&2
PIP_DISABLE_PIP_VERSION_CHECK=1 "${sudo_cmd[@]}" "$venv/bin/pip" install -q \
  -c "$constraints" "${pip_pins[@]}" >&2
"$venv/bin/python" -c 'import ray, trl, torch, transformers; print(f"setup_bench: ray {ray.__version__}, trl {trl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")' >&2
