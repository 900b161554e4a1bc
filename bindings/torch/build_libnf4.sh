#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the static nf4 library that the PyTorch extension links, on a build machine with nf4's build
# dependencies (CMake, fmt, nlohmann-json; nvcc for the CUDA backend), and puts it in
# bindings/torch/.prebuilt/ (ignored by git), to be copied to a GPU machine that lacks them
# (bindings/torch/gpu_run.sh).
#
# fmt: core formats its error messages with fmt. A GPU machine may have no libfmt.so, so the library
# is compiled with FMT_HEADER_ONLY=1: every fmt function is inline and emitted into libnf4.a, and
# the extension needs no fmt at all (checked below: no undefined fmt symbol may remain).
# nlohmann-json is header-only. CUDA code calls the CUDA runtime, which the extension takes from
# torch's libcudart.so (same major version, 13).
#
# The library is built from the committed tree (git archive of HEAD, or of $NF4_REV), not from the
# working tree, so that other engineers' edits in progress cannot leak into it; NF4_SOURCE=worktree
# builds the working tree instead.
#
#   bindings/torch/build_libnf4.sh [ON|OFF]      # CUDA backend on (default) or off (CPU-only tests)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cuda=${1:-ON}
build=${NF4_TORCH_BUILD_DIR:-$root/build-torch-$cuda}
jobs=${NF4_JOBS:-2}
rev=${NF4_REV:-HEAD}

if [[ "${NF4_SOURCE:-commit}" == worktree ]]; then
  src=$root
  described="worktree of $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- core backends include || echo '+dirty')"
else
  src=$build/src
  rm -rf "$src" && mkdir -p "$src"
  git -C "$root" archive "$rev" | tar -x -C "$src"
  described="commit $(git -C "$root" rev-parse --short "$rev")"
fi

cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DNF4_CUDA="$cuda" -DNF4_VULKAN=OFF -DNF4_BUILD_TESTS=OFF -DNF4_BUILD_TOOLS=OFF \
  -DCMAKE_CXX_FLAGS=-DFMT_HEADER_ONLY=1 -DCMAKE_CUDA_FLAGS=-DFMT_HEADER_ONLY=1 >/dev/null
ninja -C "$build" -j"$jobs" nf4lib

lib="$build/libnf4.a"
# Undefined fmt symbols that no member of the archive defines would need libfmt.so at load time.
undefined=$(comm -23 <(nm -u "$lib" 2>/dev/null | awk '{print $NF}' | grep '3fmt' | sort -u) \
                     <(nm --defined-only "$lib" 2>/dev/null | awk '{print $NF}' | sort -u) || true)
if [[ -n "$undefined" ]]; then
  echo "libnf4.a still needs fmt symbols (FMT_HEADER_ONLY did not reach every source):" >&2
  echo "$undefined" | c++filt | head -20 >&2
  exit 1
fi

mkdir -p "$here/.prebuilt"
cp "$lib" "$here/.prebuilt/libnf4.a"
{
  echo "source: $described"
  echo "cuda: $cuda"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "undefined external symbols (besides libc/libstdc++):"
  nm -u "$lib" | awk '{print $NF}' | grep -E '^(cuda|cu[A-Z]|__cuda)' | grep -v ':$' | sort -u | sed 's/^/  /' || true
} >"$here/.prebuilt/BUILD_INFO"
cat "$here/.prebuilt/BUILD_INFO"
