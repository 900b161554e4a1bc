#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what nf4 needs to build and test on Debian 12 and Ubuntu 22.04 / 24.04 (every stage of
# tools/test.sh, on a machine where nothing was installed by hand), skipping what is already there:
#   build        cmake ninja-build make g++ pkg-config ccache, the headers of doctest, nlohmann-json,
#                CLI11 and fmt
#   Vulkan       libvulkan-dev glslc spirv-tools, and Mesa's lavapipe to run it on the CPU
#   fuzz         clang and its sanitizer/libFuzzer runtime (libclang-rt-<N>-dev where the
#                distribution splits it out of clang, N being clang's major version)
#   PyTorch      python3 with venv (ensurepip) and its headers (python3-dev) for the extension;
#                pip itself is upgraded inside each virtual environment, not here
#   downloads    ca-certificates (pip over HTTPS)
# The CUDA Toolkit is optional (detected at /usr/local/cuda); it is not installed from here.
set -euo pipefail
packages=(cmake ninja-build make g++ clang pkg-config ccache ca-certificates
          doctest-dev nlohmann-json3-dev libcli11-dev libfmt-dev
          libvulkan-dev glslc spirv-tools vulkan-validationlayers mesa-vulkan-drivers
          python3 python3-venv python3-dev)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
install() {
  local missing=() p
  for p in "$@"; do installed "$p" || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  echo "installing: ${missing[*]}" >&2
  if [ -z "${nf4_apt_updated:-}" ]; then $sudo apt-get update -qq; nf4_apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
install "${packages[@]}"
# clang's runtimes (libFuzzer, the sanitizers) are a package of their own from LLVM 14.0.6 on
# (Debian 12: libclang-rt-14-dev, Ubuntu 24.04: libclang-rt-18-dev); Ubuntu 22.04's clang 14 still
# carries them in libclang-common-14-dev, which clang depends on.
clang_major="$(clang -dumpversion | cut -d. -f1)"
rt="libclang-rt-$clang_major-dev"
if ! installed "$rt"; then
  if ! apt-cache show "$rt" >/dev/null 2>&1 && [ -z "${nf4_apt_updated:-}" ]; then
    $sudo apt-get update -qq
    nf4_apt_updated=1
  fi
  if apt-cache show "$rt" >/dev/null 2>&1; then install "$rt"; fi
fi
# The newer glslang for the Vulkan fast product's shader (optional; never fails the install).
"$(dirname "$0")/install-glslang.sh"
