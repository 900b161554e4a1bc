#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The long fuzzing run of docs/RELIABILITY.md section 1: every libFuzzer target of tests/fuzz to
# RUNS executions, spread over JOBS processes per target, then one line per target (executions,
# exec/s, coverage of the merged corpus, crashes). Exits 1 if any process found a crash, a leak,
# a sanitizer report, a broken invariant (FUZZ_ASSERT), an input slower than TIMEOUT seconds or
# one needing more than RSS_MB of memory; the input is kept under $OUT/<target>/artifacts/.
#
#   tools/fuzz_long.sh                 from a checkout: builds the fuzzers with clang into
#                                      BUILD_DIR (unless already built there), then runs them
#   tools/fuzz_long.sh bundle DIR      builds them and writes DIR: this script, bin/ (the six
#                                      binaries, debug info stripped), corpus/, regressions/ and
#                                      safetensors.dict, for a machine without clang
#   DIR/fuzz_long.sh                   in a bundle: runs the bundled binaries (no build)
#
# Variables (all optional):
#   RUNS         executions per target, all processes together (default 10000000)
#   JOBS         fuzzing processes per target, run at once (default: nproc)
#   TARGETS      which targets (default: "safetensors_header safetensors_file quant_state capi model_json gemv")
#   OUT          logs, grown corpus and crash inputs (default: BUILD_DIR/fuzz-long in a checkout,
#                out/ beside the script in a bundle)
#   BUILD_DIR    build directory in a checkout (default: build-fuzz-long)
#   MAX_TIME     stop each process after this many seconds even if RUNS is not reached (default:
#                no limit; for measuring rates: JOBS=1 RUNS=1000000000 MAX_TIME=60)
#   TIMEOUT      seconds one input may take (default 10); RSS_MB: memory limit per process (2048)
#   CPU_THREADS  worker threads of the cpu backend per process (NF4_CPU_THREADS, default 2: JOBS
#                processes already fill the machine; 2 still runs its multithreaded split)
#
# Each process fuzzes RUNS / JOBS inputs with its own seed; all of a target's processes share one
# corpus directory (-reload=1), so what one finds, the others build on. The seed corpus and the
# regression inputs are read, never written.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
all_targets="safetensors_header safetensors_file quant_state capi model_json gemv"
nproc_=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)

if [ -x "$here/bin/fuzz_capi" ]; then  # a bundle
  bin="$here/bin"
  data="$here"
  default_out="$here/out"
else
  root="$(cd "$here/.." && pwd)"
  data="$root/tests/fuzz"
  build="${BUILD_DIR:-build-fuzz-long}"
  case "$build" in /*) ;; *) build="$root/$build" ;; esac
  bin="$build/tests/fuzz"
  default_out="$build/fuzz-long"
  # Same flags as .ci/fuzz.sh; fmt compiled in, so that the binaries need only system libraries.
  need_build=0
  for t in $all_targets; do [ -x "$bin/fuzz_$t" ] || need_build=1; done
  if [ "${1:-}" = bundle ] || [ $need_build = 1 ]; then
    command -v clang++ >/dev/null || { echo "fuzz_long: clang++ is needed to build the fuzzers (or run a bundle)" >&2; exit 2; }
    CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF4_FUZZ=ON \
      -DNF4_FMT_HEADER_ONLY=ON -DNF4_BUILD_TESTS=OFF -DNF4_BUILD_TOOLS=OFF -DNF4_BUILD_EXAMPLES=OFF -DNF4_INSTALL=OFF \
      -DNF4_CUDA=OFF -DNF4_VULKAN=OFF >/dev/null
    cmake --build "$build" -j"$nproc_" >/dev/null
  fi
fi

if [ "${1:-}" = bundle ]; then
  dest="${2:?usage: tools/fuzz_long.sh bundle DIR}"
  rm -rf "$dest"
  mkdir -p "$dest/bin"
  for t in $all_targets; do
    # Debug info off, symbols kept: sanitizer reports still name the functions.
    strip --strip-debug -o "$dest/bin/fuzz_$t" "$bin/fuzz_$t"
  done
  cp -r "$data/corpus" "$data/regressions" "$data/safetensors.dict" "$dest/"
  cp "$here/fuzz_long.sh" "$dest/"
  # Anything but the C/C++ runtime would be missing on the machine that runs the bundle.
  if ldd "$dest"/bin/* | grep '=>' | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' ; then
    echo "fuzz_long: the binaries above need libraries beyond the C/C++ runtime" >&2
    exit 1
  fi
  echo "bundle: $dest ($(du -sh "$dest" | cut -f1)); run it with: RUNS=10000000 JOBS=\$(nproc) $dest/fuzz_long.sh"
  exit 0
fi

runs="${RUNS:-10000000}"
jobs="${JOBS:-$nproc_}"
targets="${TARGETS:-$all_targets}"
out="${OUT:-$default_out}"
timeout="${TIMEOUT:-10}"
rss="${RSS_MB:-2048}"
limit=()
[ -n "${MAX_TIME:-}" ] && limit=(-max_total_time="$MAX_TIME")
export NF4_CPU_THREADS="${CPU_THREADS:-2}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
per=$(( (runs + jobs - 1) / jobs ))

summary="$out/summary.txt"
any_crash=0
printf '%-26s %12s %9s %9s %10s %8s %8s\n' target executions "wall s" exec/s "cov edges" features crashes | tee "$summary"
failed=0
for t in $targets; do
  dir="$out/$t"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/logs"
  inputs=("$data/corpus/$t")
  [ -d "$data/regressions/$t" ] && inputs+=("$data/regressions/$t")
  dict=()
  case "$t" in capi | gemv) ;; *) dict=(-dict="$data/safetensors.dict") ;; esac
  start=$(date +%s)
  pids=()
  for ((j = 0; j < jobs; j++)); do
    "$bin/fuzz_$t" "${dict[@]}" "${limit[@]}" -runs="$per" -seed=$((1000 + j)) -reload=1 -timeout="$timeout" -rss_limit_mb="$rss" \
      -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "$dir/corpus" "${inputs[@]}" >"$dir/logs/job-$j.log" 2>&1 &
    pids+=($!)
  done
  bad=0
  for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
  wall=$(( $(date +%s) - start ))
  execs=$(cat "$dir"/logs/job-*.log | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s += $1} END {print s + 0}')
  artifacts=$(find "$dir/artifacts" -type f | wc -l)
  # A process stopped by a signal (Ctrl-C, kill) says so in its log: an incomplete run, not a crash.
  interrupted=$( (grep -l 'libFuzzer: run interrupted' "$dir"/logs/job-*.log 2>/dev/null || true) | wc -l)
  failures=$(( bad - interrupted ))
  crashes=$(( artifacts > failures ? artifacts : failures ))
  # Coverage of everything the processes found together: the merged corpus replayed once.
  cov=$("$bin/fuzz_$t" -runs=0 "$dir/corpus" "${inputs[@]}" 2>&1 | grep -o 'INITED cov: [0-9]* ft: [0-9]*' | tail -1 || true)
  edges=$(echo "$cov" | awk '{print $3}')
  ft=$(echo "$cov" | awk '{print $5}')
  printf '%-26s %12s %9s %9s %10s %8s %8s\n' "fuzz_$t" "$execs" "$wall" $(( execs / (wall > 0 ? wall : 1) )) "${edges:-?}" "${ft:-?}" \
    "$crashes" | tee -a "$summary"
  if [ "$interrupted" -gt 0 ]; then
    failed=1
    echo "fuzz_long: $interrupted process(es) of fuzz_$t were interrupted before RUNS: the count above is incomplete" >&2
  fi
  if [ "$crashes" -gt 0 ]; then
    failed=1
    any_crash=1
    for f in "$dir"/logs/job-*.log; do
      grep -q -E 'ERROR: |FUZZ_ASSERT|Sanitizer|==[0-9]+==' "$f" && { echo "--- $f" >&2; grep -v '^#' "$f" | tail -30 >&2; }
    done
    ls "$dir/artifacts" >&2
  fi
done
if [ $any_crash = 1 ]; then result="CRASHES FOUND (inputs under $out/*/artifacts/)"
elif [ $failed = 1 ]; then result="0 crashes, but interrupted before RUNS"
else result="0 crashes"; fi
echo "fuzz_long: $result; summary in $summary"
exit $failed
