#!/usr/bin/env bash
# Creates the Python environment baton builds against and checks with: a venv
# holding PyPI's torch (a CUDA build: its LibTorch headers, libraries and CMake
# package are what every baton target compiles and links against, with the
# nvidia-* wheels that libtorch_cuda needs) and HF transformers (the reference
# the HF-parity tests and benchmarks compare with).
#
# Idempotent: pip runs only when an installed version differs from the pins.
# The first run downloads ~3 GB and fills ~6 GB; about 3 minutes.
#
#   scripts/setup_python.sh        # venv at /opt/baton-venv (or $BATON_VENV)
#
# The last line printed is the path of the venv's python.
set -euo pipefail

venv="${BATON_VENV:-/opt/baton-venv}"

apt_packages=(python3-venv python3-pip)

# torch first: scripts/build.sh reads the LibTorch version from it. Raising a
# pin is a change to every build; say so in docs/benchmarks.md with figures.
pip_pins=(
  torch==2.15.0
  numpy==2.4.6
  transformers==5.23.0
  tokenizers==0.23.3
  safetensors==0.8.0
  huggingface_hub==2.4.0
  # Apache Arrow's C++ libraries for verl's parquet prompt files (cmake/arrow.cmake).
  pyarrow==26.0.1
  # PEFT: the LoRA peer of bench/recompute_bench_hf.py --compare lora (accelerate: its dependency).
  peft==0.21.2
  accelerate==1.15.0
  # TensorBoard's reader: the test that the trainer's event files load in it.
  tensorboard==2.21.0
  # trainer.logger: wandb runs this package (offline by default) in a subprocess; the
  # tests read its offline runs back with it (~10 s to install).
  wandb==0.31.0
  kubernetes-validate==1.37.0  # Kubernetes' API schemas, offline: examples/kubernetes/'s test
)

sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup_python: apt installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q >&2
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# Debian's interpreter, not a pyenv/other python3 that may come first on PATH:
# the venv must not change when PATH does.
if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup_python: creating venv $venv" >&2
  "${sudo_cmd[@]}" /usr/bin/python3 -m venv "$venv"
fi

# Compare every pin with what is installed (one interpreter start, no pip).
stale="$("$venv/bin/python" - "${pip_pins[@]}" <<'EOF'
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
EOF
)"
if [[ -n "$stale" ]]; then
  echo "setup_python: pip installing $(echo $stale)" >&2
  PIP_DISABLE_PIP_VERSION_CHECK=1 "${sudo_cmd[@]}" "$venv/bin/pip" install -q "${pip_pins[@]}" >&2
else
  echo "setup_python: pinned packages present in $venv" >&2
fi

"$venv/bin/python" - >&2 <<'EOF'
import torch, transformers
print(f"setup_python: torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}")
EOF
echo "$venv/bin/python"
