#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On the GPU machine (torch + nvcc, no network, no Debian dev packages): builds the PyTorch extension,
# runs its tests and the Unsloth workload, and writes everything to $OUT (log.txt, build.txt,
# pytest.txt, pytest.xml, bench.json).
#
# Prepare on the development machine, then carry bindings/torch/.prebuilt:
#   bindings/torch/build_libnf4.sh                 # .prebuilt/libnf4.a (CUDA backend, header-only fmt)
#   optional: .prebuilt/bnb/ = the bitsandbytes package unpacked from its wheel (for the bnb rows
#   and the bnb comparison tests), .prebuilt/nf4_torch_ext.so = an extension built here against the
#   same torch (used only if building it on the GPU machine fails).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
OUT=${OUT:-/tmp/nf4_torch_out}
mkdir -p "$OUT"
log=$OUT/log.txt
exec > >(tee -a "$log") 2>&1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
[[ -x "$PY" ]] || PY=python3
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
  echo "missing bindings/torch/.prebuilt/libnf4.a: run bindings/torch/build_libnf4.sh and carry bindings/torch/.prebuilt"
  exit 2
fi
cat .prebuilt/BUILD_INFO | head -3

step build the extension
rm -f nf4_torch/_C*.so
if MAX_JOBS=16 "$PY" setup.py build_ext --inplace >"$OUT/build.txt" 2>&1; then
  ls -la nf4_torch/_C*.so
else
  tail -40 "$OUT/build.txt"
  echo "BUILD FAILED on this machine"
  status=1
  if [[ -f .prebuilt/nf4_torch_ext.so ]]; then
    echo "falling back to the extension built on the development machine (.prebuilt/nf4_torch_ext.so)"
    export NF4_TORCH_LIBRARY=$here/.prebuilt/nf4_torch_ext.so
  else
    exit 1
  fi
fi
"$PY" -c 'import nf4_torch, torch; print("nf4", nf4_torch.nf4_version(), "loaded:", torch.ops.nf4.dequantize.default._schema)' || exit 1

if [[ -d .prebuilt/bnb ]]; then
  export PYTHONPATH=$here/.prebuilt/bnb${PYTHONPATH:+:$PYTHONPATH}
  "$PY" -c 'import bitsandbytes as b; print("bitsandbytes", b.__version__)' 2>&1 | tail -2
fi

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
