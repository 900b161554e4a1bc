#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what nf4 needs to build and test on Debian/Ubuntu, skipping what is already there.
# The CUDA Toolkit is optional (detected at /usr/local/cuda); it is not installed from here.
set -euo pipefail
packages=(cmake ninja-build g++ clang libclang-rt-14-dev pkg-config
          doctest-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          libvulkan-dev glslc spirv-tools vulkan-validationlayers mesa-vulkan-drivers python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
