#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tools/gpu_check.sh: the one script that builds, tests, sanitizes and benchmarks nf4 on the GPU
# machine (DEVICE.md), in one call of the device tool.
#
# The GPU machine has nvcc, cmake and ninja but none of the Debian -dev headers nf4 builds with
# (fmt, nlohmann-json, CLI11, doctest). So the build happens here, on the Debian development
# machine, and the build folders travel with the call:
#
#   tools/gpu_check.sh prepare            # here: builds build-gpu (Release, fat binary, CUDA ON,
#                                         # the tuner) and build-gpu-sm75 (compute_75 PTX only),
#                                         # packs their executables, ctest files and the shared
#                                         # libraries they need into build-gpu-carry/ (~20 MB)
#   run(command="tools/gpu_check.sh run", carry=["build-gpu-carry", ".whl"])
#
# `run` writes $OUT/summary.txt (the table printed last), $OUT/logs.tgz (every phase's log) and
# the benchmark reports. Select phases with PHASES="..." (default: all of a section's phases);
# NF4_GPU_TUNE=1 adds the kernel-variant sweep (nf4_cuda_tune); NF4_GPU_AB="cfg ..." adds one bench
# per kernel configuration (the cache-hint A/B).
#
# Sections: each backend owns one block below ("[cuda]", "[vulkan]") defining prepare_<name>
# and run_<name>; main() calls every section whose functions exist, in SECTIONS order.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-2}"                 # this machine has 2 cores; the GPU machine builds nothing
SECTIONS="${SECTIONS:-cuda vulkan faults}"

# ==== [common] =================================================================================
LOGDIR="${TMPDIR:-/tmp}/nf4-gpu-logs"
SUMMARY=()
START_TIME=$(date +%s)

# phase NAME TIMEOUT_S COMMAND...: runs one step with a time limit, its output in $LOGDIR/NAME.log
# (and echoed), one line of the final table: status, seconds, and the log's line tagged `RESULT:`
# or its last line.
phase() {
  local name="$1" limit="$2"
  shift 2
  if [[ -n "${PHASES:-}" && " $PHASES " != *" $name "* ]]; then return 0; fi
  local log="$LOGDIR/$name.log" t0 rc left
  t0=$(date +%s)
  # One device call may run 600 s: keep every phase inside NF4_GPU_DEADLINE so that the summary
  # and the logs are always written.
  left=$((START_TIME + ${NF4_GPU_DEADLINE:-560} - t0))
  if ((left < 25)); then
    SUMMARY+=("$(printf '%-18s %-10s %5ss  %s' "$name" "SKIPPED" 0 "out of time (NF4_GPU_DEADLINE)")")
    return 0
  fi
  ((limit > left - 15)) && limit=$((left - 15))
  echo "==== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" bash -c "$*" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local secs=$(($(date +%s) - t0)) status="ok"
  [[ $rc -ne 0 ]] && status="FAIL($rc)"
  [[ $rc -eq 124 || $rc -eq 137 ]] && status="TIMEOUT"
  local note
  note="$(grep -a 'RESULT:' "$log" | tail -1 | sed 's/.*RESULT: *//')"
  [[ -z "$note" ]] && note="$(grep -av '^\s*$' "$log" | tail -1 | cut -c1-110)"
  SUMMARY+=("$(printf '%-18s %-10s %5ss  %s' "$name" "$status" "$secs" "$note")")
}

finish() {
  local out="${OUT:-$ROOT/gpu-check-out}"
  mkdir -p "$out"
  {
    echo "nf4 gpu_check: $(date -u +%Y-%m-%dT%H:%MZ), $(($(date +%s) - START_TIME)) s"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null || true
    printf '%-18s %-10s %6s  %s\n' phase status time result
    printf '%s\n' "${SUMMARY[@]}"
  } >"$out/summary.txt"
  tar -C "$LOGDIR" -czf "$out/logs.tgz" . 2>/dev/null || true
  echo
  cat "$out/summary.txt"
}

# The carried binaries need the Debian shared libraries copied next to them (libfmt), and absolute
# paths baked into the build (test data, ctest files) point at the Debian checkout: recreate it.
setup_gpu_machine() {
  mkdir -p "$LOGDIR"
  rm -f "$LOGDIR"/*.log
  if [[ -f build-gpu-carry/bundle.tar.xz ]]; then
    xz -dc build-gpu-carry/bundle.tar.xz | tar -xf - && echo "unpacked build-gpu-carry/bundle.tar.xz"
  fi
  export LD_LIBRARY_PATH="$ROOT/build-gpu/carry-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local src
  src="$(cat build-gpu/carry-lib/SOURCE_DIR 2>/dev/null || true)"
  if [[ -n "$src" && "$src" != "$ROOT" && ! -e "$src" ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"
    echo "linked $src -> $ROOT (paths baked into the build)"
  fi
  export PATH="$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer"
  # The Vulkan loader before anything runs, so that ctest's Vulkan cases and the engine example
  # (which links libvulkan like any application) find it in every section (DEVICE.md).
  if [[ -d .gl ]]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json VK_ICD_FILENAMES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  fi
}

# The build folders hold ~100 MB of objects; what runs there is the executables (each with the
# same fat binary inside, so they compress well together), ctest's files and every section's
# build-gpu/carry-* folder. One archive: build-gpu-carry/bundle.tar.xz, unpacked by `run`.
pack_carry() {
  rm -rf build-gpu-carry && mkdir -p build-gpu-carry
  {
    find build-gpu build-gpu-sm75 -path '*/CMakeFiles' -prune -o -type f \( -name CTestTestfile.cmake -o -name '*_include-*.cmake' \
      -o -name '*_tests-*.cmake' -o -perm -u+x \) -print 2>/dev/null
    find build-gpu -maxdepth 1 -type d -name 'carry-*' -exec find {} -type f \;
  } | sort -u >build-gpu-carry/files.txt
  tar -cf - -T build-gpu-carry/files.txt | xz -6 -T"$JOBS" >build-gpu-carry/bundle.tar.xz || return 1
  du -sh build-gpu-carry .whl 2>/dev/null
  echo "carry: build-gpu-carry$([[ -f $NF4_BNB_LIB ]] && echo ' .whl')"
}

# ==== [cuda] ===================================================================================
NF4_BNB_LIB="${NF4_BNB_LIB:-.whl/libbitsandbytes_cuda130.so}"

prepare_cuda() {
  local gen=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_CUDA=ON -DNF4_VULKAN="${NF4_GPU_VULKAN:-AUTO}")
  cmake -S . -B build-gpu "${gen[@]}" -DNF4_CUDA_TUNER=ON || return 1
  ninja -C build-gpu -j"$JOBS" || return 1
  # The sm_75 proof: compute_75 PTX only, no machine code; the driver JIT-compiles it on Hopper.
  cmake -S . -B build-gpu-sm75 "${gen[@]}" -DNF4_VULKAN=OFF -DNF4_CUDA_ARCHITECTURES=75-virtual -DNF4_BUILD_TOOLS=OFF || return 1
  ninja -C build-gpu-sm75 -j"$JOBS" nf4_tests || return 1
  mkdir -p build-gpu/carry-lib
  echo "$ROOT" >build-gpu/carry-lib/SOURCE_DIR
  # Shared libraries the binaries need beyond glibc/libstdc++ (Debian's fmt is a shared library;
  # the examples link libnf4.so.<major>, whose SONAME link is not an executable file pack_carry takes).
  for lib in $(ldd build-gpu/tests/nf4_tests build-gpu/nf4 build-gpu/examples/nf4_* 2>/dev/null | awk '/=>/ {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) ;;
      *) cp -L "$lib" build-gpu/carry-lib/ ;;
    esac
  done
}

# Each step is a function (exported, so `phase` can run it under `timeout`); a line starting
# with RESULT: becomes its entry in the summary table.
cuda_ctest() {
  (cd build-gpu && ctest --output-on-failure -j8 >"$LOGDIR/ctest-full.txt" 2>&1)
  local r=$?
  tail -30 "$LOGDIR/ctest-full.txt"
  echo "RESULT: $(grep -a 'tests passed' "$LOGDIR/ctest-full.txt" | tail -1)"
  return $r
}
# doctest's summary lines of one run of a test binary, and its exit status as the RESULT.
cuda_doctest() {
  "$@" >"$LOGDIR/doctest-last.txt" 2>&1
  local r=$?
  grep -a -E 'MESSAGE|ERROR|FAILED|CHECK|test cases|assertions|Status' "$LOGDIR/doctest-last.txt" | tail -40
  echo "RESULT: exit $r, $(grep -a 'test cases' "$LOGDIR/doctest-last.txt" | tail -1 | tr -s ' ')"
  return $r
}
cuda_sanitize() {
  local tool="$1"
  shift
  "$SAN" --tool "$tool" --error-exitcode 3 "$@" >"$LOGDIR/san-last.txt" 2>&1
  local r=$?
  grep -a -E 'ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY|Hazard|Invalid|test cases|Status' "$LOGDIR/san-last.txt" | tail -20
  echo "RESULT: exit $r, $(grep -a -E 'SUMMARY' "$LOGDIR/san-last.txt" | tail -1)"
  return $r
}
export -f cuda_ctest cuda_doctest cuda_sanitize

run_cuda() {
  local T=build-gpu/tests/nf4_tests
  SAN="$(command -v compute-sanitizer || true)"
  export SAN LOGDIR
  phase cuda-env 30 "nvidia-smi; nvcc --version | tail -2; \"\${SAN:-echo}\" --version | head -2; ldd $T"
  # The whole suite through ctest (every backend against the oracle on this machine, the cuda
  # cases with device pointers), default sizes.
  phase cuda-ctest 200 cuda_ctest
  local peer="" libdir
  [[ -f "$NF4_BNB_LIB" ]] && peer="--peer-bnb $NF4_BNB_LIB"
  # bitsandbytes' library needs the CUDA 13 runtime and cuBLAS of the machine.
  libdir="$(dirname "$(find /usr/local/cuda* /usr/local/lib /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)" 2>/dev/null)"
  local bench="LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:/usr/local/cuda/lib64:$libdir build-gpu/nf4 bench --backend cuda --iters 100"
  # Timed as CUDA-graph replays (the runner's default, see backends/cuda/cuda_backend.h), then with
  # an event pair around every call.
  phase cuda-bench 150 "$bench --json \$OUT/bench_cuda.json $peer"
  phase cuda-bench-events 150 "NF4_BENCH_TIMING=events $bench --json \$OUT/bench_cuda_events.json $peer"
  # Cache-hint A/B: NF4_GPU_AB="cfg cfg ..." (threads,units,hints,ctas_per_sm,options each) runs the
  # bench once per configuration in place of the tuning table (NF4_CUDA_CONFIG).
  local i=0 cfg
  for cfg in ${NF4_GPU_AB:-}; do
    phase "cuda-ab-$i" 120 "NF4_CUDA_CONFIG=$cfg $bench --json \$OUT/bench_ab_$i.json; echo RESULT: $cfg"
    i=$((i + 1))
  done
  if [[ "${NF4_GPU_TUNE:-0}" != 0 ]]; then
    phase cuda-tune 300 "build-gpu/backends/cuda/nf4_cuda_tune ${NF4_GPU_TUNE_ARGS:-} --csv \$OUT/tune.csv"
  fi
  # The full device sweep: every size 1..4096 x blocksize x variant x dtype, geometric sizes to 2^28.
  phase cuda-full 240 "NF4_CUDA_FULL_SWEEP=1 NF4_CUDA_LARGE=1 cuda_doctest $T -tc='cuda:*'"
  # The sm_75 path: a build holding only compute_75 PTX (bf16 by integer rounding) run here, the
  # driver compiling the PTX for this GPU.
  phase cuda-sm75-ptx 240 "cuda_doctest build-gpu-sm75/tests/nf4_tests -tc='cuda:*,*backend*'"
  # compute-sanitizer on the cuda cases (subset sizes; the 2^32 conversion check and the timing
  # case are left out: long under instrumentation, and they access nothing the others don't).
  phase cuda-memcheck 200 "cuda_sanitize memcheck --leak-check full $T -tc='cuda:*' -tce='*2^32*,*benchmark runner*'"
  phase cuda-racecheck 200 "cuda_sanitize racecheck --racecheck-report all $T -tc='cuda:*' -tce='*2^32*,*benchmark runner*'"
  phase cuda-synccheck 120 "cuda_sanitize synccheck $T -tc='cuda: chunks*,cuda: mixed*'"
  phase cuda-verify 120 "build-gpu/nf4 verify tests/data/golden.safetensors 2>&1 | tail -8"
}

# ==== [vulkan] =================================================================================
# prepare_vulkan / run_vulkan live with the backend (backends/vulkan/gpu_check.sh).
source "$ROOT/backends/vulkan/gpu_check.sh"

# ==== [faults] =================================================================================
# Issue 6's GPU-machine cases (tests/test_faults.cpp): a tensor larger than the CUDA device
# (plain cudaMalloc, never managed memory) and a tensor of more than 2^31 elements on every
# available backend. Uses build-gpu from the [cuda] section.
run_faults() {
  phase faults-gpu 300 "NF4_TEST_DEVICE_OOM=1 NF4_TEST_LARGE=1 cuda_doctest build-gpu/tests/nf4_tests -tc='*NF4_TEST_DEVICE_OOM*,*NF4_TEST_LARGE*'"
}

# ==== main =====================================================================================
main() {
  local mode="${1:-run}"
  case "$mode" in
    prepare)
      for s in $SECTIONS; do
        if declare -F "prepare_$s" >/dev/null; then "prepare_$s" || exit 1; fi
      done
      pack_carry || exit 1
      ;;
    run)
      setup_gpu_machine
      for s in $SECTIONS; do
        if declare -F "run_$s" >/dev/null; then "run_$s"; fi
      done
      finish
      ;;
    *)
      echo "usage: tools/gpu_check.sh prepare|run" >&2
      exit 2
      ;;
  esac
}
main "$@"
