#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ThreadSanitizer job (docs/RELIABILITY.md): builds the library and the doctest suite with
# -DNF4_TSAN=ON (the default compiler, gcc here) and runs the concurrency stress test
# (tests/test_stress.cpp: 8 threads, each with its own context, then all sharing one) on the cpu
# backend and, where Vulkan is found, on lavapipe. Exits non-zero on any data race
# (halt_on_error) or test failure.
#   BUILD_DIR      build directory (default build-tsan)
#   TSAN_BACKENDS  backends to stress (default "cpu,vulkan"; "cpu" skips the Vulkan build)
#   TSAN_TIMEOUT_S seconds before a hung run is stopped, with its threads' stacks (default 900)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/build-env.sh  # ccache
build="${BUILD_DIR:-build-tsan}"
backends="${TSAN_BACKENDS:-cpu,vulkan}"
vulkan=OFF
[[ "$backends" == *vulkan* ]] && vulkan=AUTO
start=$(date +%s)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF4_TSAN=ON \
  -DNF4_CUDA=OFF -DNF4_VULKAN="$vulkan" -DNF4_BUILD_TESTS=ON -DNF4_BUILD_TOOLS=OFF -DNF4_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target nf4_tests

# exitcode, not abort_on_error: TSan aborting inside doctest's SIGABRT handler deadlocks on TSan's
# own registry lock, and a report would then hang the job instead of failing it.
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$PWD/.ci/tsan.supp ${TSAN_OPTIONS:-}"
export NF4_STRESS_BACKENDS="$backends"
log="$build/tsan-stress.log"
limit="${TSAN_TIMEOUT_S:-900}"
status=0
"$build/tests/nf4_tests" -tc='stress*' -s >"$log" 2>&1 &
pid=$!
# A hang fails the job within $limit seconds, with every thread's stack in the log.
( for ((waited = 0; waited < limit; waited += 2)); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 2; done
  echo "tsan: still running after $limit s; the threads' stacks:" >>"$log"
  command -v gdb >/dev/null && timeout 120 gdb -p "$pid" -batch -ex "thread apply all bt 20" >>"$log" 2>&1
  kill -9 "$pid" 2>/dev/null ) </dev/null >/dev/null 2>&1 &
watchdog=$!
wait "$pid" || status=$?
wait "$watchdog" || true
grep -E 'MESSAGE: .*(calls by|skipped)|WARNING: ThreadSanitizer|test cases:|assertions:' "$log" || true
if [ "$status" -ne 0 ]; then
  echo "tsan: FAILED (exit $status); the end of $log:" >&2
  tail -150 "$log" >&2
  exit "$status"
fi
# A filter that matches nothing passes in doctest: that would be a stage without tests.
if ! grep -Eq 'test cases: *[1-9][0-9]* \| *[1-9][0-9]* passed' "$log"; then
  echo "tsan: FAILED: no stress test case ran; the end of $log:" >&2
  tail -20 "$log" >&2
  exit 1
fi
echo "tsan: no data race, all passed ($(( $(date +%s) - start )) s)"
