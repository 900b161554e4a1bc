#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's second command: install what is missing, then build and run every test:
#   1. Release build (CUDA compiled when the toolkit is present, Vulkan on lavapipe) + ctest, then
#      the installed package (tools/check_install.sh: consumers through find_package and pkg-config)
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build + ctest
#   3. ThreadSanitizer stress test, short libFuzzer runs (when their scripts exist)
#   4. the PyTorch package, CPU-only, built with pip in a fresh virtual environment with torch from
#      PyPI, and its tests (bindings/torch/ci_test.sh)
# Each stage configures its build folder with everything it tests switched on, whatever an earlier
# configure (tools/quickstart.sh, a developer) left in the cache, and fails when it finds no tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
jobs="$(nproc)"
export CTEST_OUTPUT_ON_FAILURE=1

all_on=(-DNF4_BUILD_TESTS=ON -DNF4_BUILD_TOOLS=ON -DNF4_BUILD_EXAMPLES=ON -DNF4_WERROR=ON -DNF4_FUZZ=OFF)

echo "== release build and tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${all_on[@]}" -DNF4_SANITIZE=OFF -DNF4_TSAN=OFF \
  -DNF4_SHARED=ON -DNF4_INSTALL=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -j"$jobs" --timeout 900 --no-tests=error

echo "== installed package"
tools/check_install.sh build

echo "== ASan + UBSan build and tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug "${all_on[@]}" -DNF4_SANITIZE=ON -DNF4_TSAN=OFF \
  -DNF4_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -j"$jobs" --timeout 1800 --no-tests=error

for extra in .ci/tsan.sh .ci/fuzz.sh; do
  if [ -x "$extra" ]; then echo "== $extra"; "$extra"; fi
done

echo "== PyTorch package (CPU-only)"
bash bindings/torch/ci_test.sh
echo "all test stages passed"
