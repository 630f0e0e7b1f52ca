#!/usr/bin/env bash
# Installs baton's build dependencies from Debian's packages. Idempotent: packages
# already present are skipped, and nothing is fetched when all are installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev
  # An optimised BLAS behind LibTorch's CPU matrix multiplies (Debian's libtorch
  # otherwise runs on the reference BLAS, about 20x slower). The OpenMP build
  # follows at::set_num_threads, so worker processes do not oversubscribe cores.
  libopenblas0-openmp
  libcapnp-dev capnproto
  libboost-dev
  libtbb-dev
  libspdlog-dev
  libyaml-cpp-dev
  nlohmann-json3-dev
  googletest libgtest-dev libgmock-dev
  libbenchmark-dev
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

# The Python side of the HF-compatibility test (tests/engine/hf_export_test.sh):
# Debian's python3-torch plus transformers in a venv, about a minute the first time.
bash "$(dirname "$0")/setup_hf.sh" >/dev/null
