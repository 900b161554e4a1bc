#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Configure only (seconds): nf4 with CMake's default generator (Unix Makefiles; every other script
# uses Ninja), as a user's first `cmake -S . -B build` does, and as a subproject of another
# project (add_subdirectory) with the same generator. The CUDA backend is required (NF4_CUDA=ON)
# when the CUDA Toolkit is found, so that its targets' settings (the CUDA dialect, which the
# Makefiles generator checks at configure time) are exercised wherever a CUDA compiler is.
#   tools/check_configure.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source tools/build-env.sh
work="$(mktemp -d "${TMPDIR:-/tmp}/nf4-configure.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "check_configure: FAILED: $*" >&2; exit 1; }
unset CMAKE_GENERATOR
cuda=OFF
command -v nvcc >/dev/null 2>&1 && cuda=ON
configure() {  # NAME SOURCE BUILD ARGS...
  local name=$1 src=$2 build=$3
  shift 3
  if ! cmake -S "$src" -B "$build" "$@" >"$build.log" 2>&1; then
    cat "$build.log" >&2
    fail "$name did not configure"
  fi
  grep -q 'CMAKE_GENERATOR:INTERNAL=Unix Makefiles' "$build/CMakeCache.txt" || fail "$name: not the Makefiles generator"
  grep -q "nf4 backends: cpu=ON cuda=$cuda" "$build.log" || fail "$name: $(grep 'nf4 backends' "$build.log")"
  echo "$name: configured ($(grep -o 'nf4 backends.*' "$build.log"))"
}

echo "== default generator, NF4_CUDA=$cuda"
configure "nf4" "$root" "$work/top" -DNF4_CUDA="$cuda"

mkdir -p "$work/embed"
cat >"$work/embed/CMakeLists.txt" <<EOC
cmake_minimum_required(VERSION 3.22)
project(embeds_nf4 LANGUAGES C CXX)
add_subdirectory("$root" nf4)
add_executable(app "$root/examples/dequantize.c")
target_link_libraries(app PRIVATE nf4::nf4)
EOC
configure "add_subdirectory(nf4)" "$work/embed" "$work/embed/build" -DNF4_CUDA="$cuda"
echo "check_configure: all passed"
