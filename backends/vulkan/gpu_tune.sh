#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# backends/vulkan/gpu_tune.sh: the Vulkan tuning sweep next to CUDA on the GPU machine, in one
# call of the device tool (DEVICE.md), with the correctness proof of the configuration it picks.
#
#   backends/vulkan/gpu_tune.sh prepare      # here: builds $B (Release, Vulkan ON, CUDA ON for
#                                            # sm_90) and packs what runs there into $B-carry
#   run(kind="nvidia-h200", command="backends/vulkan/gpu_tune.sh run", carry=["build-vkperf-carry", ".gl"])
#
# run, in this order, each step under a time limit inside NF4_GPU_DEADLINE (default 400 s):
#   1. nf4 bench --backend cuda (the reference for the ratios), then the current Vulkan default;
#      both runners time back-to-back batches by default (NF4_BENCH_TIMING; the run of 2026-11-22
#      predates the Vulkan batch timing: its Vulkan rows were timed per dispatch);
#   2. stage A: the direct kernel (table=000) at CUDA's geometry (wg=128, units=4) with the
#      Nontemporal hint on loads / stores / both, the 16-entry value table, and without the
#      hardware fp16 conversion (A/B); stage B: geometries x kernels with stage A's best hints;
#      every configuration is `nf4 bench --backend vulkan` on the three target shapes;
#   3. the configuration with the best worst margin over the targets (Vulkan / CUDA throughput:
#      80% at 2048x8192, 90% at 4096x14336 and 8192x28672, fp16 and bf16): the Vulkan suite
#      (validation layer on, NF4_VULKAN_TUNE set to it), the registry cross-check and nf4 verify;
#   4. the full bench with it, and CUDA's again, for docs/PERFORMANCE.md.
# $OUT gets summary.txt, the bench JSON files and logs.tgz.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
B="${NF4_VK_BUILD:-build-vkperf}"
C="$B-carry"
SHAPES="${NF4_VK_TUNE_SHAPES:-2048x8192,4096x14336,8192x28672}"
# Dry run on the development machine (lavapipe, the CPU backend as reference, small work):
#   NF4_VK_TUNE_LOCAL=1 NF4_VK_TUNE_SHAPES=2048x8192 NF4_VK_TUNE_FULL="--shapes 2048x8192 --mlp '' --iters 3" \
#   OUT=/tmp/vk-tune-out backends/vulkan/gpu_tune.sh run
LOCAL="${NF4_VK_TUNE_LOCAL:-0}"
REF=cuda
((LOCAL)) && REF=cpu
FULL="${NF4_VK_TUNE_FULL:---iters 100}"

prepare() {
  PATH="$PATH:/usr/local/cuda/bin" cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_VULKAN=ON -DNF4_CUDA=ON \
    -DNF4_CUDA_ARCHITECTURES=90 || return 1
  PATH="$PATH:/usr/local/cuda/bin" ninja -C "$B" -j"${JOBS:-2}" nf4 nf4_tests || return 1
  rm -rf "$C" && mkdir -p "$C/lib"
  cp "$B/nf4" "$B/tests/nf4_tests" "$C/"
  echo "$ROOT" >"$C/SOURCE_DIR"
  tar -C /usr -cJf "$C/validation-layer.tar.xz" lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so \
    share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json || return 1
  for lib in $(ldd "$B/tests/nf4_tests" "$B/nf4" 2>/dev/null | awk '/=>/ {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) ;;
      *) cp -L "$lib" "$C/lib/" ;;
    esac
  done
  xz -T"${JOBS:-2}" -6 "$C/nf4" "$C/nf4_tests"
  [[ -d .gl ]] || echo "warning: .gl/ (the Vulkan loader packages, DEVICE.md) is missing" >&2
  du -sh "$C" .gl
}

# ---- run -----------------------------------------------------------------------------------
LOGDIR=/tmp/nf4-vk-tune
START=$(date +%s)
SUMMARY=()
# step NAME LIMIT COMMAND: runs COMMAND under `timeout`, its output in $LOGDIR/NAME.log; skipped
# when less than 20 s are left before the deadline.
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((START + ${NF4_GPU_DEADLINE:-400} - $(date +%s)))
  if ((left < 20)); then
    SUMMARY+=("$(printf '%-14s %-8s %4ss  %s' "$name" SKIPPED 0 'out of time')")
    return 1
  fi
  ((limit > left - 10)) && limit=$((left - 10))
  echo "==== $name (limit ${limit}s): $*"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" bash -c "$*" >"$LOGDIR/$name.log" 2>&1
  rc=$?
  tail -n 25 "$LOGDIR/$name.log"
  local status=ok
  ((rc != 0)) && status="FAIL($rc)"
  ((rc == 124 || rc == 137)) && status=TIMEOUT
  SUMMARY+=("$(printf '%-14s %-8s %4ss  %s' "$name" "$status" $(($(date +%s) - t0)) "$(grep -a 'RESULT:' "$LOGDIR/$name.log" | tail -1 | sed 's/.*RESULT: *//')")")
  return $rc
}

# pick CUDA_JSON CFG_FILE: per configuration its worst margin over the targets; the best last.
pick() {
  python3 - "$1" "$2" "$LOGDIR" <<'PY'
import json, os, sys
cuda = {(r["matrix"], r["dtype"]): r["time_us"] for r in json.load(open(sys.argv[1]))["results"]}
targets = {"2048x8192": 0.80, "4096x14336": 0.90, "8192x28672": 0.90}
best = None
for line in open(sys.argv[2]).read().splitlines():
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
    print(f"{name} {cfg:42s} worst margin {worst:.3f} | " + ", ".join(rows), file=sys.stderr)
    if best is None or worst > best[0]: best = (worst, cfg)
if best: print(best[1])
PY
}

ratio() {
  python3 - "$1" "$2" <<'PY'
import json, sys
c, v = (json.load(open(p)) for p in sys.argv[1:3])
cu = {(r["matrix"], r["dtype"]): r for r in c["results"]}
print(f"copy ceiling: cuda {c['copy_ceiling_gbps']:.1f} GB/s, vulkan {v['copy_ceiling_gbps']:.1f} GB/s")
print("| matrix | dtype | CUDA us | Vulkan us | Vulkan % of its copy | Vulkan / CUDA throughput |")
worst = []
for r in v["results"]:
    k = (r["matrix"], r["dtype"])
    if k not in cu: continue
    x = cu[k]["time_us"] / r["time_us"]
    print(f"| {k[0]} | {k[1]} | {cu[k]['time_us']:.2f} | {r['time_us']:.2f} | {r['pct_of_copy']:.1f}% | {100*x:.1f}% |")
    worst.append((x, k))
if worst:
    m = min(worst)
    print(f"RESULT: worst vulkan/cuda {100*m[0]:.1f}% at {m[1][0]} {m[1][1]}")
PY
}
# doctest NAME ARGS...: the test binary's summary lines; its exit status.
doctest() {
  local name="$1"
  shift
  "$@" >"$LOGDIR/$name.full.txt" 2>&1
  local r=$?
  grep -a -E 'MESSAGE|ERROR|FAILED|CHECK|test cases|Status|fp16 check' "$LOGDIR/$name.full.txt" | tail -40
  echo "RESULT: exit $r, $(grep -a 'test cases' "$LOGDIR/$name.full.txt" | tail -1 | tr -s ' ')"
  return $r
}
export -f pick ratio doctest
export LOGDIR

run() {
  mkdir -p "$LOGDIR" && rm -f "$LOGDIR"/*
  OUT="${OUT:-$ROOT/vk-tune-out}"
  mkdir -p "$OUT"
  [[ -f "$C/nf4.xz" ]] && xz -dkf "$C/nf4.xz" "$C/nf4_tests.xz"
  chmod +x "$C/nf4" "$C/nf4_tests"
  export LD_LIBRARY_PATH="$ROOT/$C/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:/usr/local/cuda/lib64"
  local src
  src="$(cat "$C/SOURCE_DIR")"
  if [[ "$src" != "$ROOT" && ! -e "$src" ]]; then mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"; fi
  if ((!LOCAL)); then
    # The Vulkan loader (not installed there), the NVIDIA ICD and the validation layer (DEVICE.md).
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export VK_ICD_FILENAMES=$VK_DRIVER_FILES
    mkdir -p /tmp/nf4-vk-layer && tar -C /tmp/nf4-vk-layer -xJf "$C/validation-layer.tar.xz"
    export VK_LAYER_PATH=/tmp/nf4-vk-layer/share/vulkan/explicit_layer.d
    export LD_LIBRARY_PATH="/tmp/nf4-vk-layer/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$LOGDIR/gpu.txt"
  else
    echo "local dry run" >"$LOGDIR/gpu.txt"
  fi
  export NF4_TEST_REQUIRE_VULKAN=1
  local N="$C/nf4" T="$C/nf4_tests"

  step cuda-bench 60 "$N bench --backend $REF $FULL --json $LOGDIR/bench_cuda.json"
  step vk-default 60 "NF4_VULKAN_BENCH_VERBOSE=1 $N bench --backend vulkan $FULL --json $LOGDIR/bench_vulkan_default.json"
  local short="bench --backend vulkan --shapes $SHAPES --mlp '' --iters 30 --copy-mib 64"
  : >"$LOGDIR/configs.txt"
  local i=0 cfg
  for cfg in "table=000,wg=128,units=4,nt=0,pair=0" "table=000,wg=128,units=4,nt=1,pair=0" "table=000,wg=128,units=4,nt=2,pair=0" \
    "table=000,wg=128,units=4,nt=3,pair=0" "table=000,wg=128,units=4,nt=0,pair=1" "table=000,wg=128,units=4,nt=0,pair=0,f16hw=0"; do
    echo "A$i $cfg" >>"$LOGDIR/configs.txt"
    step "A$i" 40 "NF4_VULKAN_TUNE='$cfg' $N $short --json $LOGDIR/A$i.json | tail -6; echo 'RESULT: $cfg'"
    i=$((i + 1))
  done
  # Stage A's best hint and table choice for stage B.
  local best_a nt pair
  best_a="$(pick "$LOGDIR/bench_cuda.json" <(grep -E '^A[0-4] ' "$LOGDIR/configs.txt") 2>>"$LOGDIR/pick.txt")"
  nt="$(sed -n 's/.*nt=\([0-3]\).*/\1/p' <<<"$best_a")"
  pair=1
  [[ "$best_a" == *pair=0* ]] && pair=0
  echo "stage A: $best_a -> nt=${nt:=0} pair=$pair" | tee -a "$LOGDIR/pick.txt"
  i=0
  for cfg in "table=000,wg=64,units=2" "table=000,wg=64,units=4" "table=000,wg=128,units=2" "table=000,wg=128,units=8" \
    "table=000,wg=256,units=2" "table=000,wg=256,units=4" "table=000,wg=64,units=8" "table=000,wg=512,units=2" \
    "table=010,wg=128,units=4" "table=110,wg=128,units=2"; do
    cfg="$cfg,nt=$nt,pair=$pair"
    echo "B$i $cfg" >>"$LOGDIR/configs.txt"
    step "B$i" 40 "NF4_VULKAN_TUNE='$cfg' $N $short --json $LOGDIR/B$i.json | tail -6; echo 'RESULT: $cfg'"
    i=$((i + 1))
  done
  local best
  best="$(pick "$LOGDIR/bench_cuda.json" "$LOGDIR/configs.txt" 2>>"$LOGDIR/pick.txt")"
  cat "$LOGDIR/pick.txt"
  echo "best: $best" | tee -a "$LOGDIR/pick.txt"
  if [[ -n "$best" ]]; then
    export NF4_VULKAN_TUNE="$best"
    # The proof on NVIDIA's driver, with the chosen configuration as the default.
    step vk-suite 90 "NF4_VULKAN_BENCH_VERBOSE=1 doctest vk-suite $T -tc='vulkan:*' -tce='*2^31*'"
    step vk-registry 90 "doctest vk-registry $T -tc='every available*,grouped*,a device-pointer*,registry*'"
    step vk-verify 30 "NF4_BACKEND=vulkan $N verify tests/data/golden.safetensors 2>&1 | tail -4"
    step vk-best 60 "NF4_VULKAN_BENCH_VERBOSE=1 $N bench --backend vulkan $FULL --json $LOGDIR/bench_vulkan_best.json; echo 'RESULT: $best'"
    unset NF4_VULKAN_TUNE
  fi
  step cuda-bench2 60 "$N bench --backend $REF $FULL --json $LOGDIR/bench_cuda2.json"
  [[ -f $LOGDIR/bench_vulkan_default.json ]] && step ratio-default 10 "ratio $LOGDIR/bench_cuda.json $LOGDIR/bench_vulkan_default.json"
  [[ -f $LOGDIR/bench_vulkan_best.json && -f $LOGDIR/bench_cuda2.json ]] &&
    step ratio-best 10 "ratio $LOGDIR/bench_cuda2.json $LOGDIR/bench_vulkan_best.json"

  {
    echo "nf4 backends/vulkan/gpu_tune.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(($(date +%s) - START)) s, $(cat "$LOGDIR/gpu.txt")"
    printf '%s\n' "${SUMMARY[@]}"
    echo
    cat "$LOGDIR/pick.txt"
    for r in ratio-default ratio-best; do [[ -f $LOGDIR/$r.log ]] && { echo "== $r"; cat "$LOGDIR/$r.log"; }; done
  } >"$OUT/summary.txt"
  cp "$LOGDIR"/bench_*.json "$OUT/" 2>/dev/null
  tar -C "$LOGDIR" -czf "$OUT/logs.tgz" .
  cat "$OUT/summary.txt"
}

case "${1:-run}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
