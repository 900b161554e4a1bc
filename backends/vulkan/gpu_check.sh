# SPDX-License-Identifier: MIT
# The [vulkan] section of tools/gpu_check.sh (sourced there; uses its phase/cuda_doctest helpers).
#
#   NF4_VK_BUILD=build-vkgpu SECTIONS=vulkan tools/gpu_check.sh prepare    # here
#   run(command="NF4_VK_BUILD=build-vkgpu SECTIONS=vulkan tools/gpu_check.sh run",
#       carry=["build-vkgpu", ".gl"])
#
# NF4_VK_BUILD (default build-gpu, the CUDA section's build, which has Vulkan AUTO on): the build
# the Vulkan phases run. When it is not build-gpu, prepare builds it (CUDA on for sm_90 only when
# nvcc is there, so `nf4 bench --backend cuda` runs in the same call, for the same-run ratio).
# prepare also packs Debian's Khronos validation layer (the GPU machine has none) and the shared
# libraries the binaries need into $NF4_VK_BUILD/carry-vk.
# NF4_VK_SWEEP="cfg;cfg;..." adds one short `nf4 bench --backend vulkan` per NF4_VULKAN_TUNE value.
# The tuning sweep with its own correctness proof, in one call: backends/vulkan/gpu_tune.sh.
NF4_VK_BUILD="${NF4_VK_BUILD:-build-gpu}"

prepare_vulkan() {
  local b="$NF4_VK_BUILD"
  if [[ "$b" != build-gpu ]]; then
    local cuda=OFF
    [[ -x /usr/local/cuda/bin/nvcc || -n "$(command -v nvcc)" ]] && cuda=ON
    PATH="$PATH:/usr/local/cuda/bin" cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_VULKAN=ON -DNF4_CUDA=$cuda \
      -DNF4_CUDA_ARCHITECTURES=90 || return 1
    PATH="$PATH:/usr/local/cuda/bin" ninja -C "$b" -j"$JOBS" nf4 nf4_tests nf4_vulkan_engine_example || return 1
  fi
  mkdir -p "$b/carry-vk"
  echo "$ROOT" >"$b/carry-vk/SOURCE_DIR"
  tar -C /usr -cJf "$b/carry-vk/validation-layer.tar.xz" lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so \
    share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json || return 1
  for lib in $(ldd "$b/tests/nf4_tests" "$b/nf4" 2>/dev/null | awk '/=>/ {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) ;;
      *) cp -L "$lib" "$b/carry-vk/" ;;
    esac
  done
  [[ -d .gl ]] || echo "warning: .gl/ (the Vulkan loader packages, DEVICE.md) is missing" >&2
  du -sh "$b" .gl 2>/dev/null
  echo "carry: $b .gl"
}

# Throughput ratios Vulkan / CUDA per (matrix, dtype) from the two bench reports.
vulkan_ratio() {
  python3 - "$1" "$2" <<'PY'
import json, sys
c, v = (json.load(open(p)) for p in sys.argv[1:3])
cu = {(r["matrix"], r["dtype"]): r for r in c["results"]}
print(f"copy ceiling: cuda {c['copy_ceiling_gbps']:.0f} GB/s, vulkan {v['copy_ceiling_gbps']:.0f} GB/s")
worst = []
for r in v["results"]:
    k = (r["matrix"], r["dtype"])
    if k not in cu: continue
    ratio = cu[k]["time_us"] / r["time_us"]
    print(f"{k[0]:24s} {k[1]:5s} cuda {cu[k]['time_us']:9.2f} us  vulkan {r['time_us']:9.2f} us  "
          f"vulkan/cuda throughput {100*ratio:5.1f}%  (vulkan {r['pct_of_copy']:.1f}% of its copy)")
    worst.append((ratio, k))
if worst:
    m = min(worst)
    print(f"RESULT: vulkan/cuda worst {100*m[0]:.1f}% at {m[1][0]} {m[1][1]}")
PY
}
# The sweep configuration with the best worst-case margin over the targets; prints it last.
vulkan_pick() {
  python3 - "$1" "$2" <<'PY'
import json, sys, os
cuda = {(r["matrix"], r["dtype"]): r["time_us"] for r in json.load(open(sys.argv[1]))["results"]}
d = sys.argv[2]
cfgs = dict(l.split(" ", 1) for l in open(os.path.join(d, "sweep-configs.txt")).read().splitlines() if l)
targets = {"2048x8192": 0.80, "4096x14336": 0.90, "8192x28672": 0.90}
best = None
for i, cfg in cfgs.items():
    p = os.path.join(d, f"sweep-{i}.json")
    if not os.path.exists(p): continue
    margins = []
    for r in json.load(open(p))["results"]:
        k = (r["matrix"], r["dtype"])
        if k[0] in targets and k in cuda:
            margins.append(cuda[k] / r["time_us"] / targets[k[0]])
    if not margins: continue
    worst = min(margins)
    print(f"{cfg:32s} worst margin {worst:.3f} (1.0 = target met)")
    if best is None or worst > best[0]: best = (worst, cfg)
if best: print(best[1])
PY
}
export -f vulkan_ratio vulkan_pick

run_vulkan() {
  local b="$NF4_VK_BUILD"
  [[ -x "$b/tests/nf4_tests" ]] || { echo "no $b/tests/nf4_tests: run prepare and carry $b"; return 0; }
  export LD_LIBRARY_PATH="$ROOT/$b/carry-vk${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local src
  src="$(cat "$b/carry-vk/SOURCE_DIR" 2>/dev/null || true)"
  if [[ -n "$src" && "$src" != "$ROOT" && ! -e "$src" ]]; then mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"; fi
  # The Vulkan loader (not installed there) and the NVIDIA ICD (DEVICE.md).
  if [[ -d .gl ]]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export VK_ICD_FILENAMES=$VK_DRIVER_FILES
  # The validation layer for the tests (any message fails them).
  mkdir -p /tmp/nf4-vk-layer && tar -C /tmp/nf4-vk-layer -xJf "$b/carry-vk/validation-layer.tar.xz"
  export VK_LAYER_PATH=/tmp/nf4-vk-layer/share/vulkan/explicit_layer.d
  export LD_LIBRARY_PATH="/tmp/nf4-vk-layer/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
  export NF4_TEST_REQUIRE_VULKAN=1
  local T="$b/tests/nf4_tests" N="$b/nf4"

  phase vk-tests 180 "cuda_doctest $T -tc='vulkan:*'"
  phase vk-large 120 "NF4_VULKAN_LARGE=1 cuda_doctest $T -tc='vulkan: more than 2^31*'"
  # The registry cross-check: every available backend (cpu, vulkan, cuda) against the oracle.
  phase vk-registry 180 "cuda_doctest $T -tc='every available*,grouped*,a device-pointer*,registry*'"
  phase vk-example 60 "NF4_VULKAN_VALIDATION=0 $b/examples/nf4_vulkan_engine_example 4096 4096"
  phase vk-verify 60 "NF4_BACKEND=vulkan $N verify tests/data/golden.safetensors 2>&1 | tail -4"
  # Same run, same machine: CUDA then Vulkan, then the ratio.
  local have_cuda=0
  $N bench --backend cuda --shapes 64x64 --dtypes fp16 --mlp '' --iters 1 --copy-mib 1 >/dev/null 2>&1 && have_cuda=1
  if ((have_cuda)); then
    phase vk-bench-cuda 150 "$N bench --backend cuda --iters 100 --json \$OUT/bench_cuda.json"
  fi
  phase vk-bench 150 "NF4_VULKAN_BENCH_VERBOSE=1 $N bench --backend vulkan --iters 100 --json \$OUT/bench_vulkan.json"
  if ((have_cuda)); then
    phase vk-ratio 30 "vulkan_ratio \$OUT/bench_cuda.json \$OUT/bench_vulkan.json"
  fi
  if [[ -n "${NF4_VK_SWEEP:-}" ]]; then
    # Short runs of the three target shapes per configuration, then the full bench again with
    # the configuration whose worst margin over the targets (vulkan/cuda throughput: 80% at
    # 2048x8192, 90% at 4096x14336 and 8192x28672, fp16 and bf16) is best, next to CUDA's.
    local i=0 cfg
    IFS=';' read -ra cfgs <<<"$NF4_VK_SWEEP"
    : >"$LOGDIR/sweep-configs.txt"
    for cfg in "${cfgs[@]}"; do
      echo "$i $cfg" >>"$LOGDIR/sweep-configs.txt"
      phase "vk-sweep-$i" 60 "NF4_VULKAN_TUNE='$cfg' $N bench --backend vulkan --shapes 2048x8192,4096x14336,8192x28672 --mlp '' --iters 40 --json $LOGDIR/sweep-$i.json | tail -7; echo 'RESULT: $cfg'"
      i=$((i + 1))
    done
    if ((have_cuda)); then
      local best
      best="$(vulkan_pick "$OUT/bench_cuda.json" "$LOGDIR" | tee "$LOGDIR/sweep-pick.txt" | tail -1)"
      cat "$LOGDIR/sweep-pick.txt"
      if [[ -n "$best" ]]; then
        phase vk-bench-best 150 "NF4_VULKAN_TUNE='$best' $N bench --backend vulkan --iters 100 --json \$OUT/bench_vulkan_best.json; echo 'RESULT: $best'"
        phase vk-bench-cuda2 150 "$N bench --backend cuda --iters 100 --json \$OUT/bench_cuda2.json"
        phase vk-ratio-best 30 "vulkan_ratio \$OUT/bench_cuda2.json \$OUT/bench_vulkan_best.json"
      fi
    fi
  fi
}
