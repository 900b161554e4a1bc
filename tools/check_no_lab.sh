#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks that a built libnf4 carries none of the lab (bench/, testdata/) and no checkpoint I/O
# (core/io/, the nf4_io library): no bench runner, timing mode, tuner kernel, bitsandbytes peer or
# nf4::io function among its symbols (local ones included, since the library's internal symbols
# are hidden: this needs an unstripped library), and none of the peer's entry-point names among
# its strings.
#
#   tools/check_no_lab.sh LIBRARY
set -euo pipefail
so="$1"
[ -f "$so" ] || { echo "check_no_lab: no $so" >&2; exit 1; }
symbols="$(nm -C "$so" 2>/dev/null || true)"
[ -n "$symbols" ] || { echo "check_no_lab: $so has no symbol table (stripped?)" >&2; exit 1; }
lab_symbols='nf4::bench|BenchRunner|Bench\b|time_bitsandbytes|time_peer|time_median_us|time_gemv_us|launch_spin|launch_add_offset|spin_kernel|add_offset_kernel|quantize_f16|quantize_bf16|random_normal|QuantizedWeight'
found="$(grep -E "$lab_symbols" <<<"$symbols" || true)"
if [ -n "$found" ]; then
  echo "check_no_lab: $so holds lab symbols:" >&2
  head -10 <<<"$found" >&2
  exit 1
fi
# Every function of core/io is in namespace nf4::io.
found="$(grep -F 'nf4::io::' <<<"$symbols" || true)"
if [ -n "$found" ]; then
  echo "check_no_lab: $so holds checkpoint I/O (nf4::io) symbols:" >&2
  head -10 <<<"$found" >&2
  exit 1
fi
lab_strings='cdequantize_blockwise|libbitsandbytes|NF4_BENCH_TIMING'
found="$(strings -a "$so" | grep -E "$lab_strings" || true)"
if [ -n "$found" ]; then
  echo "check_no_lab: $so holds lab strings:" >&2
  head -10 <<<"$found" >&2
  exit 1
fi
echo "check_no_lab: $so holds no bench runner, timing mode, peer, test-data generator or checkpoint I/O"
