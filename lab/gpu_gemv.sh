#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# lab/gpu_gemv.sh: build, test, sanitize and time the fused matrix-vector product (docs/GEMV.md)
# on a GPU machine.
#
#   lab/gpu_gemv.sh all       # a machine with the build dependencies and a GPU: build + run
#   lab/gpu_gemv.sh prepare   # a build machine (nf4's build dependencies, tools/install-deps.sh,
#                               # and nvcc; no GPU needed): builds build-gpu-gemv (Release, fat
#                               # binary, CUDA ON) and packs what runs into build-gpu-gemv-bundle/
#   lab/gpu_gemv.sh run       # the GPU machine, with build-gpu-gemv-bundle/ brought along
#
# The GPU machine needs an NVIDIA GPU with its driver, the CUDA runtime and compute-sanitizer
# (under $CUDA_HOME or on PATH), bash, coreutils, tar, xz, and for bench-vulkan a Vulkan loader
# and driver (or the loader's .deb files: lab/gpu_check.sh's NF4_VULKAN_LOADER_DEBS, with
# VK_DRIVER_FILES naming the driver's ICD); no compiler or network. The bundle carries the shared libraries the binaries link
# beyond glibc and the C++ runtime.
#
# `run` prints a table (also $OUT/gemv-summary.txt, logs in $OUT/gemv-logs.tgz, bench JSON in
# $OUT/bench_gemv_*.json):
#   - ctest: every gemv case (cpu oracle, cuda device pointers, every backend vs the oracle,
#     vulkan with the validation layer where a Vulkan driver is present) and the machine-code
#     check (tools/check_sass.sh, where the toolkit has cuobjdump);
#   - the > 2^31-weight case (NF4_CUDA_LARGE=1);
#   - compute-sanitizer memcheck and racecheck on the cuda gemv cases;
#   - nf4 verify (the product on every backend against the oracle);
#   - nf4 bench, products only: 4096x4096, 14336x4096, 4096x14336, 28672x8192, 8192x28672 (W as
#     N x K), m = 1, 4, 8, bf16, in CUDA-graph timing and in batch timing, cuda then vulkan.
#   - bench-fast: the fast contract (nf4.h NF4_GEMV_FAST, tensor cores) in CUDA-graph timing at
#     m = GEMV_FAST_M (1, 2, 4, 8, 16, 32, 64, 128, 256), against the same floor;
#   - vulkan-example: the engine example (examples/vulkan_engine.cpp: nf4 recording into the
#     example's own command buffers) with the fast contract asked for, the validation layer on
#     where installed (any message fails it);
#   - vulkan-fast, bench-vulkan-fast: the fast contract's tests on every backend (Vulkan's
#     cooperative matrices, asked for with NF4_VULKAN_COOP=1, where the driver lists them; the
#     validation layer that knows them from NF4_VULKAN_LAYER_DEBS, lab/gpu_check.sh, or
#     NF4_TEST_VALIDATION=0 without one), and its Vulkan table at m = GEMV_FAST_M (batch timing);
#   - dense: dense bf16 torch.matmul (cuBLAS) at the same shapes and m, CUDA-graph timing
#     (lab/torch/bench_dense.py), the reference the fast product is held to;
#   - bench-ab: the exact contract's CUDA-graph table for each kernel shape in GEMV_AB
#     (space-separated NF4_GEMV_CONFIG values, backends/cuda/gemv_backend.h: "legacy" or
#     threads,rows_m1,rows_m2,rows_m4,rows_m8,xs_m1,xs_m2,xs_m4,xs_m8; "auto" for the default
#     choice), in ROUNDS (2) interleaved rounds, one line per shape and m; with AB_BASE or
#     AB_PATCHES (below), through each of their trees too, rows marked as in bench-mma-ab;
#   - bench-mma-ab: the fast contract's CUDA-graph table for each tensor-core kernel in GEMV_MMA_AB
#     (space-separated NF4_GEMV_MMA values, backends/cuda/gemv_backend.cpp: kernel[,schedule];
#     "auto" for the default choice), in ROUNDS (2) interleaved rounds, one line per shape and m;
#     with AB_BASE (`all` only), each kernel also through the nf4 of another source tree built
#     beside this one, rows marked "@base": the change against the tree before it, same machine,
#     same call. Make it on the build machine and bring it along (ignored by git):
#       rm -rf .ab-base && mkdir .ab-base && git archive <rev> | tar -x -C .ab-base
#     With AB_PATCHES (`all` only: space-separated patch files, e.g. "lab/x/a.patch lab/y/b.patch"),
#     each patch is applied to a copy of this tree (.ab-<name>, name: the file's name without
#     .patch), built beside it and benched in the same rounds, rows marked "@<name>": several
#     candidates, each alone, against one tree in one call; phase ctest-variants (name it in
#     PHASES) runs each patched tree's CUDA product tests.
#   - ncu-fast (where NCU_FAST is set, e.g. "8192x28672:64 14336x4096:32"): Nsight Compute (ncu on
#     PATH or under /opt/nvidia/nsight-compute) on the fast contract's product kernel at each
#     shape:m, one launch after warm-up, the full section set with source counters: $OUT/ncu-fast-<shape>-<m>.txt
#     (the details page: throughput, warp states, stall reasons), .csv (the SASS lines with their
#     stall samples, where this ncu prints them) and .ncu-rep (for the Nsight Compute GUI).
#     NCU_KERNEL: another kernel-name regex (e.g. gemv_mma_split_reduce_kernel); NCU_METRICS
#     (comma-separated, e.g. gpu__time_duration.sum,dram__bytes_read.sum): only those, for
#     NCU_COUNT (3) launches of every kernel NCU_KERNEL matches (default: all of a product's), with
#     the caches and clocks left as they are, into $OUT/ncu-fast-<shape>-<m>.txt; NCU_REPLAY
#     (kernel): application runs the bench again for each pass instead of saving and restoring
#     memory around the kernel (which can evict what the kernel before left in L2). With
#     NCU_METRICS, AB_BASE's and AB_PATCHES' builds are profiled the same way, into
#     ncu-fast-<shape>-<m>@<label>.txt.
# Environment (defaults): BUILD (build-gpu-gemv), OUT ($ROOT/gpu-gemv-out), JOBS ($(nproc)),
# CUDA_HOME (/usr/local/cuda), TMPDIR (/tmp: the phase logs go to $TMPDIR/nf4-gemv-logs),
# NF4_GPU_VULKAN (AUTO), NF4_GPU_CMAKE_ARGS (extra configure arguments), AB_BASE, GEMV_SHAPES (the five
# above), GEMV_M (1,4,8), GEMV_FAST_M (1,2,4,...,256), ITERS (100), GEMV_AB, GEMV_MMA_AB, ROUNDS,
# NCU_FAST, PHASES ("ctest large memcheck racecheck verify bench-graph bench-batch bench-fast
# bench-vulkan vulkan-fast vulkan-example bench-vulkan-fast dense bench-ab bench-mma-ab ncu-fast":
# a subset to run).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GEMV_OUT="${OUT:-$ROOT/gpu-gemv-out}"
# The phase runner and the test, sanitizer and ctest helpers are lab/gpu_check.sh's; no deadline
# on the whole run unless one is asked for.
NF4_GPU_LIBRARY=1 source "$ROOT/lab/gpu_check.sh"
NF4_GPU_DEADLINE="${NF4_GPU_DEADLINE:-1000000}"
cd "$ROOT" || exit 1
BUILD="${BUILD:-build-gpu-gemv}"
BUNDLE="$BUILD-bundle"
OUT="$GEMV_OUT"
LOGDIR="${TMPDIR:-/tmp}/nf4-gemv-logs"
GEMV_SHAPES="${GEMV_SHAPES:-4096x4096,14336x4096,4096x14336,28672x8192,8192x28672}"
GEMV_M="${GEMV_M:-1,4,8}"
GEMV_FAST_M="${GEMV_FAST_M:-1,2,4,8,16,32,64,128,256}"
ITERS="${ITERS:-100}"
export OUT NF4_GPU_DEADLINE

build() {
  export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
  # NF4_GPU_CMAKE_ARGS: extra configure arguments, e.g. -DNF4_CUDA_ARCHITECTURES=90a-real for a
  # build of the one architecture the GPU machine has.
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_CUDA=ON -DNF4_VULKAN="${NF4_GPU_VULKAN:-AUTO}" ${NF4_GPU_CMAKE_ARGS:-} || return 1
  cmake --build "$BUILD" -j"$JOBS" --target nf4 nf4lib nf4_tests nf4_cli_tests fuzz_gemv_replay || return 1
  # The engine example where the build has Vulkan (phase vulkan-example).
  cmake --build "$BUILD" -j"$JOBS" --target nf4_vulkan_engine_example 2>/dev/null || true
}

# AB_BASE's nf4, configured as this tree's build (bench-mma-ab's "@base" rows).
build_base() {
  [[ -n "${AB_BASE:-}" ]] || return 0
  [[ -f "$AB_BASE/CMakeLists.txt" ]] || { echo "AB_BASE=$AB_BASE: no source tree there" >&2; return 1; }
  # shellcheck disable=SC2086
  (cd "$AB_BASE" && cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_CUDA=ON -DNF4_VULKAN=OFF ${NF4_GPU_CMAKE_ARGS:-} &&
    cmake --build "$BUILD" -j"$JOBS" --target nf4 ${AB_TARGETS:-}) || return 1
}

# AB_PATCHES' trees: this tree's files (not its builds, peers or other A/B trees) with one patch
# applied each, built as AB_BASE's is with the test binary too (bench-mma-ab's "@<name>" rows;
# phase ctest-variants runs each one's CUDA product cases).
ab_variants() {
  local p
  for p in ${AB_PATCHES:-}; do basename "$p" .patch; done
}
# The nf4 binaries an A/B runs, into the caller's arrays `trees` and `labels` (bash's dynamic
# scope): $1 (this tree's), AB_BASE's ("@base"), each AB_PATCHES tree's ("@<name>").
ab_trees() {
  local name
  trees=("$1") labels=("")
  [[ -n "${AB_BASE:-}" ]] && trees+=("$AB_BASE/$BUILD/nf4") labels+=("@base")
  for name in $(ab_variants); do trees+=(".ab-$name/$BUILD/nf4") labels+=("@$name"); done
}
build_variants() {
  local p name dir pids=() r=0
  for p in ${AB_PATCHES:-}; do
    name=$(basename "$p" .patch) dir=".ab-$name"
    [[ -f "$p" ]] || { echo "AB_PATCHES: no file $p" >&2; return 1; }
    rm -rf "$dir" && mkdir "$dir" || return 1
    tar -c --exclude='./build*' --exclude='./.ab-*' --exclude='./.git' --exclude='./.peers' --exclude='./.whl' --exclude='./.debs' . |
      tar -x -C "$dir" || return 1
    # From the top: inside a repository, git apply run in a subfolder skips paths outside it.
    git apply --directory="$dir" "$p" || { echo "AB_PATCHES: $p does not apply to this tree" >&2; return 1; }
    AB_BASE="$dir" AB_TARGETS=nf4_tests build_base >"$LOGDIR/build-$name.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || r=1; done
  return $r
}

# The GPU machine may lack the Debian shared libraries the binaries link (fmt): copy them beside
# the build, then pack what runs (lab/gpu_check.sh's bundle, which also records this checkout's
# absolute path, baked into ctest files and test data paths).
prepare() {
  build || exit 1
  copy_shared_libs "$BUILD/bundle-lib" "$BUILD/tests/nf4_tests" "$BUILD/nf4"
  pack_bundle "$BUNDLE" "$BUILD" || exit 1
}

setup() {
  mkdir -p "$LOGDIR" "$OUT"
  rm -f "$LOGDIR"/*.log
  unpack_bundle "$BUNDLE"
  setup_vulkan  # lab/gpu_check.sh: NF4_VULKAN_LOADER_DEBS, NF4_VULKAN_LAYER_DEBS, VK_DRIVER_FILES
  export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin:${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer"
}

# The product rows of `nf4 bench` (the table after "gemv W [N x K]").
gemv_bench() {
  local name="$1"
  shift
  "$@" --json "$OUT/bench_gemv_$name.json" >"$LOGDIR/bench-last.txt" 2>&1
  local r=$?
  grep -a -E 'nf4 bench|copy ceiling|timing' "$LOGDIR/bench-last.txt"
  sed -n '/^gemv W/,$p' "$LOGDIR/bench-last.txt"
  echo "RESULT: exit $r, $(awk '/^gemv W/ {on = 1; next} on && NF >= 7 {printf "%s m%s %sus(%s) ", $1, $2, $4, $7}' "$LOGDIR/bench-last.txt")"
  return $r
}
# The CUDA-graph table for each configuration in $2 (a space-separated list of values of the
# variable named $1: NF4_GEMV_CONFIG or NF4_GEMV_MMA; "auto" for the default choice), ROUNDS times
# in turn, through this tree's nf4 ($4) and each A/B tree's, condensed to "round config[@tree]
# shape m us %floor"; $3 names the log of the last run, the rest is nf4's bench command line.
ab_table() {
  local var="$1" configs="$2" last="$LOGDIR/$3" cfg round r=0 i label trees labels
  shift 3
  ab_trees "$1"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for cfg in $configs; do
      for i in "${!trees[@]}"; do
        label="$cfg${labels[$i]}"
        env NF4_BENCH_TIMING=graph "$var=${cfg#auto}" "${trees[$i]}" "${@:2}" >"$last" 2>&1 || r=1
        awk -v c="$label" -v n="$round" '/^gemv W/ {on = 1; next} on && NF >= 7 {printf "r%s %-22s %-12s m%-3s %9s us %8s floor\n", n, c, $1, $2, $4, $6}' "$last"
      done
    done
  done
  echo "RESULT: exit $r, $(echo "$configs" | wc -w) configurations x ${ROUNDS:-2} rounds"
  return $r
}
# The exact contract's kernels (GEMV_AB) and the fast contract's (GEMV_MMA_AB).
gemv_ab() { ab_table NF4_GEMV_CONFIG "$GEMV_AB" ab-last.txt "$@"; }
gemv_mma_ab() { ab_table NF4_GEMV_MMA "$GEMV_MMA_AB" mma-ab-last.txt "$@"; }
# Nsight Compute on the fast product's main kernel (the warpgroup, wide, streaming or ring kernel:
# not the split forms' x image or addition), per shape:m of NCU_FAST.
ncu_fast() {
  local ncu_bin item shape m base r=0
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  [[ -n "$ncu_bin" ]] || { echo "RESULT: no ncu"; return 1; }
  for item in $NCU_FAST; do
    shape=${item%%:*} m=${item##*:} base="$OUT/ncu-fast-$shape-$m"
    # The bench's own warm-up calls come first: skip them, profile one product launch.
    if [[ -n "${NCU_METRICS:-}" ]]; then
      # A few metrics of each kernel of a product call as it runs in sequence: the caches as the
      # kernel before left them, the clocks as they are; this tree's build, then the A/B trees'.
      local trees labels i
      ab_trees "$BUILD/nf4"
      for i in "${!trees[@]}"; do
        NF4_BENCH_TIMING=batch "$ncu_bin" --metrics "$NCU_METRICS" --cache-control none --clock-control none --replay-mode "${NCU_REPLAY:-kernel}" --kernel-name-base function \
          --kernel-name "regex:${NCU_KERNEL:-gemv_mma_}" --launch-skip 30 --launch-count "${NCU_COUNT:-3}" "${trees[$i]}" bench --gemv-only \
          --gemv-shapes "$shape" --gemv-m "$m" --gemv-dtype bf16 --gemv-mode fast --iters 20 --backend cuda >"$base${labels[$i]}.txt" 2>&1 || r=1
        echo "== $shape m $m${labels[$i]}"
        grep -E "gemv_mma|gpu__|dram__|lts__|sm__" "$base${labels[$i]}.txt" | sed 's/^ *//'
      done
      continue
    fi
    NF4_BENCH_TIMING=batch "$ncu_bin" --set full --import-source no --kernel-name-base function \
      --kernel-name "regex:${NCU_KERNEL:-gemv_mma_(kernel|stream_kernel|wide_kernel|wgmma_kernel|wgmma256_kernel)}" --launch-skip 10 --launch-count 1 \
      --export "$base" --force-overwrite "$BUILD/nf4" bench --gemv-only --gemv-shapes "$shape" --gemv-m "$m" --gemv-dtype bf16 \
      --gemv-mode fast --iters 20 --backend cuda >"$base.log" 2>&1 || { r=1; tail -5 "$base.log"; continue; }
    "$ncu_bin" --import "$base.ncu-rep" --page details >"$base.txt" 2>&1 || r=1
    "$ncu_bin" --import "$base.ncu-rep" --page source --print-source sass --csv >"$base.csv" 2>&1 || echo "($shape m $m: no source page from this ncu)"
    echo "== $shape m $m"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps|No Eligible|Registers Per|Achieved Occupancy" "$base.txt" | sed 's/^ *//'
  done
  echo "RESULT: exit $r"
  return $r
}
# Each AB_PATCHES tree's CUDA product tests (every kernel bit for bit against the others).
variants_test() {
  local name r=0
  for name in $(ab_variants); do
    echo "== $name"
    cuda_doctest ".ab-$name/$BUILD/tests/nf4_tests" -tc='cuda gemv*' || r=1
  done
  echo "RESULT: exit $r, $(ab_variants | wc -l) patched trees"
  return $r
}
export -f gemv_bench ab_table gemv_ab gemv_mma_ab ncu_fast ab_variants ab_trees variants_test
export BUILD LOGDIR OUT AB_BASE AB_PATCHES

run() {
  setup
  local T="$BUILD/tests/nf4_tests"
  local bench="$BUILD/nf4 bench --gemv-only --gemv-shapes $GEMV_SHAPES --gemv-m $GEMV_M --gemv-dtype bf16 --iters $ITERS"
  SAN="$(command -v compute-sanitizer || true)"
  export SAN
  phase ctest 300 "cuda_ctest $BUILD 'gemv|machine code'"
  if [[ -n "${AB_PATCHES:-}" ]]; then phase ctest-variants 600 "variants_test"; fi
  phase large 300 "NF4_CUDA_LARGE=1 cuda_doctest $T -tc='cuda gemv: more than*'"
  phase memcheck 300 "cuda_sanitize memcheck --leak-check full $T -tc='cuda gemv:*,cuda gemv fast:*' -tce='*more than*'"
  phase racecheck 300 "cuda_sanitize racecheck --racecheck-report all $T -tc='cuda gemv: device pointers*,cuda gemv: batch*,cuda gemv fast: the wide kernels walk*,cuda gemv fast: the streaming kernel*'"
  phase verify 120 "$BUILD/nf4 verify tests/data/golden.safetensors --dtype bf16 2>&1 | tail -10"
  phase bench-graph 300 "NF4_BENCH_TIMING=graph gemv_bench cuda_graph $bench --backend cuda"
  phase bench-batch 300 "NF4_BENCH_TIMING=batch gemv_bench cuda_batch $bench --backend cuda"
  phase bench-fast 300 "NF4_BENCH_TIMING=graph gemv_bench cuda_fast $BUILD/nf4 bench --gemv-only --gemv-shapes $GEMV_SHAPES --gemv-m $GEMV_FAST_M --gemv-dtype bf16 --gemv-mode fast --iters $ITERS --backend cuda"
  phase bench-vulkan 300 "gemv_bench vulkan $bench --backend vulkan"
  phase vulkan-fast 300 "NF4_VULKAN_COOP=1 cuda_doctest $T -tc='vulkan gemv fast:*,gemv fast:*'"
  if [[ -x "$BUILD/examples/nf4_vulkan_engine_example" ]]; then
    phase vulkan-example 60 "NF4_VULKAN_COOP=1 $BUILD/examples/nf4_vulkan_engine_example 4096 4096"
  fi
  phase bench-vulkan-fast 300 "NF4_VULKAN_COOP=1 gemv_bench vulkan_fast $BUILD/nf4 bench --gemv-only --gemv-shapes $GEMV_SHAPES --gemv-m $GEMV_FAST_M --gemv-dtype bf16 --gemv-mode fast --iters $ITERS --backend vulkan"
  phase dense 120 "python3 $ROOT/lab/torch/bench_dense.py $GEMV_SHAPES $GEMV_FAST_M"
  if [[ -n "${GEMV_AB:-}" ]]; then phase bench-ab 400 "gemv_ab $bench --backend cuda"; fi
  if [[ -n "${GEMV_MMA_AB:-}" ]]; then
    phase bench-mma-ab 400 "gemv_mma_ab $BUILD/nf4 bench --gemv-only --gemv-shapes $GEMV_SHAPES --gemv-m $GEMV_FAST_M --gemv-dtype bf16 --gemv-mode fast --iters $ITERS --backend cuda"
  fi
  if [[ -n "${NCU_FAST:-}" ]]; then phase ncu-fast 400 "ncu_fast"; fi
  {
    echo "nf4 gpu_gemv: $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null || true
    printf '%-18s %-10s %6s  %s\n' phase status time result
    printf '%s\n' "${SUMMARY[@]}"
    [[ -f "$LOGDIR/bench-ab.log" ]] && { echo "--- bench (a/b)"; grep -v RESULT "$LOGDIR/bench-ab.log" | grep -v '^===='; }
    [[ -f "$LOGDIR/bench-mma-ab.log" ]] && { echo "--- bench (tensor-core kernels a/b)"; grep -v RESULT "$LOGDIR/bench-mma-ab.log" | grep -v '^===='; }
    [[ -f "$LOGDIR/ncu-fast.log" ]] && { echo "--- ncu (fast product)"; grep -v RESULT "$LOGDIR/ncu-fast.log" | grep -v '^===='; }
    for f in graph batch fast vulkan vulkan-fast; do
      [[ -f "$LOGDIR/bench-$f.log" ]] && { echo "--- bench ($f)"; sed -n '/^gemv W/,/^RESULT/p' "$LOGDIR/bench-$f.log" | grep -v RESULT; }
    done
  } | tee "$OUT/gemv-summary.txt"
  tar -C "$LOGDIR" -czf "$OUT/gemv-logs.tgz" . 2>/dev/null || true
}

case "${1:-all}" in
  all)
    # The base tree builds beside this one (each build's long pole is one translation unit on one
    # core, so the two take about the time of one).
    mkdir -p "$LOGDIR"
    build_base >"$LOGDIR/build-base.log" 2>&1 &
    base_pid=$!
    build_variants >"$LOGDIR/build-variants.log" 2>&1 &
    variants_pid=$!
    build || { wait "$base_pid" "$variants_pid"; exit 1; }
    wait "$base_pid" || { echo "AB_BASE: build failed" >&2; tail -20 "$LOGDIR/build-base.log" >&2; exit 1; }
    wait "$variants_pid" || { echo "AB_PATCHES: build failed" >&2; tail -20 "$LOGDIR/build-variants.log" >&2; exit 1; }
    run ;;
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: lab/gpu_gemv.sh all|prepare|run" >&2; exit 2 ;;
esac
