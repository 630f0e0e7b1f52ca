#!/usr/bin/env bash
# Installs the Python environment used to make and check baton's HF reference
# fixtures (tests/engine/fixtures/) and to run scripts/hf_check.py:
#   - Debian's python3-torch (1.13.1, the same LibTorch release as libtorch-dev
#     that scripts/setup.sh installs for the engine), CPU only, no CUDA wheels;
#   - a venv with --system-site-packages (so it sees Debian's torch and numpy)
#     holding pinned PyPI packages: transformers 4.49.0 is the newest release
#     that still imports with torch 1.13 (4.50+ needs torch.distributed.tensor).
#
# Idempotent: apt packages already present are skipped, and pip is not run when
# the venv already has the pinned transformers version.
#
#   scripts/setup_hf.sh            # venv at /opt/baton-hf (or $BATON_HF_VENV)
#
# The last line printed is the path of the venv's python.
set -euo pipefail

venv="${BATON_HF_VENV:-/opt/baton-hf}"

apt_packages=(python3-torch python3-numpy python3-venv python3-pip)

pip_pins=(
  transformers==4.49.0
  tokenizers==0.21.4
  safetensors==0.8.0
  huggingface_hub==0.36.2
)

sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup_hf: apt installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q >&2
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
else
  echo "setup_hf: apt packages present" >&2
fi

# Debian's interpreter, not a pyenv/other python3 that may come first on PATH:
# python3-torch is installed for /usr/bin/python3 only.
sys_python=/usr/bin/python3

if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup_hf: creating venv $venv" >&2
  "${sudo_cmd[@]}" "$sys_python" -m venv --system-site-packages "$venv"
fi

want_tf="${pip_pins[0]#transformers==}"
have_tf="$("$venv/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || true)"
if [[ "$have_tf" != "$want_tf" ]]; then
  echo "setup_hf: pip installing ${pip_pins[*]}" >&2
  PIP_DISABLE_PIP_VERSION_CHECK=1 "${sudo_cmd[@]}" "$venv/bin/pip" install -q "${pip_pins[@]}" >&2
else
  echo "setup_hf: transformers $have_tf present in $venv" >&2
fi

"$venv/bin/python" - >&2 <<'EOF'
import torch, transformers, safetensors, numpy
print(f"setup_hf: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"safetensors {safetensors.__version__}, numpy {numpy.__version__}")
EOF
echo "$venv/bin/python"
