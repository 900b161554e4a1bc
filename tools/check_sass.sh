#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks the CUDA machine code of a file (the library, an executable) for memory instructions
# whose descriptor is not a 64-bit uniform register pair: a descriptor names an even register
# (desc[UR4] is UR4:UR5). sm_90a's ptxas (CUDA 13.0) has emitted evict-first copies addressed
# [R+UR+imm] with desc[UR1], UR0 and UR1 never written, which fault with an illegal instruction
# (docs/PERFORMANCE_LOG.md, "The streaming kernel's address and loop overhead cut, a ptxas fault
# on the way, ..."); this finds such code before a GPU runs it.
#
#   tools/check_sass.sh CUOBJDUMP FILE
set -euo pipefail
cuobjdump="$1"
file="$2"
[ -f "$file" ] || { echo "check_sass: no $file" >&2; exit 1; }
sass="$(mktemp)"
trap 'rm -f "$sass"' EXIT
"$cuobjdump" -sass "$file" >"$sass" || { echo "check_sass: $cuobjdump could not read $file" >&2; exit 1; }
grep -q 'Function :' "$sass" || { echo "check_sass: no machine code in $file" >&2; exit 1; }
awk '
  /Function :/ { fn = $3; functions++ }
  /desc\[UR[0-9]*[13579]\]/ {
    odd++
    if (odd <= 5) { sub(/^[ \t]+/, ""); print "check_sass: " fn ": " $0 }
  }
  /desc\[UR[0-9]+\]/ { descs++ }
  END {
    printf "check_sass: %d functions, %d instructions with a descriptor, %d of them odd\n", functions, descs, odd
    exit odd > 0
  }' "$sass"
