#!/usr/bin/env bash
# Installs baton's build dependencies: Debian's packages, then LibTorch (PyPI's
# torch wheel, a CUDA build) and HF transformers in the venv that
# scripts/setup_python.sh makes. Idempotent: packages already present are
# skipped, and nothing is fetched when all are installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  # The linker: several times faster than GNU ld on the LibTorch-linked tests.
  mold
  # Gloo's headers: c10d's ProcessGroupGloo.hpp includes them and the torch
  # wheel does not ship them (its Gloo is linked into libtorch_cpu). Only
  # option and pointer types cross that boundary.
  libgloo-dev
  libcapnp-dev capnproto
  libboost-dev
  libtbb-dev
  # base/log.cpp's per-run log file (rotating, timestamped); Debian's spdlog
  # uses Debian's fmt, which only log.cpp (no LibTorch header) ever sees.
  libspdlog-dev
  libyaml-cpp-dev
  # Unicode regexes of tokenizer pre-tokenizers (text/tokenizer/).
  libpcre2-dev
  # TLS 1.3 for the TCP listeners (net/tls.h; optional: built when found).
  libssl-dev
  nlohmann-json3-dev
  # Training curves (trainer/metrics.h: MetricsLogger::plot runs gnuplot).
  gnuplot-nox
  googletest libgtest-dev libgmock-dev
  # pgrep, which tests/examples/kill_during_save.sh checks for survivors with.
  procps
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# LibTorch (and the HF reference the parity tests use): a venv with PyPI's
# torch and transformers (at $BATON_VENV, default /opt/baton-venv), about 3
# minutes the first time. BATON_NO_VENV=1 skips it, for a machine whose own
# torch is the LibTorch to build against (scripts/gpu_check.sh).
if [[ "${BATON_NO_VENV:-0}" != 1 ]]; then
  bash "$(dirname "$0")/setup_python.sh" >/dev/null
fi
