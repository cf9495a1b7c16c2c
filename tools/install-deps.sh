#!/usr/bin/env bash
# Installs the Debian packages streampool builds with, when any is missing. The CUDA toolkit is
# expected at /usr/local/cuda (or wherever CUDAToolkit_ROOT points); it is not a Debian package.
# Usage: tools/install-deps.sh [fuzz|coverage]   (fuzz: also clang and its runtimes, libFuzzer
# among them, for tools/fuzz.sh; coverage: also gcovr, for tools/coverage.sh)
set -euo pipefail
packages=(cmake ninja-build g++ libfmt-dev catch2 zlib1g-dev libcli11-dev nlohmann-json3-dev)
if [ "${1:-}" = fuzz ]; then
  packages+=(clang libclang-rt-dev)
elif [ "${1:-}" = coverage ]; then
  packages+=(gcovr)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
