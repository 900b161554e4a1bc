#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# On a GPU machine (Python with a CUDA torch, CMake, ninja or make, nvcc; no network needed):
#   1. installs the package from this checkout with pip (CUDA build), in a virtual environment that
#      sees the machine's torch (--system-site-packages),
#   2. runs bindings/torch/tests (pytest, CUDA included; bitsandbytes' own outputs where the peers
#      folder holds it),
#   3. runs bench_peers.py: the four timing modes and the CPU cost per call against bitsandbytes
#      and Unsloth's released kernels, then Unsloth's test_dequantize workload,
#   3b. (step train) runs bench_peers.py in the training regime: modes b, c, d and e (dequantize +
#      x @ W.t(), eager and compiled), then the workload in 5 interleaved repeats (NF4_TRAIN_ARGS),
#   3c. (step ncu) runs bench_peers.py --modes ncu under Nsight Compute (ncu from PATH or
#      /opt/nvidia/nsight-compute): per kernel, DRAM bytes read and written, L2 hit rates, time,
#      in each cold regime (NF4_NCU_ARGS),
#   4. (step gemv) runs bench_gemv_peers.py: the fused product (torch.ops.nf4.gemv, exact and fast
#      modes, 1 to 256 rows) against Unsloth's gemv_nf4 and its dispatch, bitsandbytes' gemv_4bit /
#      matmul_4bit, dequantize + matmul, dense bf16,
#   5. (step decode) runs lab/torch/check_decode.py on its small default Llama: greedy decode through
#      bitsandbytes' Linear4bit, nf4_torch.linear_4bit in each mode, dequantize + matmul and dense bf16,
#      each judged against a float64 reference, then timed in CUDA graphs with a static KV cache,
#   6. (step decode-real) the same at a real model's layer sizes (NF4_REAL_* below: by default hidden
#      4096, intermediate 14336, 4 layers, 32 heads, 8 KV heads, vocab 32000; random weights quantized
#      by bitsandbytes; about 26 GB of GPU memory at its peak, its two float64 references included),
# writing everything under $OUT: log.txt (all of it), build.txt, pytest.txt, pytest.xml,
# peers.txt / peers.json, workload.txt / workload.json, train.txt / train.json /
# train_workload.txt / train_workload.json, ncu.csv / ncu_seq.txt, gemv_peers.txt / gemv_peers.json,
# decode.txt / decode.json, decode_real.txt / decode_real.json. Exits non-zero if a step fails.
#
# Prepare on a machine with network, in the repository root (all three are ignored by git):
#   .whl/    wheels for the GPU machine's Python that it may lack (pip download --no-deps
#            --only-binary=:all: --python-version 3.12 --implementation cp --platform
#            manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl scikit-build-core
#            pathspec packaging pytest iniconfig pluggy pygments safetensors numpy)
#   .debs/   libfmt-dev, libfmt9 and nlohmann-json3-dev (apt-get download ...), unpacked here with
#            dpkg -x into a private prefix under the work folder, never into /
#   .peers/  the peers (lab/fetch_peers.sh .peers); never committed
# and bring them along with the checkout. The decode steps also need transformers 5.x (its
# StaticCache keeps each layer's length in a device tensor, which a CUDA graph replays), installed
# from .whl when missing, ~30 MB of wheels: pip download --only-binary=:all: --python-version 3.12
# --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform
# manylinux2014_x86_64 -d .whl "transformers>=5".
# bitsandbytes comes from the peers folder, which holds no package metadata; as some transformers
# releases find bitsandbytes only through it (5.x also takes the module's __version__), the step
# writes a bitsandbytes-<version>.dist-info with just its name and version into
# $NF4_WORK/peers-meta and puts that on PYTHONPATH.
#
# Variables (defaults):
#   OUT=gpu-out                   results folder
#   NF4_PYTHON=python3            the Python that has torch
#   NF4_WHEELS=.whl               wheels installed (offline) when a module is missing
#   NF4_DEBS=.debs                .deb files with fmt and nlohmann-json headers + CMake configs
#   NF4_DEPS_PREFIX=              a prefix that already holds fmt and nlohmann-json (then .debs is not used);
#                                 the system's are used when neither is given nor needed
#   NF4_PEERS=.peers              the folder made by lab/fetch_peers.sh (peers left out if absent)
#   NF4_CUDA_ARCHITECTURES=       CMake CUDA architectures; default: the GPU's own (e.g. 90a-real on Hopper)
#   NF4_WORK=build-torch-gpu      work folder (virtual environment, build tree)
#   NF4_JOBS=$(nproc)             parallel compile jobs
#   NF4_BENCH_ARGS=               extra arguments for bench_peers.py (e.g. --dtypes bf16)
#   NF4_TRAIN_ARGS=--dtypes bf16  extra arguments for both bench_peers.py runs of the train step
#                                 (e.g. --nf4-hints 5,0 for the cache-hint A/B rows)
#   NF4_NCU_ARGS="--dtypes bf16 --shapes 1024x4096,4096x14336 --samples 3"   the ncu step's bench_peers.py arguments
#   NF4_NCU_METRICS=              the ncu step's metrics (comma-separated) instead of its time, DRAM
#                                 bytes and L2 hit rates (e.g. the stall reasons of both kernels)
#   NF4_GEMV_ARGS=                extra arguments for bench_gemv_peers.py (e.g. --m 1 --shapes 4096x4096)
#   NF4_DECODE_ARGS=              extra arguments for lab/torch/check_decode.py in both decode steps
#                                 (e.g. --batches 1,4,8 --prefill 256)
#   NF4_REAL_HIDDEN=4096 NF4_REAL_INTERMEDIATE=14336 NF4_REAL_LAYERS=4 NF4_REAL_HEADS=32
#   NF4_REAL_KV_HEADS=8 NF4_REAL_VOCAB=32000   the model of the decode-real step
#   NF4_REAL_ARGS=                extra arguments for the decode-real step alone (after NF4_DECODE_ARGS;
#                                 e.g. --graph-breaks '' where the decode step already reported them)
#   NF4_STEPS="build test bench workload"   the steps to run, of build test hostile bench workload
#                                 train ncu gemv decode decode-real (hostile: tests/test_hostile.py
#                                 alone and under compute-sanitizer); the build stays in $NF4_WORK, so a time-limited session can
#                                 split them: NF4_STEPS="build test", then NF4_STEPS="bench workload"
#                                 (each appends to $OUT/log.txt)
#   CUDA_HOME                     the CUDA toolkit, when nvcc is not on PATH (else found from nvcc)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd) || exit 2
cd "$root" || exit 2
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${NF4_PYTHON:-python3}
WHEELS=${NF4_WHEELS:-.whl}
DEBS=${NF4_DEBS:-.debs}
PEERS=${NF4_PEERS:-.peers}
WORK=${NF4_WORK:-build-torch-gpu}
JOBS=${NF4_JOBS:-$(nproc)}
STEPS=" ${NF4_STEPS:-build test bench workload} "
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
step() { echo; echo "=== $* ($(date +%T))"; }
status=0
fail() { echo "FAILED: $*"; status=1; }
has() { [[ "$STEPS" == *" $1 "* ]]; }

step environment
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA DEVICE")' || { echo "no usable torch in $PY"; exit 2; }
if ! command -v nvcc >/dev/null; then
  for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    [[ -n "$d" && -x "$d/bin/nvcc" ]] && export PATH="$d/bin:$PATH" && break
  done
fi
command -v nvcc >/dev/null && nvcc --version | tail -1 || echo "nvcc not found: the build would be CPU-only (set CUDA_HOME)"
command -v cmake >/dev/null && cmake --version | head -1

# A virtual environment on top of the machine's Python: torch (and triton) come from there, what
# is installed here stays here. --system-site-packages sees the base interpreter's packages only;
# a .pth file adds those of $PY's own environment (torch may live in a virtual environment).
venv=$root/$WORK/venv
if [[ ! -x "$venv/bin/python" ]]; then
  "$PY" -m venv --system-site-packages "$venv" || { echo "cannot make a virtual environment with $PY"; exit 2; }
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/_nf4_machine_site.pth"
fi
vpy=$venv/bin/python
"$vpy" -c 'import torch' || { echo "torch does not import in $venv"; exit 2; }
need() {  # need MODULE PACKAGE: install PACKAGE from the wheel folder when MODULE does not import
  "$vpy" -c "import $1" 2>/dev/null && return 0
  [[ -d "$WHEELS" ]] || { echo "$1 is missing and there is no wheel folder $WHEELS"; return 1; }
  "$vpy" -m pip install -q --no-index --find-links "$WHEELS" "$2"
}

if has build; then
  step "build: pip install ./bindings/torch (CUDA)"
  need scikit_build_core "scikit-build-core>=0.10" || exit 1
  prefix_args=()
  prefix=${NF4_DEPS_PREFIX:-}
  if [[ -z "$prefix" && -d "$DEBS" ]] && compgen -G "$DEBS/*.deb" >/dev/null; then
    prefix=$root/$WORK/deps
    rm -rf "$prefix" && mkdir -p "$prefix"
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$prefix" || { echo "dpkg -x $f failed"; exit 1; }; done
    echo "fmt and nlohmann-json from $DEBS, unpacked into $prefix"
  fi
  if [[ -n "$prefix" ]]; then
    # Their CMake configs, wherever the prefix's layout put them (lib/<multiarch>/cmake, share/cmake).
    fmt_dir=$(dirname "$(find "$prefix" -name fmt-config.cmake -print -quit)")
    json_dir=$(dirname "$(find "$prefix" -name nlohmann_jsonConfig.cmake -print -quit)")
    export CMAKE_PREFIX_PATH="$prefix/usr:$prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    [[ "$fmt_dir" != . ]] && prefix_args+=(-C "cmake.define.fmt_DIR=$fmt_dir")
    [[ "$json_dir" != . ]] && prefix_args+=(-C "cmake.define.nlohmann_json_DIR=$json_dir")
  fi
  arch=${NF4_CUDA_ARCHITECTURES:-$("$vpy" -c 'import torch; c = torch.cuda.get_device_capability(); print(f"{c[0]}{c[1]}" + ("a" if c == (9, 0) else "") + "-real")' 2>/dev/null)}
  [[ -n "$arch" ]] && prefix_args+=(-C "cmake.define.NF4_CUDA_ARCHITECTURES=$arch")
  echo "CUDA architectures: ${arch:-the default list of nf4}"
  if CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$vpy" -m pip install -v --no-build-isolation --no-deps --force-reinstall \
       -C cmake.define.NF4_TORCH_CUDA=ON -C build-dir="$root/$WORK/build" "${prefix_args[@]}" ./bindings/torch \
       >"$OUT/build.txt" 2>&1; then
    grep -E "nf4_torch:|nf4 backends|Created wheel" "$OUT/build.txt"
  else
    tail -40 "$OUT/build.txt"
    echo "BUILD FAILED (all of it in $OUT/build.txt)"
    exit 1
  fi
fi
(cd "$OUT" && "$vpy" -c 'import nf4_torch, torch
print("nf4_torch", nf4_torch.__version__, "nf4", nf4_torch.nf4_version(), "built for torch", nf4_torch._build_info.torch_version,
      "with CUDA", nf4_torch._build_info.cuda or "(none)")
assert nf4_torch._C.have_cuda(), "the extension was built without CUDA"') || exit 1

peer_path=""
if [[ -d "$PEERS" ]]; then
  peer_path=$(cd "$PEERS" && pwd)
  need numpy numpy || echo "numpy missing: bitsandbytes will not load"
else
  echo "no peers folder ($PEERS): bitsandbytes and Unsloth rows and comparisons are left out"
fi

if has test; then
  step "pytest bindings/torch/tests"
  { need pytest pytest && need safetensors safetensors; } || fail "pytest or safetensors missing"
  # From $OUT: bindings/torch/nf4_torch is the source tree; the installed package is tested.
  (cd "$OUT" && PYTHONPATH="$peer_path${PYTHONPATH:+:$PYTHONPATH}" timeout 900 "$vpy" -m pytest -q -rs \
      -p no:cacheprovider --junitxml="$OUT/pytest.xml" "$root/bindings/torch/tests" >"$OUT/pytest.txt" 2>&1)
  rc=$?
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -40
  tail -15 "$OUT/pytest.txt"
  [[ $rc -eq 0 ]] || fail "pytest exit code $rc"
fi

if has hostile; then
  # The operator attacked (tests/test_hostile.py, docs/RELIABILITY.md): the file on its own, then its
  # CUDA cases under compute-sanitizer's memcheck, which must report 0 errors. PyTorch's caching
  # allocator is off there, so that every tensor is an allocation of its own and a read past one
  # is seen (inside a cached block it would not be).
  step "the operator attacked: test_hostile.py, then its CUDA cases under compute-sanitizer"
  need pytest pytest || fail "pytest missing"
  (cd "$OUT" && timeout 600 "$vpy" -m pytest -q -rs -p no:cacheprovider "$root/bindings/torch/tests/test_hostile.py" \
      >"$OUT/hostile.txt" 2>&1)
  rc=$?
  grep -E "^(FAILED|ERROR)" "$OUT/hostile.txt" | head -40
  tail -3 "$OUT/hostile.txt"
  [[ $rc -eq 0 ]] || fail "test_hostile.py exit code $rc"
  san=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
  (cd "$OUT" && PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 900 "$san" --tool memcheck --error-exitcode 3 --print-limit 50 \
      "$vpy" -m pytest -q -rs -p no:cacheprovider -k cuda "$root/bindings/torch/tests/test_hostile.py" \
      >"$OUT/hostile_memcheck.txt" 2>&1)
  rc=$?
  grep -E "^(FAILED|ERROR)|ERROR SUMMARY|========= (Invalid|Program hit)" "$OUT/hostile_memcheck.txt" | head -40
  tail -3 "$OUT/hostile_memcheck.txt"
  [[ $rc -eq 0 ]] || fail "test_hostile.py under compute-sanitizer: exit code $rc"
fi

peers_arg=()
[[ -n "$peer_path" ]] && peers_arg=(--peers "$peer_path")
# shellcheck disable=SC2206  # word splitting wanted: a list of arguments
extra=(${NF4_BENCH_ARGS:-})
if has bench; then
  step "bench_peers.py: modes a, b, c, d and the CPU cost per call"
  (cd "$OUT" && timeout 1200 "$vpy" "$root/lab/torch/bench_peers.py" "${peers_arg[@]}" \
      --modes check,a,b,c,d,cpu --json "$OUT/peers.json" "${extra[@]}" 2>&1 | tee "$OUT/peers.txt")
  rc=$?  # with pipefail, the status of bench_peers.py rather than of tee
  [[ $rc -eq 0 ]] || fail "bench_peers.py (modes) exit code $rc"
fi
if has workload; then
  step "bench_peers.py: Unsloth's test_dequantize workload"
  (cd "$OUT" && timeout 900 "$vpy" "$root/lab/torch/bench_peers.py" "${peers_arg[@]}" \
      --modes workload --json "$OUT/workload.json" "${extra[@]}" 2>&1 | tee "$OUT/workload.txt")
  rc=$?  # with pipefail, the status of bench_peers.py rather than of tee
  [[ $rc -eq 0 ]] || fail "bench_peers.py (workload) exit code $rc"
fi

if has train; then
  # shellcheck disable=SC2206  # word splitting wanted: a list of arguments
  train_extra=(${NF4_TRAIN_ARGS:---dtypes bf16})
  step "bench_peers.py: the training regime (modes b, c, d, e)"
  (cd "$OUT" && timeout 1200 "$vpy" "$root/lab/torch/bench_peers.py" "${peers_arg[@]}" \
      --modes check,b,c,d,e --json "$OUT/train.json" "${train_extra[@]}" 2>&1 | tee "$OUT/train.txt")
  rc=$?  # with pipefail, the status of bench_peers.py rather than of tee
  [[ $rc -eq 0 ]] || fail "bench_peers.py (train) exit code $rc"
  step "bench_peers.py: Unsloth's test_dequantize workload, 5 interleaved repeats"
  (cd "$OUT" && timeout 900 "$vpy" "$root/lab/torch/bench_peers.py" "${peers_arg[@]}" \
      --modes workload --repeats 5 --json "$OUT/train_workload.json" "${train_extra[@]}" 2>&1 | tee "$OUT/train_workload.txt")
  rc=$?
  [[ $rc -eq 0 ]] || fail "bench_peers.py (train workload) exit code $rc"
fi
if has ncu; then
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  if [[ -z "$ncu_bin" ]]; then
    fail "ncu not found"
  else
    step "ncu: bench_peers.py --modes ncu ($ncu_bin)"
    # shellcheck disable=SC2206  # word splitting wanted: a list of arguments
    ncu_extra=(${NF4_NCU_ARGS:---dtypes bf16 --shapes 1024x4096,4096x14336 --samples 3})
    # --cache-control none: each kernel starts with L2 as the script left it (dirty or clean).
    # The spin kernel (torch.cuda._sleep) before each call marks where the next call's kernels
    # start: the n-th one is the n-th "ncu-seq" line of ncu_seq.txt.
    (cd "$OUT" && timeout 900 "$ncu_bin" --cache-control none --clock-control none --csv --log-file "$OUT/ncu.csv" \
        --kernel-name-base demangled --kernel-name "regex:dequant|Dequant|gemm|nvjet|cutlass|xmma|gemv|spin_kernel" \
        --metrics "${NF4_NCU_METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,lts__t_sector_op_write_hit_rate.pct}" \
        "$vpy" "$root/lab/torch/bench_peers.py" "${peers_arg[@]}" --modes ncu "${ncu_extra[@]}" >"$OUT/ncu_seq.txt" 2>&1)
    rc=$?
    tail -5 "$OUT/ncu_seq.txt"
    [[ $rc -eq 0 ]] || fail "ncu exit code $rc"
  fi
fi

if has gemv; then
  step "bench_gemv_peers.py: the fused decode product against the peers"
  # shellcheck disable=SC2206  # word splitting wanted: a list of arguments
  gemv_extra=(${NF4_GEMV_ARGS:-})
  (cd "$OUT" && timeout 1200 "$vpy" "$root/lab/torch/bench_gemv_peers.py" "${peers_arg[@]}" \
      --json "$OUT/gemv_peers.json" "${gemv_extra[@]}" 2>&1 | tee "$OUT/gemv_peers.txt")
  rc=$?  # with pipefail, the status of bench_gemv_peers.py rather than of tee
  [[ $rc -eq 0 ]] || fail "bench_gemv_peers.py exit code $rc"
fi
decode_ready=""
decode_setup() {  # transformers, and bitsandbytes' package metadata where the peers folder lacks it
  [[ -n "$decode_ready" ]] && return "$decode_ready"
  decode_path=$peer_path
  decode_ready=0
  if ! need transformers "transformers>=5"; then
    fail "transformers missing (wheels in $WHEELS: see the top of this script)"
    decode_ready=1
    return 1
  fi
  if ! "$vpy" -c 'import importlib.metadata as m; m.version("bitsandbytes")' 2>/dev/null \
      && [[ -f "$peer_path/bitsandbytes/__init__.py" ]]; then
    bnb_version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$peer_path/bitsandbytes/__init__.py")
    meta=$root/$WORK/peers-meta
    rm -rf "$meta" && mkdir -p "$meta/bitsandbytes-${bnb_version:-0}.dist-info"
    printf 'Metadata-Version: 2.1\nName: bitsandbytes\nVersion: %s\n' "${bnb_version:-0}" \
      >"$meta/bitsandbytes-${bnb_version:-0}.dist-info/METADATA"
    decode_path=$peer_path:$meta
    echo "bitsandbytes $bnb_version from $peer_path (metadata in $meta)"
  fi
}
run_decode() {  # run_decode NAME ARGS...: lab/torch/check_decode.py, output in $OUT/NAME.txt and NAME.json
  local name=$1 rc
  shift
  decode_setup || return
  # shellcheck disable=SC2206  # word splitting wanted: a list of arguments
  local decode_extra=(${NF4_DECODE_ARGS:-})
  (cd "$OUT" && PYTHONPATH="$decode_path${PYTHONPATH:+:$PYTHONPATH}" timeout 900 "$vpy" "$root/lab/torch/check_decode.py" \
      --json "$OUT/$name.json" "${decode_extra[@]}" "$@" 2>&1 | tee "$OUT/$name.txt")
  rc=$?  # with pipefail, the status of check_decode.py rather than of tee
  [[ $rc -eq 0 ]] || fail "check_decode.py ($name) exit code $rc"
}
if has decode; then
  step "lab/torch/check_decode.py: the small Llama, every product path against a float64 reference, CUDA-graph decode"
  run_decode decode
fi
if has decode-real; then
  real=(--hidden "${NF4_REAL_HIDDEN:-4096}" --intermediate "${NF4_REAL_INTERMEDIATE:-14336}"
        --layers "${NF4_REAL_LAYERS:-4}" --heads "${NF4_REAL_HEADS:-32}" --kv-heads "${NF4_REAL_KV_HEADS:-8}"
        --vocab "${NF4_REAL_VOCAB:-32000}")
  # shellcheck disable=SC2206  # word splitting wanted: a list of arguments
  real+=(${NF4_REAL_ARGS:-})
  step "lab/torch/check_decode.py at real sizes: ${real[*]}"
  run_decode decode_real "${real[@]}"
fi

step "done"
echo "results in $OUT; status $status"
exit $status
