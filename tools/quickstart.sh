#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's first command: install what is missing, build, convert the bundled bnb-4bit
# sample checkpoint to dense bf16 safetensors, and verify the result bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
source tools/build-env.sh  # nvcc on PATH when installed, ccache
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)"
out="${1:-build/golden-dense.safetensors}"
rm -f "$out"
build/nf4 convert tests/data/golden.safetensors "$out" --dtype bf16
build/nf4 verify tests/data/golden.safetensors
build/nf4 verify "$out" --reference tests/data/golden.safetensors
echo "quickstart: wrote $out and verified it bit for bit"
