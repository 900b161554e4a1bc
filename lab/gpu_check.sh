#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# lab/gpu_check.sh: builds nf4 for a GPU machine, then runs there, in one job, everything that
# needs the GPU: the test suite on CUDA and Vulkan, the exhaustive device sweeps, compute-sanitizer,
# the benchmark against the copy ceiling (docs/DESIGN.md section 4) and, on request, the PyTorch
# operator's tests. It ends with a table of every phase (status, seconds, one-line result).
#
# Two machines, or one:
#   build machine  Debian/Ubuntu with nf4's build dependencies (tools/install-deps.sh), nvcc for
#                  the CUDA backend, glslc for the shaders; no GPU needed.
#                      lab/gpu_check.sh prepare
#                  builds build-gpu (Release, CUDA fat binary sm_75..sm_90 + PTX, the tuner, Vulkan
#                  when found) and build-gpu-sm75 (compute_75 PTX only), and packs what runs on the
#                  GPU machine (executables, ctest files, the shared libraries they need beyond
#                  glibc, Debian's Vulkan validation layer) into build-gpu-bundle/bundle.tar.xz.
#   GPU machine    an NVIDIA GPU with its driver, CUDA 13 (runtime, cuBLAS for the bitsandbytes
#                  peer, compute-sanitizer), python3 with torch for the [torch] section, bash,
#                  coreutils, tar, xz; no compiler or network needed. Copy the repository there
#                  with build-gpu-bundle/ and, as needed, the folders named by NF4_VULKAN_LOADER_DEBS
#                  and NF4_PEERS below, then:
#                      lab/gpu_check.sh run
#                  `run` unpacks the bundle, sets up the environment (below) and runs the phases.
#   one machine    with both: lab/gpu_check.sh all   (prepare, then run)
#   listing only   lab/gpu_check.sh run --dry-run   sets up the environment and prints each phase
#                  with its command instead of running it.
#
# Results: $OUT/summary.txt (the final table), $OUT/logs.tgz (every phase's full log) and the
# benchmark reports ($OUT/bench_*.json).
#
# Configuration (environment variables, with their defaults):
#   SECTIONS="cuda vulkan faults"   sections to prepare and run, in order; also: vulkan_tune, torch
#   PHASES=""                       only these phase names (default: every phase of the sections)
#   OUT=$ROOT/build-gpu-out         where results go
#   JOBS=$(nproc)                   build parallelism (prepare)
#   CUDA_HOME=/usr/local/cuda       CUDA toolkit (nvcc when building; compute-sanitizer, libraries)
#   NF4_PYTHON=python3              the Python with torch (torch section; locating CUDA libraries)
#   NF4_GPU_DEADLINE=560            seconds after the start beyond which phases are skipped, so the
#                                   summary and logs are written even where the job has a time
#                                   limit (set it some seconds below that limit)
#   NF4_GPU_RUNTIME=$ROOT/build-gpu-runtime   private prefix on the GPU machine: the unpacked
#                                   Vulkan loader and validation layer, the phase logs
#   NF4_VULKAN_LOADER_DEBS=$ROOT/.gl   folder of .deb files of a Vulkan loader and the GLVND
#                                   libraries NVIDIA's ICD needs (libvulkan1 libegl1 libglvnd0
#                                   libopengl0 libgl1 libglx0 libgles2), for a GPU machine that has
#                                   the NVIDIA driver but no Vulkan loader. They are unpacked into
#                                   $NF4_GPU_RUNTIME/vulkan-loader (never into /) and LD_LIBRARY_PATH
#                                   points there. Fetch them on a Debian/Ubuntu machine of the same
#                                   architecture with `apt-get download <package>...`. Without the
#                                   folder the system's loader is used.
#   NF4_VULKAN_LAYER_DEBS=""        folder of .deb files of a validation layer newer than the one
#                                   prepare packs (Debian 12's 1.3.239 knows neither
#                                   VK_KHR_cooperative_matrix nor VK_KHR_shader_bfloat16), with a
#                                   loader of its version: vulkan-validationlayers and libvulkan1
#                                   from Debian sid (1.4.363: glibc 2.38 and libstdc++ 14, which Ubuntu
#                                   24.04 has), `apt-get download` with a sid source list. Unpacked
#                                   into $NF4_GPU_RUNTIME/vulkan-layer-debs, ahead of the packed layer
#                                   and the loader above on VK_LAYER_PATH and LD_LIBRARY_PATH.
#   VK_DRIVER_FILES                 (left to the environment) the ICD manifest of the GPU's driver,
#                                   e.g. the driver's nvidia_icd.json; it names libGLX_nvidia.so.0,
#                                   which the loader finds on the normal library path. Unset: the
#                                   loader searches its standard directories. VK_ICD_FILENAMES is set
#                                   to the same value for older loaders.
#   NF4_BUILD_DEBS=""               folders of .deb files of what prepare needs and the machine lacks
#                                   (glslc libshaderc1 spirv-tools libvulkan-dev for the shaders and the
#                                   Vulkan headers; libfmt-dev libfmt9 nlohmann-json3-dev), unpacked
#                                   into $NF4_GPU_RUNTIME/build-tools (never into /) and put on PATH,
#                                   CMAKE_PREFIX_PATH and LD_LIBRARY_PATH: so `prepare` (and `all`) also
#                                   runs on a GPU machine that has nvcc and CMake but no Vulkan SDK.
#                                   Fetch them with `apt-get download <package>...` as above.
#   NF4_PEERS=$ROOT/.peers          the peer implementations timed next to nf4: bitsandbytes'
#                                   package (its libbitsandbytes_cuda*.so for `nf4_lab bench --peer-bnb`,
#                                   the Python package for the torch section)
#   NF4_BNB_LIB                     bitsandbytes' CUDA library (default: the newest
#                                   libbitsandbytes_cuda*.so under $NF4_PEERS; none: no peer rows)
#   NF4_GPU_DEVICES=0               the devices the cuda-devices phases require of some backend (2 on a
#                                   two-GPU machine: fewer fail them instead of skipping the two-GPU cases)
#   NF4_GPU_TUNE=0                  1: the CUDA kernel-variant sweep (nf4_cuda_tune), with
#                                   NF4_GPU_TUNE_ARGS passed to it
#   NF4_GPU_AB="cfg ..."            one extra bench per kernel configuration (NF4_CUDA_CONFIG:
#                                   threads,units,hints,grid,options; grid = group | N/sm | Nxocc), the cache-hint A/B
#   NF4_VK_SWEEP="cfg;cfg;..."      short Vulkan benches per NF4_VULKAN_TUNE value, then the best
#                                   one against CUDA (vulkan section)
#
# The build records absolute paths of the build machine's checkout (test data, ctest files). When
# the GPU machine's checkout is elsewhere, `run` creates that path as a symbolic link to it.
#
# Sections: each block below ("[cuda]", "[vulkan]", ...) defines prepare_<name> and/or run_<name>;
# prepare and run call those of every section in SECTIONS. Other scripts source this file for its
# helpers (NF4_GPU_LIBRARY=1 skips main).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
JOBS="${JOBS:-$(nproc)}"
SECTIONS="${SECTIONS:-cuda vulkan faults}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NF4_PYTHON="${NF4_PYTHON:-python3}"
NF4_GPU_RUNTIME="${NF4_GPU_RUNTIME:-$ROOT/build-gpu-runtime}"
NF4_VULKAN_LOADER_DEBS="${NF4_VULKAN_LOADER_DEBS:-$ROOT/.gl}"
NF4_PEERS="${NF4_PEERS:-$ROOT/.peers}"
OUT="${OUT:-$ROOT/build-gpu-out}"
BUNDLE=build-gpu-bundle
export CUDA_HOME NF4_PYTHON NF4_PEERS OUT

# ==== [common] =================================================================================
LOGDIR="$NF4_GPU_RUNTIME/logs"
SUMMARY=()
START_TIME=$(date +%s)
DRY_RUN=0
BUNDLE_DIRS=()  # build folders whose executables go into the bundle (each prepare_* adds its own)

# phase NAME TIMEOUT_S COMMAND...: runs one step with a time limit, its output in $LOGDIR/NAME.log
# (and echoed), one line of the final table: status, seconds, and the log's line tagged `RESULT:`
# or its last line.
phase() {
  local name="$1" limit="$2"
  shift 2
  if [[ -n "${PHASES:-}" && " $PHASES " != *" $name "* ]]; then return 0; fi
  if ((DRY_RUN)); then
    echo "==== $name (limit ${limit}s): $*"
    SUMMARY+=("$(printf '%-18s %-10s %5ss  %s' "$name" "DRY-RUN" 0 "$*" | cut -c1-160)")
    return 0
  fi
  local log="$LOGDIR/$name.log" t0 rc left
  t0=$(date +%s)
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
  mkdir -p "$OUT"
  {
    echo "nf4 gpu_check: $(date -u +%Y-%m-%dT%H:%MZ), $(($(date +%s) - START_TIME)) s, sections: $SECTIONS"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null || true
    printf '%-18s %-10s %6s  %s\n' phase status time result
    printf '%s\n' "${SUMMARY[@]}"
  } >"$OUT/summary.txt"
  tar -C "$LOGDIR" -czf "$OUT/logs.tgz" . 2>/dev/null || true
  echo
  cat "$OUT/summary.txt"
}

# copy_shared_libs DEST BINARY...: the shared libraries the binaries load beyond the C/C++ runtime
# (Debian's libfmt, for one), which a GPU machine without the build dependencies lacks.
copy_shared_libs() {
  local dest="$1" lib
  shift
  mkdir -p "$dest"
  for lib in $(ldd "$@" 2>/dev/null | awk '/=>/ {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libvulkan.so* | libcuda.so*) ;;
      *) cp -L "$lib" "$dest/" ;;
    esac
  done
}

# pack_validation_layer DEST: the Khronos validation layer of the build machine (Debian's
# vulkan-validationlayers), for the Vulkan tests on a GPU machine that has none (any message it
# reports fails them). NF4_VK_LAYER_PREFIX (default /usr) is where it is installed.
pack_validation_layer() {
  local dest="$1" prefix="${NF4_VK_LAYER_PREFIX:-/usr}" so json
  so="$(find "$prefix/lib" -name libVkLayer_khronos_validation.so 2>/dev/null | head -1)"
  json="share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json"
  if [[ -z "$so" || ! -f "$prefix/$json" ]]; then
    echo "warning: no Khronos validation layer under $prefix: the Vulkan tests will run without it" >&2
    return 0
  fi
  mkdir -p "$dest"
  tar -C "$prefix" -cJf "$dest/validation-layer.tar.xz" "${so#"$prefix"/}" "$json"
}

# pack_bundle BUNDLE_DIR BUILD_DIR...: one archive of what runs on the GPU machine: the build
# folders' executables (each holds the same fat binary, so they compress well together), ctest's
# files and their bundle-* folders. The objects (~100 MB) stay behind.
pack_bundle() {
  local bundle="$1"
  shift
  rm -rf "$bundle" && mkdir -p "$bundle"
  echo "$ROOT" >"$bundle/SOURCE_DIR"
  {
    find "$@" -path '*/CMakeFiles' -prune -o \( -type f \( -name CTestTestfile.cmake -o -name '*_include-*.cmake' \
      -o -name '*_tests-*.cmake' -o -perm -u+x \) -o -type l -name 'lib*.so*' \) -print 2>/dev/null
    find "$@" -maxdepth 1 -type d -name 'bundle-*' -exec find {} -type f \;
  } | sort -u >"$bundle/files.txt"
  tar -cf - -T "$bundle/files.txt" | xz -6 -T"$JOBS" >"$bundle/bundle.tar.xz" || return 1
  du -sh "$bundle"
  echo "copy to the GPU machine: $bundle/ (and what NF4_VULKAN_LOADER_DEBS, NF4_PEERS name, if used)"
}

# unpack_bundle BUNDLE_DIR: restores the build folders and links the build machine's checkout path.
unpack_bundle() {
  local bundle="$1" src
  if [[ -f "$bundle/bundle.tar.xz" ]]; then
    xz -dc "$bundle/bundle.tar.xz" | tar -xf - && echo "unpacked $bundle/bundle.tar.xz"
  fi
  src="$(cat "$bundle/SOURCE_DIR" 2>/dev/null || true)"
  if [[ -n "$src" && "$src" != "$ROOT" && ! -e "$src" ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src" && echo "linked $src -> $ROOT (paths recorded by the build)"
  fi
  local d
  for d in */bundle-lib; do [[ -d "$d" ]] && export LD_LIBRARY_PATH="$ROOT/$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done
}

# unpack_debs DEBS_DIR PREFIX: extracts every .deb into PREFIX (dpkg-deb, or ar + tar where dpkg is
# missing) and prints the library folders found there.
unpack_debs() {
  local debs="$1" prefix="$2" f
  mkdir -p "$prefix"
  for f in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix" || return 1
    else
      local member
      member="$(ar t "$f" | grep '^data\.tar')" || return 1
      ar p "$f" "$member" | tar -x -a -f - -C "$prefix" 2>/dev/null ||
        ar p "$f" "$member" | tar -x --use-compress-program="${member##*.}" -C "$prefix" 2>/dev/null ||
        { echo "cannot unpack $f" >&2; return 1; }
    fi
  done
  find "$prefix" \( -type f -o -type l \) -name '*.so*' -printf '%h\n' | sort -u
}

# setup_vulkan: the Vulkan loader (from NF4_VULKAN_LOADER_DEBS when given), the ICD (VK_DRIVER_FILES)
# and the validation layer packed by prepare, all under $NF4_GPU_RUNTIME. Call before anything that
# may open Vulkan: ctest's Vulkan cases and the engine example run in every section.
setup_vulkan() {
  local dir
  if compgen -G "$NF4_VULKAN_LOADER_DEBS/*.deb" >/dev/null; then
    rm -rf "$NF4_GPU_RUNTIME/vulkan-loader"
    for dir in $(unpack_debs "$NF4_VULKAN_LOADER_DEBS" "$NF4_GPU_RUNTIME/vulkan-loader"); do
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    echo "Vulkan loader: unpacked $NF4_VULKAN_LOADER_DEBS/*.deb into $NF4_GPU_RUNTIME/vulkan-loader"
  fi
  if [[ -n "${VK_DRIVER_FILES:-}" ]]; then
    export VK_DRIVER_FILES VK_ICD_FILENAMES="$VK_DRIVER_FILES"
    [[ -f "${VK_DRIVER_FILES%%:*}" ]] || echo "warning: VK_DRIVER_FILES=$VK_DRIVER_FILES: no such file" >&2
  else
    echo "VK_DRIVER_FILES is not set: the Vulkan loader searches its standard ICD directories"
  fi
  local layer
  layer="$(ls -- */bundle-vk/validation-layer.tar.xz 2>/dev/null | head -1)"
  if [[ -n "$layer" ]]; then
    rm -rf "$NF4_GPU_RUNTIME/vulkan-layer" && mkdir -p "$NF4_GPU_RUNTIME/vulkan-layer"
    tar -C "$NF4_GPU_RUNTIME/vulkan-layer" -xJf "$layer"
    export VK_LAYER_PATH="$NF4_GPU_RUNTIME/vulkan-layer/share/vulkan/explicit_layer.d"
    dir="$(dirname "$(find "$NF4_GPU_RUNTIME/vulkan-layer" -name libVkLayer_khronos_validation.so | head -1)")"
    export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  if compgen -G "${NF4_VULKAN_LAYER_DEBS:-}/*.deb" >/dev/null; then
    rm -rf "$NF4_GPU_RUNTIME/vulkan-layer-debs"
    for dir in $(unpack_debs "$NF4_VULKAN_LAYER_DEBS" "$NF4_GPU_RUNTIME/vulkan-layer-debs"); do
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    export VK_LAYER_PATH="$NF4_GPU_RUNTIME/vulkan-layer-debs/usr/share/vulkan/explicit_layer.d"
    echo "Vulkan validation layer: unpacked $NF4_VULKAN_LAYER_DEBS/*.deb into $NF4_GPU_RUNTIME/vulkan-layer-debs"
  fi
}

setup_gpu_machine() {
  mkdir -p "$LOGDIR" "$OUT"
  rm -f "$LOGDIR"/*
  unpack_bundle "$BUNDLE"
  export PATH="$PATH:$CUDA_HOME/bin:$CUDA_HOME/compute-sanitizer"
  setup_vulkan
  export LOGDIR
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
}

# ==== [cuda] ===================================================================================
# The bitsandbytes peer: its CUDA library, and the CUDA 13 runtime and cuBLAS it links (from the
# toolkit, or from the nvidia-* Python packages next to torch).
NF4_BNB_LIB="${NF4_BNB_LIB:-$(find "$NF4_PEERS" -name 'libbitsandbytes_cuda*.so' 2>/dev/null | sort -V | tail -1)}"

cuda_peer_lib_path() {
  local dirs=("$CUDA_HOME/lib64") site
  for site in $("$NF4_PYTHON" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    [[ -d "$site/nvidia" ]] && dirs+=("$site/nvidia")
  done
  find "${dirs[@]}" -name 'libcublasLt.so.*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd: -
}

prepare_cuda() {
  local gen=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_CUDA=ON -DNF4_VULKAN="${NF4_GPU_VULKAN:-AUTO}")
  local tuner=OFF  # the kernel-variant sweep is built only for the run that uses it
  [[ "${NF4_GPU_TUNE:-0}" != 0 ]] && tuner=ON
  PATH="$CUDA_HOME/bin:$PATH" cmake -S . -B build-gpu "${gen[@]}" -DNF4_CUDA_TUNER=$tuner || return 1
  PATH="$CUDA_HOME/bin:$PATH" ninja -C build-gpu -j"$JOBS" || return 1
  # The sm_75 proof: compute_75 PTX only, no machine code; the driver JIT-compiles it on newer GPUs.
  PATH="$CUDA_HOME/bin:$PATH" cmake -S . -B build-gpu-sm75 "${gen[@]}" -DNF4_VULKAN=OFF -DNF4_CUDA_ARCHITECTURES=75-virtual \
    -DNF4_BUILD_TOOLS=OFF || return 1
  PATH="$CUDA_HOME/bin:$PATH" ninja -C build-gpu-sm75 -j"$JOBS" nf4_tests || return 1
  copy_shared_libs build-gpu/bundle-lib build-gpu/tests/nf4_tests build-gpu/nf4 build-gpu/nf4_lab build-gpu/examples/nf4_*
  BUNDLE_DIRS+=(build-gpu build-gpu-sm75)
}

# Each step is a function (exported, so `phase` can run it under `timeout`); a line starting
# with RESULT: becomes its entry in the summary table.
# cuda_ctest [BUILD [REGEX]]: ctest in BUILD (build-gpu), the tests matching REGEX (all).
cuda_ctest() {
  local build="${1:-build-gpu}" log="$LOGDIR/ctest-${2:-full}.txt"
  (cd "$build" && ctest --output-on-failure -j8 ${2:+-R "$2"} >"$log" 2>&1)
  local r=$?
  tail -30 "$log"
  echo "RESULT: $(grep -a 'tests passed' "$log" | tail -1)"
  return $r
}
# doctest's summary lines of one run of a test binary, and its exit status as the RESULT.
cuda_doctest() {
  "$@" >"$LOGDIR/doctest-last.txt" 2>&1
  local r=$?
  grep -a -E 'MESSAGE|ERROR|FAILED|CHECK|test cases|assertions|Status|fp16 check' "$LOGDIR/doctest-last.txt" | tail -40
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
  export SAN
  phase cuda-env 30 "nvidia-smi; nvcc --version | tail -2; \"\${SAN:-echo}\" --version | head -2; ldd $T"
  # The whole suite through ctest (every backend against the oracle on this machine, the cuda
  # cases with device pointers), default sizes.
  # 330 s: on an H100 the Vulkan cases again through staging copies take 163 s alone at -j8.
  phase cuda-ctest 330 cuda_ctest
  # Contexts on chosen devices (nf4_context_create_on_device): a context per device of every
  # backend, each from its own thread at once, and on CUDA contexts on GPUs 0 and 1 from threads
  # whose current device is the other GPU, device pointers, streams, prepared launches and host
  # staging, all against the oracle (tests/test_devices.cpp, tests/test_cuda_devices.cpp); then the
  # CUDA cases under memcheck. With one GPU the two-GPU cases skip, unless NF4_GPU_DEVICES=2.
  local devices="NF4_TEST_REQUIRE_DEVICES=${NF4_GPU_DEVICES:-0}"
  phase cuda-devices 120 "$devices cuda_doctest $T -tc='devices:*,cuda devices:*'"
  phase cuda-devices-memcheck 180 "$devices cuda_sanitize memcheck $T -tc='cuda devices:*'"
  local peer=""
  [[ -n "$NF4_BNB_LIB" && -f "$NF4_BNB_LIB" ]] && peer="--peer-bnb $NF4_BNB_LIB"
  # The peer is timed by the development binary, nf4_lab, whose bench is the CLI's with the peer.
  local bench="LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:$(cuda_peer_lib_path) build-gpu/nf4_lab bench --backend cuda --iters 100"
  # Timed back to back (the runner's default, see backends/cuda/cuda_backend.h), then with an
  # event pair around every call (docs/DESIGN.md section 4).
  phase cuda-bench 150 "$bench --json \$OUT/bench_cuda.json $peer"
  phase cuda-bench-events 150 "NF4_BENCH_TIMING=events $bench --json \$OUT/bench_cuda_events.json $peer"
  # Cache-hint A/B: one bench per configuration in place of the tuning table (NF4_CUDA_CONFIG).
  local i=0 cfg
  for cfg in ${NF4_GPU_AB:-}; do
    phase "cuda-ab-$i" 120 "NF4_CUDA_CONFIG=$cfg $bench --json \$OUT/bench_ab_$i.json; echo RESULT: $cfg"
    i=$((i + 1))
  done
  if [[ "${NF4_GPU_TUNE:-0}" != 0 ]]; then
    phase cuda-tune 300 "build-gpu/lab/nf4_cuda_tune ${NF4_GPU_TUNE_ARGS:-} --csv \$OUT/tune.csv"
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
# NF4_VK_BUILD (default build-gpu, the CUDA section's build, which has Vulkan AUTO): the build the
# Vulkan phases run. Another name makes prepare build it (Vulkan ON; CUDA ON for sm_90 when nvcc is
# there, so that `nf4 bench --backend cuda` runs in the same job for the same-run ratio).
NF4_VK_BUILD="${NF4_VK_BUILD:-build-gpu}"

prepare_vulkan() {
  local b="$NF4_VK_BUILD"
  if [[ "$b" != build-gpu ]]; then
    local cuda=OFF
    [[ -x "$CUDA_HOME/bin/nvcc" || -n "$(command -v nvcc)" ]] && cuda=ON
    PATH="$CUDA_HOME/bin:$PATH" cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_VULKAN=ON -DNF4_CUDA=$cuda \
      -DNF4_CUDA_ARCHITECTURES=90 || return 1
    # The engine example only where CMake found the Vulkan loader library (its message says so).
    local example=()
    ninja -C "$b" -t targets all 2>/dev/null | grep -q '^nf4_vulkan_engine_example:' && example=(nf4_vulkan_engine_example)
    PATH="$CUDA_HOME/bin:$PATH" ninja -C "$b" -j"$JOBS" nf4 nf4_tests "${example[@]}" || return 1
    copy_shared_libs "$b/bundle-lib" "$b/tests/nf4_tests" "$b/nf4"
  fi
  pack_validation_layer "$b/bundle-vk" || return 1
  BUNDLE_DIRS+=("$b")
}

# vulkan_ratio CUDA_JSON VULKAN_JSON: throughput Vulkan / CUDA per (matrix, dtype) from two bench
# reports of the same job, as a Markdown table (the form docs/PERFORMANCE_LOG.md records).
vulkan_ratio() {
  python3 - "$1" "$2" <<'PY'
import json, sys
c, v = (json.load(open(p)) for p in sys.argv[1:3])
cu = {(r["matrix"], r["dtype"]): r for r in c["results"]}
print(f"copy ceiling: cuda {c['copy_ceiling_gbps']:.1f} GB/s, vulkan {v['copy_ceiling_gbps']:.1f} GB/s")
print("| matrix | dtype | CUDA us | Vulkan us | Vulkan % of its copy | Vulkan / CUDA throughput |")
print("|---|---|---|---|---|---|")
worst = []
for r in v["results"]:
    k = (r["matrix"], r["dtype"])
    if k not in cu: continue
    x = cu[k]["time_us"] / r["time_us"]
    print(f"| {k[0]} | {k[1]} | {cu[k]['time_us']:.2f} | {r['time_us']:.2f} | {r['pct_of_copy']:.1f}% | {100*x:.1f}% |")
    worst.append((x, k))
if worst:
    m = min(worst)
    print(f"RESULT: vulkan/cuda worst {100*m[0]:.1f}% at {m[1][0]} {m[1][1]}")
PY
}
# vulkan_pick CUDA_JSON CONFIGS_FILE: per configuration ("NAME cfg" lines, NAME.json in $LOGDIR) the
# worst margin over the targets (Vulkan / CUDA throughput: 80% at 2048x8192, 90% at 4096x14336 and
# 8192x28672) on stderr; the best configuration on stdout.
vulkan_pick() {
  python3 - "$1" "$2" "$LOGDIR" <<'PY'
import json, os, sys
cuda = {(r["matrix"], r["dtype"]): r["time_us"] for r in json.load(open(sys.argv[1]))["results"]}
targets = {"2048x8192": 0.80, "4096x14336": 0.90, "8192x28672": 0.90}
best = None
for line in open(sys.argv[2]).read().splitlines():
    if not line: continue
    name, cfg = line.split(" ", 1)
    p = os.path.join(sys.argv[3], name + ".json")
    if not os.path.exists(p): continue
    rows, margins = [], []
    for r in json.load(open(p))["results"]:
        k = (r["matrix"], r["dtype"])
        if k[0] in targets and k in cuda:
            ratio = cuda[k] / r["time_us"]
            margins.append(ratio / targets[k[0]])
            rows.append(f"{k[0]} {k[1]} {100*ratio:.1f}%")
    if not margins: continue
    worst = min(margins)
    print(f"{name} {cfg:42s} worst margin {worst:.3f} (1.0 = target met) | " + ", ".join(rows), file=sys.stderr)
    if best is None or worst > best[0]: best = (worst, cfg)
if best: print(best[1])
PY
}
export -f vulkan_ratio vulkan_pick

run_vulkan() {
  local b="$NF4_VK_BUILD"
  if ((!DRY_RUN)) && [[ ! -x "$b/tests/nf4_tests" ]]; then
    echo "no $b/tests/nf4_tests: run prepare and copy $BUNDLE/"
    return 0
  fi
  export NF4_TEST_REQUIRE_VULKAN=1
  local T="$b/tests/nf4_tests" N="$b/nf4"

  phase vk-tests 180 "cuda_doctest $T -tc='vulkan:*'"
  # A context per Vulkan device at once (every device the driver lists: both GPUs of a two-GPU
  # machine), with the validation layer, as the cuda-devices phase does for every backend.
  phase vk-devices 120 "NF4_TEST_REQUIRE_DEVICES=${NF4_GPU_DEVICES:-0} cuda_doctest $T -tc='devices:*'"
  phase vk-large 120 "NF4_VULKAN_LARGE=1 cuda_doctest $T -tc='vulkan: more than 2^31*'"
  # The registry cross-check: every available backend (cpu, vulkan, cuda) against the oracle.
  phase vk-registry 180 "cuda_doctest $T -tc='every available*,grouped*,a device-pointer*,registry*'"
  if ((DRY_RUN)) || [[ -x "$b/examples/nf4_vulkan_engine_example" ]]; then
    phase vk-example 60 "NF4_VULKAN_VALIDATION=0 $b/examples/nf4_vulkan_engine_example 4096 4096"
  fi
  phase vk-verify 60 "NF4_BACKEND=vulkan $N verify tests/data/golden.safetensors 2>&1 | tail -4"
  # Same job, same machine: CUDA then Vulkan, then the ratio.
  local have_cuda=0
  if ((DRY_RUN)) || $N bench --backend cuda --shapes 64x64 --dtypes fp16 --mlp '' --iters 1 --copy-mib 1 >/dev/null 2>&1; then
    have_cuda=1
  fi
  if ((have_cuda)); then
    phase vk-bench-cuda 150 "$N bench --backend cuda --iters 100 --json \$OUT/bench_cuda.json"
  fi
  phase vk-bench 150 "NF4_VULKAN_BENCH_VERBOSE=1 $N bench --backend vulkan --iters 100 --json \$OUT/bench_vulkan.json"
  if ((have_cuda)); then
    phase vk-ratio 30 "vulkan_ratio \$OUT/bench_cuda.json \$OUT/bench_vulkan.json"
  fi
  if [[ -n "${NF4_VK_SWEEP:-}" ]]; then
    # Short runs of the three target shapes per configuration, then the full bench again with
    # the configuration whose worst margin over the targets is best, next to CUDA's.
    local i=0 cfg
    IFS=';' read -ra cfgs <<<"$NF4_VK_SWEEP"
    : >"$LOGDIR/sweep-configs.txt"
    for cfg in "${cfgs[@]}"; do
      echo "sweep-$i $cfg" >>"$LOGDIR/sweep-configs.txt"
      phase "vk-sweep-$i" 60 "NF4_VULKAN_TUNE='$cfg' $N bench --backend vulkan --shapes 2048x8192,4096x14336,8192x28672 --mlp '' --iters 40 --json $LOGDIR/sweep-$i.json | tail -7; echo 'RESULT: $cfg'"
      i=$((i + 1))
    done
    if ((have_cuda)) && [[ -f "$OUT/bench_cuda.json" ]]; then
      local best
      best="$(vulkan_pick "$OUT/bench_cuda.json" "$LOGDIR/sweep-configs.txt" 2>"$LOGDIR/sweep-pick.txt")"
      cat "$LOGDIR/sweep-pick.txt"
      if [[ -n "$best" ]]; then
        phase vk-bench-best 150 "NF4_VULKAN_TUNE='$best' $N bench --backend vulkan --iters 100 --json \$OUT/bench_vulkan_best.json; echo 'RESULT: $best'"
        phase vk-bench-cuda2 150 "$N bench --backend cuda --iters 100 --json \$OUT/bench_cuda2.json"
        phase vk-ratio-best 30 "vulkan_ratio \$OUT/bench_cuda2.json \$OUT/bench_vulkan_best.json"
      fi
    fi
  fi
}

# ==== [vulkan_tune] ===========================================================================
# The Vulkan tuning sweep next to CUDA, with the correctness proof of the configuration it picks
# (lab/gpu_vulkan_tune.sh runs this section alone). Its own build, NF4_VK_TUNE_BUILD (default
# build-vkperf: Release, Vulkan ON, CUDA NF4_VK_TUNE_CUDA=ON for sm_90 only). In this order:
#   1. `nf4 bench` on the reference backend (CUDA), then on Vulkan with its default configuration;
#   2. stage A: the direct kernel (table=000) at CUDA's geometry (wg=128, units=4) with the
#      non-temporal hint on loads / stores / both, the 16-entry value table, and without the hardware
#      fp16 conversion; stage B: geometries x kernels with stage A's best hint and table choice.
#      Each configuration is a short `nf4 bench --backend vulkan` on NF4_VK_TUNE_SHAPES (default
#      2048x8192,4096x14336,8192x28672) with NF4_VK_TUNE_SHORT (default "--iters 30 --copy-mib 64");
#   3. the configuration with the best worst margin over the targets (vulkan_pick): the Vulkan
#      suite (validation layer on) with it as the default, the registry cross-check, nf4 verify;
#   4. the full bench with it (NF4_VK_TUNE_FULL, default "--iters 100"), then the reference again.
# $OUT gets bench_tune_ref*.json, bench_vulkan_default.json, bench_vulkan_best.json and
# vulkan_tune_pick.txt (every configuration's margins).
# NF4_VK_TUNE_LOCAL=1 rehearses it without a GPU (lavapipe, the CPU backend as the reference):
#   NF4_VK_TUNE_LOCAL=1 NF4_VK_TUNE_CUDA=OFF NF4_VK_TUNE_SHAPES=2048x8192 NF4_VK_TUNE_SHORT="--iters 2 --copy-mib 8" \
#     NF4_VK_TUNE_FULL="--shapes 2048x8192 --mlp '' --iters 3 --copy-mib 8" SECTIONS=vulkan_tune lab/gpu_check.sh all
NF4_VK_TUNE_BUILD="${NF4_VK_TUNE_BUILD:-build-vkperf}"

prepare_vulkan_tune() {
  local b="$NF4_VK_TUNE_BUILD"
  PATH="$CUDA_HOME/bin:$PATH" cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_VULKAN=ON \
    -DNF4_CUDA="${NF4_VK_TUNE_CUDA:-ON}" -DNF4_CUDA_ARCHITECTURES=90 || return 1
  PATH="$CUDA_HOME/bin:$PATH" ninja -C "$b" -j"$JOBS" nf4 nf4_tests || return 1
  copy_shared_libs "$b/bundle-lib" "$b/tests/nf4_tests" "$b/nf4"
  pack_validation_layer "$b/bundle-vk" || return 1
  BUNDLE_DIRS+=("$b")
}

run_vulkan_tune() {
  local b="$NF4_VK_TUNE_BUILD" ref=cuda
  [[ "${NF4_VK_TUNE_LOCAL:-0}" != 0 ]] && ref=cpu
  if ((!DRY_RUN)) && [[ ! -x "$b/tests/nf4_tests" ]]; then
    echo "no $b/tests/nf4_tests: run prepare and copy $BUNDLE/"
    return 0
  fi
  export NF4_TEST_REQUIRE_VULKAN=1
  local N="$b/nf4" T="$b/tests/nf4_tests" full="${NF4_VK_TUNE_FULL:---iters 100}"
  local short="bench --backend vulkan --shapes ${NF4_VK_TUNE_SHAPES:-2048x8192,4096x14336,8192x28672} --mlp '' ${NF4_VK_TUNE_SHORT:---iters 30 --copy-mib 64}"
  local configs="$LOGDIR/vkt-configs.txt" picks="$OUT/vulkan_tune_pick.txt"
  : >"$configs"
  : >"$picks"

  phase vkt-ref 60 "$N bench --backend $ref $full --json $OUT/bench_tune_ref.json"
  phase vkt-default 60 "NF4_VULKAN_BENCH_VERBOSE=1 $N bench --backend vulkan $full --json $OUT/bench_vulkan_default.json"
  local i=0 cfg
  for cfg in "table=000,wg=128,units=4,nt=0,pair=0" "table=000,wg=128,units=4,nt=1,pair=0" "table=000,wg=128,units=4,nt=2,pair=0" \
    "table=000,wg=128,units=4,nt=3,pair=0" "table=000,wg=128,units=4,nt=0,pair=1" "table=000,wg=128,units=4,nt=0,pair=0,f16hw=0"; do
    echo "vkt-A$i $cfg" >>"$configs"
    phase "vkt-A$i" 40 "NF4_VULKAN_TUNE='$cfg' $N $short --json $LOGDIR/vkt-A$i.json | tail -6; echo 'RESULT: $cfg'"
    i=$((i + 1))
  done
  # Stage A's best hint and table choice (the fp16-conversion A/B, A5, is not a candidate).
  local best_a="" nt pair=1
  ((DRY_RUN)) || best_a="$(vulkan_pick "$OUT/bench_tune_ref.json" <(grep -E '^vkt-A[0-4] ' "$configs") 2>>"$picks")"
  nt="$(sed -n 's/.*nt=\([0-3]\).*/\1/p' <<<"$best_a")"
  nt="${nt:-0}"
  [[ "$best_a" == *pair=0* ]] && pair=0
  echo "stage A: $best_a -> nt=$nt pair=$pair" | tee -a "$picks"
  i=0
  for cfg in "table=000,wg=64,units=2" "table=000,wg=64,units=4" "table=000,wg=128,units=2" "table=000,wg=128,units=8" \
    "table=000,wg=256,units=2" "table=000,wg=256,units=4" "table=000,wg=64,units=8" "table=000,wg=512,units=2" \
    "table=010,wg=128,units=4" "table=110,wg=128,units=2"; do
    cfg="$cfg,nt=$nt,pair=$pair"
    echo "vkt-B$i $cfg" >>"$configs"
    phase "vkt-B$i" 40 "NF4_VULKAN_TUNE='$cfg' $N $short --json $LOGDIR/vkt-B$i.json | tail -6; echo 'RESULT: $cfg'"
    i=$((i + 1))
  done
  local best="<best>"
  ((DRY_RUN)) || best="$(vulkan_pick "$OUT/bench_tune_ref.json" "$configs" 2>>"$picks")"
  echo "best: $best" | tee -a "$picks"
  if [[ -n "$best" ]]; then
    export NF4_VULKAN_TUNE="$best"
    # The proof on this driver, with the chosen configuration as the default.
    phase vkt-suite 90 "NF4_VULKAN_BENCH_VERBOSE=1 cuda_doctest $T -tc='vulkan:*' -tce='*2^31*'"
    phase vkt-registry 90 "cuda_doctest $T -tc='every available*,grouped*,a device-pointer*,registry*'"
    phase vkt-verify 30 "NF4_BACKEND=vulkan $N verify tests/data/golden.safetensors 2>&1 | tail -4"
    phase vkt-best 60 "NF4_VULKAN_BENCH_VERBOSE=1 $N bench --backend vulkan $full --json $OUT/bench_vulkan_best.json; echo 'RESULT: $best'"
    unset NF4_VULKAN_TUNE
  fi
  phase vkt-ref2 60 "$N bench --backend $ref $full --json $OUT/bench_tune_ref2.json"
  if ((DRY_RUN)) || [[ -f "$OUT/bench_tune_ref.json" && -f "$OUT/bench_vulkan_default.json" ]]; then
    phase vkt-ratio-default 10 "vulkan_ratio $OUT/bench_tune_ref.json $OUT/bench_vulkan_default.json"
  fi
  if ((DRY_RUN)) || [[ -f "$OUT/bench_tune_ref2.json" && -f "$OUT/bench_vulkan_best.json" ]]; then
    phase vkt-ratio-best 10 "vulkan_ratio $OUT/bench_tune_ref2.json $OUT/bench_vulkan_best.json"
  fi
}

# ==== [faults] =================================================================================
# The fault cases that need a GPU (tests/test_faults_resources.cpp): a tensor larger than the CUDA device's
# memory (plain cudaMalloc, never managed memory) and a tensor of more than 2^31 elements on every
# available backend. Uses build-gpu from the [cuda] section.
#
# Then the C API's hostile descriptions on the GPU: the seed corpora and regression inputs of the
# C-API fuzz targets (fuzz_capi, fuzz_gemv; build-gpu/tests/fuzz/*_replay) replayed through the
# cuda backend under compute-sanitizer's memcheck and through the vulkan backend with the Khronos
# validation layer (tests/fuzz/fuzz_backend.h): every status the validation's, as on the cpu,
# nothing written by a refused call, the oracle's bits from an accepted one; 0 sanitizer errors and
# 0 validation messages. NF4_FUZZ_BUILD (default build-gpu) names the build that holds them;
# NF4_FUZZ_INPUTS, a folder with capi/ and gemv/ (a campaign's build-fuzz/fuzz-work), adds the
# inputs a fuzzing run generated. (memcheck without its leak check: a target's context lives until
# the process exits, as a fuzzer's must.)
fuzz_gpu_replay() {
  local backend="$1" dir="${NF4_FUZZ_BUILD:-build-gpu}/tests/fuzz" target rc status=0 log
  local san="${SAN:-$(command -v compute-sanitizer || echo "$CUDA_HOME/compute-sanitizer/compute-sanitizer")}"
  for target in capi gemv; do
    local inputs=("tests/fuzz/corpus/$target")
    [[ -d "tests/fuzz/regressions/$target" ]] && inputs+=("tests/fuzz/regressions/$target")
    [[ -n "${NF4_FUZZ_INPUTS:-}" && -d "$NF4_FUZZ_INPUTS/$target" ]] && inputs+=("$NF4_FUZZ_INPUTS/$target")
    local cmd=(env "NF4_FUZZ_BACKEND=$backend" NF4_FUZZ_STATS=1 "$dir/fuzz_${target}_replay" "${inputs[@]}")
    log="$LOGDIR/fuzz-$backend-$target.txt"
    if [[ "$backend" == cuda ]]; then
      "$san" --tool memcheck --error-exitcode 3 "${cmd[@]}" >"$log" 2>&1
    else
      NF4_VULKAN_VALIDATION=1 "${cmd[@]}" >"$log" 2>&1
    fi
    rc=$?
    grep -a -E 'fuzz target backend|replayed|paths:|ERROR SUMMARY|LEAK SUMMARY|FUZZ_ASSERT|vulkan validation' "$log" | tail -8
    if [[ "$backend" != cuda ]] && grep -a -q 'vulkan validation' "$log"; then
      echo "the validation layer reported messages ($log)"
      rc=1
    fi
    ((rc == 0)) || status=1
    echo "$target: exit $rc"
  done
  echo "RESULT: $backend: capi $(grep -a -c '^replay ' "$LOGDIR/fuzz-$backend-capi.txt") + gemv $(grep -a -c '^replay ' \
    "$LOGDIR/fuzz-$backend-gemv.txt") inputs, exit $status $(grep -a -h 'ERROR SUMMARY' "$LOGDIR"/fuzz-"$backend"-*.txt | tr -s ' ' | paste -sd, -)"
  return $status
}
export -f fuzz_gpu_replay

run_faults() {
  phase faults-gpu 300 "NF4_TEST_DEVICE_OOM=1 NF4_TEST_LARGE=1 cuda_doctest build-gpu/tests/nf4_tests -tc='*NF4_TEST_DEVICE_OOM*,*NF4_TEST_LARGE*'"
  phase fuzz-gpu-cuda 240 "fuzz_gpu_replay cuda"
  phase fuzz-gpu-vulkan 180 "fuzz_gpu_replay vulkan"
}

# ==== [torch] ==================================================================================
# The PyTorch operator: the GPU machine builds the package from source with pip, runs its tests,
# the peer bench and the Unsloth workload (lab/gpu_torch_bench.sh, its variables; results
# under $OUT/torch).
run_torch() { phase torch 540 "OUT=\$OUT/torch NF4_PYTHON=\$NF4_PYTHON lab/gpu_torch_bench.sh; echo \"RESULT: \$(tail -1 \$OUT/torch/log.txt)\""; }

# setup_build_tools: NF4_BUILD_DEBS unpacked into a private prefix and put on the search paths.
setup_build_tools() {
  local d prefix="$NF4_GPU_RUNTIME/build-tools" libs="" found=""
  for d in ${NF4_BUILD_DEBS:-}; do
    compgen -G "$d/*.deb" >/dev/null || continue
    [[ -z "$found" ]] && rm -rf "$prefix"
    found=1
    libs+="$(unpack_debs "$d" "$prefix")"$'\n' || return 1
  done
  [[ -n "$found" ]] || return 0
  export PATH="$prefix/usr/bin:$PATH"
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  libs="$(printf '%s' "$libs" | sed '/^$/d' | sort -u | paste -sd: -)"
  [[ -n "$libs" ]] && export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "build tools from ${NF4_BUILD_DEBS}: unpacked into $prefix ($(command -v glslc || echo 'no glslc'))"
}

# ==== main =====================================================================================
prepare_all() {
  setup_build_tools || return 1
  local s
  for s in $SECTIONS; do
    if declare -F "prepare_$s" >/dev/null; then "prepare_$s" || return 1; fi
  done
  ((${#BUNDLE_DIRS[@]} == 0)) || pack_bundle "$BUNDLE" "${BUNDLE_DIRS[@]}"
}

run_all() {
  setup_gpu_machine
  local s
  for s in $SECTIONS; do
    if declare -F "run_$s" >/dev/null; then "run_$s"; fi
  done
  finish
}

main() {
  local mode="${1:-run}"
  [[ "${2:-}" == --dry-run ]] && DRY_RUN=1
  case "$mode" in
    prepare) prepare_all || exit 1 ;;
    run) run_all ;;
    all) prepare_all && run_all ;;
    *)
      echo "usage: lab/gpu_check.sh prepare | run [--dry-run] | all   (configuration: see the header)" >&2
      exit 2
      ;;
  esac
}
[[ "${NF4_GPU_LIBRARY:-0}" == 1 ]] || main "$@"
