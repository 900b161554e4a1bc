#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's second command: install what is missing, then build and run every test, in stages:
#   deps       tools/install-deps.sh
#   configure  CMake's default generator, top level and add_subdirectory, configure only
#              (tools/check_configure.sh)
#   release    Release build (CUDA compiled when the toolkit is present, Vulkan on lavapipe) + ctest
#   install    the installed package (tools/check_install.sh: consumers through find_package and
#              pkg-config)
#   asan       AddressSanitizer + UndefinedBehaviorSanitizer build + ctest
#   tsan, fuzz ThreadSanitizer stress test, short libFuzzer runs (.ci/tsan.sh, .ci/fuzz.sh)
#   torch      the PyTorch package, CPU-only, built with pip in a fresh virtual environment against
#              the newest torch on PyPI, and its tests (bindings/torch/ci_test.sh)
#   torch-oldest  the same against the oldest torch the package supports, when NF4_TEST_TORCH
#              names it: NF4_TEST_TORCH="newest oldest" (default "newest")
# Each stage prints "test.sh: stage NAME: N s" when it ends, and the list of them all at the end.
# Each stage configures its build folder with everything it tests switched on, whatever an earlier
# configure (tools/quickstart.sh, a developer) left in the cache, and fails when it finds no tests.
# Compilers run through ccache when it is installed (tools/build-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
start_all=$(date +%s)
times=()
stage_name=""
stage_start=0
stage_end() {
  [ -n "$stage_name" ] || return 0
  local t=$(($(date +%s) - stage_start))
  echo "test.sh: stage $stage_name: $t s"
  times+=("$stage_name $t s")
  stage_name=""
}
stage() {  # NAME DESCRIPTION: ends the stage before, starts this one
  stage_end
  stage_name=$1
  stage_start=$(date +%s)
  echo "== $2 ($(date +%T))"
}

stage deps "system packages (tools/install-deps.sh)"
tools/install-deps.sh
source tools/build-env.sh
jobs="$(nproc)"
export CTEST_OUTPUT_ON_FAILURE=1

all_on=(-DNF4_BUILD_TESTS=ON -DNF4_BUILD_TOOLS=ON -DNF4_BUILD_EXAMPLES=ON -DNF4_WERROR=ON -DNF4_FUZZ=OFF)

stage configure "default CMake generator, top level and add_subdirectory (configure only)"
tools/check_configure.sh

stage release "release build and tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${all_on[@]}" -DNF4_SANITIZE=OFF -DNF4_TSAN=OFF \
  -DNF4_SHARED=ON -DNF4_INSTALL=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -j"$jobs" --timeout 900 --no-tests=error

stage install "installed package"
tools/check_install.sh build

stage asan "ASan + UBSan build and tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug "${all_on[@]}" -DNF4_SANITIZE=ON -DNF4_TSAN=OFF \
  -DNF4_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -j"$jobs" --timeout 1800 --no-tests=error

for extra in tsan fuzz; do
  if [ -x ".ci/$extra.sh" ]; then
    stage "$extra" ".ci/$extra.sh"
    ".ci/$extra.sh"
  fi
done

for torch in ${NF4_TEST_TORCH:-newest}; do
  case "$torch" in
    newest) stage torch "PyTorch package (CPU-only), the newest torch on PyPI" ;;
    oldest) stage torch-oldest "PyTorch package (CPU-only), the oldest torch it supports" ;;
    *) echo "NF4_TEST_TORCH: 'newest' and/or 'oldest' (got '$torch')" >&2; exit 2 ;;
  esac
  NF4_CI_TORCH=$torch bash bindings/torch/ci_test.sh
done
stage_end

echo "test.sh: stage times: ${times[*]/%/,} total $(($(date +%s) - start_all)) s"
echo "all test stages passed"
