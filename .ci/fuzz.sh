#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Short fuzzing job (docs/RELIABILITY.md): builds the project with clang and -DNF4_FUZZ=ON (the
# libFuzzer targets of tests/fuzz with ASan + UBSan, the library coverage-instrumented; everything
# else with its default options), replays the seed corpus and
# the regression inputs, then fuzzes each target for FUZZ_SECONDS (default 25), as many targets at
# once as there are cores. Any crash, sanitizer report, broken invariant, leak or input slower
# than 10 s fails the job; the input is left under $BUILD_DIR/fuzz-artifacts/ (add it to
# tests/fuzz/regressions/<target>/ once fixed). The long run is tools/fuzz_long.sh.
#   BUILD_DIR     build directory (default build-fuzz)
#   FUZZ_SECONDS  fuzzing time per target (default 25)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/build-env.sh  # ccache
build="${BUILD_DIR:-build-fuzz}"
seconds="${FUZZ_SECONDS:-25}"
targets=(safetensors_header safetensors_file quant_state capi model_json gemv)
start=$(date +%s)

# The default options otherwise (tests, tools, examples, the shared library, every backend found):
# a fuzz build must build as a developer configures it, not only in a reduced set.
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF4_FUZZ=ON >/dev/null
cmake --build "$build" -j"$(nproc)"

echo "== fuzz: replaying the seed corpus and the regression inputs"
ctest --test-dir "$build/tests/fuzz" --output-on-failure --no-tests=error

mkdir -p "$build/fuzz-artifacts"
# One target per core at a time: on a 2-core runner the six targets take three rounds of
# FUZZ_SECONDS instead of six.
fuzz_target() {
  local t=$1 work="$build/fuzz-work/$1" log="$build/fuzz-$1.log"  # new inputs go to work, never into the committed corpus
  mkdir -p "$work"
  local inputs=(tests/fuzz/corpus/"$t") dict=()
  [ -d tests/fuzz/regressions/"$t" ] && inputs+=(tests/fuzz/regressions/"$t")
  case "$t" in capi | gemv) ;; *) dict=(-dict=tests/fuzz/safetensors.dict) ;; esac  # the C-API targets read no text
  if "$build/tests/fuzz/fuzz_$t" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" "$work" "${inputs[@]}" >"$log" 2>&1; then
    echo ok >"$build/fuzz-$t.status"
  else
    echo failed >"$build/fuzz-$t.status"
  fi
}
cores=$(nproc)
for t in "${targets[@]}"; do
  rm -f "$build/fuzz-$t.status"
  while [ "$(jobs -rp | wc -l)" -ge "$cores" ]; do wait -n || true; done
  fuzz_target "$t" &
done
wait
failed=0
for t in "${targets[@]}"; do
  log="$build/fuzz-$t.log"
  if [ "$(cat "$build/fuzz-$t.status" 2>/dev/null)" = ok ]; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz_$t: ${execs:-?} executions in ${seconds} s, ${cov}, 0 crashes"
  else
    failed=1
    echo "fuzz_$t: FAILED; the end of $log:" >&2
    grep -v '^#' "$log" | tail -40 >&2
    ls "$build/fuzz-artifacts/" >&2
  fi
done
# What the fuzzers generated, read by nf4 and by Python's json: an input nf4 accepts but reads
# otherwise is a finding too (docs/RELIABILITY.md, the JSON differential).
echo "== fuzz: the JSON differential over the seeds and the generated inputs"
if ! python3 tests/fuzz/json_differential.py --oracle "$build/tests/fuzz/json_oracle" --generated \
    --model-json tests/fuzz/corpus/model_json --model-json "$build/fuzz-work/model_json" \
    --header tests/fuzz/corpus/safetensors_header --header "$build/fuzz-work/safetensors_header" >"$build/fuzz-differential.log" 2>&1; then
  failed=1
  grep -v '^FINDING' "$build/fuzz-differential.log" >&2 || true
  grep '^FINDING' "$build/fuzz-differential.log" | head -40 >&2
fi
tail -3 "$build/fuzz-differential.log"
echo "fuzz: $([ $failed -eq 0 ] && echo "all targets clean" || echo FAILED) ($(( $(date +%s) - start )) s)"
exit $failed
