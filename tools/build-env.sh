# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Sourced (not run) by the build scripts: tools/quickstart.sh, tools/test.sh, .ci/tsan.sh,
# .ci/fuzz.sh, tools/check_configure.sh and bindings/torch/ci_test.sh.
#   - nvcc on PATH when the CUDA Toolkit is at /usr/local/cuda (CMake then builds the CUDA backend);
#   - ccache in front of every compiler (C, C++ and CUDA) when ccache is installed: CMake reads
#     CMAKE_<LANG>_COMPILER_LAUNCHER from the environment when it first configures a build folder,
#     pip's build of the PyTorch package included. CCACHE_BASEDIR is the repository root, so
#     that paths are hashed relative to it and a fresh clone elsewhere on the same machine (CI)
#     hits the cache of an earlier one; CCACHE_NOHASHDIR does the same for builds with debug info
#     (whose DW_AT_comp_dir then names the build folder that filled the cache).
# NF4_CCACHE=0 leaves ccache out; launchers already set in the environment are kept. The cache is
# ccache's own (CCACHE_DIR, default ~/.cache/ccache; `ccache -s` shows its hits).
nf4_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="/usr/local/cuda/bin:$PATH" ;; esac
fi
if [ "${NF4_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  export CMAKE_C_COMPILER_LAUNCHER="${CMAKE_C_COMPILER_LAUNCHER:-ccache}"
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
  export CMAKE_CUDA_COMPILER_LAUNCHER="${CMAKE_CUDA_COMPILER_LAUNCHER:-ccache}"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$nf4_root}"
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi
unset nf4_root
