#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bindings/torch/gpu_run.sh: the PyTorch operator on a GPU machine. Builds the extension against the
# machine's torch, runs its tests (bindings/torch/tests) and the Unsloth workload (bench_unsloth.py),
# and writes everything to $OUT: log.txt (ends with "status 0" when all passed), build.txt,
# pytest.txt, pytest.xml, bench.json. tools/gpu_check.sh runs it as its [torch] section.
#
# The GPU machine needs: an NVIDIA GPU and driver, python3 with torch (CUDA build) and pytest, a
# CUDA toolkit of torch's CUDA major version (nvcc, for the extension), a C++ compiler; no network.
# It does not need CMake or nf4's build dependencies: the nf4 library comes prebuilt.
#
# Before, on a build machine with nf4's build dependencies (CMake, fmt, nlohmann-json, nvcc):
#   bindings/torch/build_libnf4.sh       # -> bindings/torch/.prebuilt/libnf4.a (CUDA backend)
# and copy bindings/torch/.prebuilt along with the repository. Optional there:
#   .prebuilt/nf4_torch_ext.so  an extension built on the build machine against the same torch,
#                               used only if building it on the GPU machine fails.
#
# Configuration (environment variables, with their defaults):
#   OUT=$PWD/build-torch-out     where the results go (relative to the repository root)
#   NF4_PYTHON=python3           the Python that has torch
#   CUDA_HOME                    the CUDA toolkit for the extension's build (default: the one whose
#                                nvcc is on PATH, else /usr/local/cuda)
#   NF4_PEERS=<repo>/.peers      peers for the comparison rows and tests: a folder holding the
#                                bitsandbytes Python package (bitsandbytes/ with its CUDA library),
#                                directly or one level down; .prebuilt/bnb is also searched.
#                                Without it the bitsandbytes rows and tests are skipped.
#   MAX_JOBS=$(nproc)            parallel compilation of the extension
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-$root/build-torch-out}
[[ "$OUT" == /* ]] || OUT=$root/$OUT
NF4_PEERS=${NF4_PEERS:-$root/.peers}
cd "$here" || exit 1
mkdir -p "$OUT"
log=$OUT/log.txt
exec > >(tee -a "$log") 2>&1
export PYTHONUNBUFFERED=1
PY=${NF4_PYTHON:-python3}
step() { echo; echo "=== $* ($(date +%T))"; }
status=0

step environment
nvidia-smi -L
"$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
if [[ -z "${CUDA_HOME:-}" ]]; then
  nvcc_path=$(command -v nvcc || true)
  [[ -n "$nvcc_path" ]] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")
  [[ -z "${CUDA_HOME:-}" && -d /usr/local/cuda ]] && export CUDA_HOME=/usr/local/cuda
fi
echo "CUDA_HOME=${CUDA_HOME:-unset}"
if [[ ! -f .prebuilt/libnf4.a ]]; then
  echo "missing bindings/torch/.prebuilt/libnf4.a: run bindings/torch/build_libnf4.sh on a build machine and copy bindings/torch/.prebuilt here"
  exit 2
fi
cat .prebuilt/BUILD_INFO | head -3

step build the extension
rm -f nf4_torch/_C*.so
if MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" setup.py build_ext --inplace >"$OUT/build.txt" 2>&1; then
  ls -la nf4_torch/_C*.so
else
  tail -40 "$OUT/build.txt"
  echo "BUILD FAILED on this machine"
  status=1
  if [[ -f .prebuilt/nf4_torch_ext.so ]]; then
    echo "falling back to the extension built on the build machine (.prebuilt/nf4_torch_ext.so)"
    export NF4_TORCH_LIBRARY=$here/.prebuilt/nf4_torch_ext.so
  else
    exit 1
  fi
fi
"$PY" -c 'import nf4_torch, torch; print("nf4", nf4_torch.nf4_version(), "loaded:", torch.ops.nf4.dequantize.default._schema)' || exit 1

for d in "$here/.prebuilt/bnb" "$NF4_PEERS" "$NF4_PEERS"/*; do
  if [[ -f "$d/bitsandbytes/__init__.py" ]]; then
    export PYTHONPATH=$d${PYTHONPATH:+:$PYTHONPATH}
    "$PY" -c 'import bitsandbytes as b; print("bitsandbytes", b.__version__, "from", b.__file__)' 2>&1 | tail -2
    break
  fi
done

step pytest
timeout 420 "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$OUT/pytest.xml" tests/ >"$OUT/pytest.txt" 2>&1
rc=$?
grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -40
tail -25 "$OUT/pytest.txt"
echo "pytest exit code: $rc"
[[ $rc -eq 0 ]] || status=1

step Unsloth workload
timeout 300 "$PY" bench_unsloth.py --json "$OUT/bench.json"
rc=$?
echo "bench exit code: $rc"
[[ $rc -eq 0 ]] || status=1

step done
echo "status $status"
exit $status
