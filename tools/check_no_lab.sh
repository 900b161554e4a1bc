#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks that what is installed carries none of the lab (lab/: the bitsandbytes peer, the tuner,
# the test-data quantizer):
#   - the library (default) holds no bench runner or timing mode either (bench/), and no
#     checkpoint I/O (tools/checkpoint, the nf4_checkpoint library, namespace nf4::io);
#   - the CLI (--cli) holds those two, for `nf4 bench`, `convert`, `inspect` and `verify`, and
#     nothing of the lab.
# Symbols are read with nm, local ones included (the library's internal symbols are hidden: this
# needs an unstripped file), and the peer's entry-point names among the strings.
#
#   tools/check_no_lab.sh LIBRARY
#   tools/check_no_lab.sh --cli EXECUTABLE
set -euo pipefail
what=library
if [ "${1:-}" = --cli ]; then
  what=CLI
  shift
fi
file="$1"
[ -f "$file" ] || { echo "check_no_lab: no $file" >&2; exit 1; }
symbols="$(nm -C "$file" 2>/dev/null || true)"
[ -n "$symbols" ] || { echo "check_no_lab: $file has no symbol table (stripped?)" >&2; exit 1; }
# lab/: the peer and its kernel, the tuner's namespace, the quantizer.
lab_symbols='nf4::lab|time_bitsandbytes|launch_add_offset|add_offset_kernel|quantize_f16|quantize_bf16|random_normal|QuantizedWeight|dynamic_code_map'
lab_strings='cdequantize_blockwise|libbitsandbytes'
if [ "$what" = library ]; then
  # bench/ and tools/checkpoint too (every function of the checkpoint library is in nf4::io).
  lab_symbols="$lab_symbols"'|nf4::bench|BenchRunner|Bench\b|time_median_us|time_gemv_us|launch_spin|spin_kernel|nf4::io::'
  lab_strings="$lab_strings"'|NF4_BENCH_TIMING'
fi
found="$(grep -E "$lab_symbols" <<<"$symbols" || true)"
if [ -n "$found" ]; then
  echo "check_no_lab: $file holds symbols it must not carry:" >&2
  head -10 <<<"$found" >&2
  exit 1
fi
found="$(strings -a "$file" | grep -E "$lab_strings" || true)"
if [ -n "$found" ]; then
  echo "check_no_lab: $file holds strings it must not carry:" >&2
  head -10 <<<"$found" >&2
  exit 1
fi
if [ "$what" = library ]; then
  echo "check_no_lab: $file holds no bench runner, timing mode, peer, test-data generator or checkpoint I/O"
else
  echo "check_no_lab: $file holds no peer, tuner or test-data generator"
fi
