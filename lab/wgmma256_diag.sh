#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Diagnostic builds of the fast product's 256-token form (backends/cuda/gemv_mma_wgmma256.cuh):
# the tree's kernel, then the same kernel with one of its pieces taken out, each built into its own
# nf4 CLI and timed in interleaved rounds. These diagnostic variants compute wrong results: they
# say what each piece costs (lab/wgmma_overlap times the loop without them: the difference is
# what to look at). Runs on a GPU machine (sm_90a, nvcc, CMake, Ninja, Python 3) from the
# repository root; the sources are copied, never edited in place.
#
#   no-x      x's copies and every wait for them removed (the MMAs read whatever the stages hold)
#   no-codes  the codes' loads replaced by values made from the column (no loads, no waits)
#   no-stats  the statistics' loads of each next chunk removed (every chunk takes the unit's first
#             chunk's scales)
#   none      all three
# and candidates, which compute the right results and are tested before they are timed (the
# fast product's CUDA test cases, which force every kernel and part count):
#   codes2    the codes loaded two chunks ahead instead of one (8 more registers)
#   stats2    the statistics loaded two chunks ahead instead of one (4 more registers)
#
# Environment: OUT (results, default ./diag-out), BUILD (build-diag256), VARIANTS (the four
# diagnostics; candidates by name, e.g. VARIANTS="codes2 no-codes"),
# SHAPES (8192x28672,14336x4096,4096x14336), M (256), ITERS (50), ROUNDS (2), NF4_GPU_CMAKE_ARGS
# (extra configure arguments, e.g. -DNF4_CUDA_ARCHITECTURES=90a-real), JOBS (nproc).
set -euo pipefail

BUILD=${BUILD:-build-diag256}
OUT=${OUT:-diag-out}
VARIANTS=${VARIANTS:-no-x no-codes no-stats none}
SHAPES=${SHAPES:-8192x28672,14336x4096,4096x14336}
M=${M:-256}
ITERS=${ITERS:-50}
ROUNDS=${ROUNDS:-2}
JOBS=${JOBS:-$(nproc)}
HEADER=backends/cuda/gemv_mma_wgmma256.cuh
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"

mkdir -p "$OUT" "$BUILD/variants"
# Every variant is its own copy of the sources and its own build, all compiled at once (the product's
# translation unit takes minutes and one core; one after another they would take five times as long).
# The copy holds the tracked layout's top-level entries, never build trees or dot folders.
copy_sources() {
  local dst="$1" entry
  rm -rf "$dst" && mkdir -p "$dst"
  for entry in *; do
    case "$entry" in build*|"$(basename "$OUT")") ;; *) cp -a "$entry" "$dst/" ;; esac
  done
}
# A static library, so that each variant's CLI is one file to keep.
CANDIDATES=" codes2 stats2 "
build_variant() {
  local name="$1" start=$SECONDS targets=nf4
  [[ "$CANDIDATES" == *" $name "* ]] && targets="nf4 nf4_tests"
  # shellcheck disable=SC2086
  cmake -S "$BUILD/src-$name" -B "$BUILD/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNF4_CUDA=ON -DNF4_VULKAN=OFF \
    -DNF4_SHARED=OFF ${NF4_GPU_CMAKE_ARGS:-} >"$OUT/configure-$name.log" 2>&1 &&
    cmake --build "$BUILD/$name" -j"$JOBS" --target $targets >"$OUT/build-$name.log" 2>&1 ||
    { echo "$name: build failed"; tail -20 "$OUT/build-$name.log"; return 1; }
  cp "$BUILD/$name/nf4" "$BUILD/variants/$name"
  echo "$name: built in $((SECONDS - start)) s"
}
copy_sources "$BUILD/src-tree"

# Each variant: the tree's header with its edits (every edit must apply, or the variant is not built).
for v in $VARIANTS; do
  copy_sources "$BUILD/src-$v"
  python3 - "$v" "$HEADER" "$BUILD/src-$v/$HEADER" <<'EOF'
import sys
variant, src, dst = sys.argv[1:]
text = open(src).read()
# The loop's loads of the next chunk's codes and statistics, which the candidates move.
next_chunk_loads = ("        if (c + 1 < end) {\n"
                    "          load_codes(c + 1, next_lo, next_hi);\n"
                    "          rows.stats(c + 1, next);\n"
                    "        }\n")
edits = {
    "no-x": [
        ("      if (issued + later > 0) mbarrier_wait(empty + 8 * p, (issued + later - 1) & 1u);\n"
         "      bulk_copy_to_shared(xs_addr + 2 * p * kWgStepBytes<NT>, src + 2 * p * kWgStepBytes<NT>, 2 * kWgStepBytes<NT>, full + 8 * p);\n",
         "      (void)src, (void)later;\n"),
        ("          mbarrier_wait(full + 8 * (s / 2), issued & 1u);\n", ""),
    ],
    "no-codes": [
        ("      lo = load_stream16(rows.rows.code[0] + col / 2, policy);\n"
         "      hi = load_stream16(rows.rows.code[1] + col / 2, policy);\n",
         "      (void)policy;\n"
         "      lo = make_uint4(col, col * 3u, col * 5u, col * 7u);\n"
         "      hi = make_uint4(col * 11u, col * 13u, col * 17u, col * 19u);\n"),
    ],
    "no-stats": [
        ("          rows.stats(c + 1, next);\n", ""),
    ],
    "codes2": [
        ("    uint4 lo, hi, next_lo = make_uint4(0, 0, 0, 0), next_hi = next_lo;\n",
         "    uint4 lo, hi, next_lo = make_uint4(0, 0, 0, 0), next_hi = next_lo, later_lo = next_lo, later_hi = next_lo;\n"),
        ("    load_codes(first, lo, hi);\n",
         "    load_codes(first, lo, hi);\n"
         "    if (first + 1 < end) load_codes(first + 1, next_lo, next_hi);\n"),
        (next_chunk_loads,
         "        if (c + 2 < end) load_codes(c + 2, later_lo, later_hi);\n"
         "        if (c + 1 < end) rows.stats(c + 1, next);\n"),
        ("        cur = next, lo = next_lo, hi = next_hi;\n",
         "        cur = next, lo = next_lo, hi = next_hi, next_lo = later_lo, next_hi = later_hi;\n"),
    ],
    "stats2": [
        ("    WideStats cur, next;\n", "    WideStats cur, next, later;\n"),
        ("    next = cur;\n",
         "    next = cur;\n"
         "    if (first + 1 < end) rows.stats(first + 1, next);\n"
         "    later = next;\n"),
        (next_chunk_loads,
         "        if (c + 1 < end) load_codes(c + 1, next_lo, next_hi);\n"
         "        if (c + 2 < end) rows.stats(c + 2, later);\n"),
        ("        cur = next, lo = next_lo, hi = next_hi;\n",
         "        cur = next, next = later, lo = next_lo, hi = next_hi;\n"),
    ],
}
edits["none"] = edits["no-x"] + edits["no-codes"] + edits["no-stats"]
if variant not in edits:
    sys.exit(f"unknown variant {variant}")
for old, new in edits[variant]:
    if text.count(old) != 1:
        sys.exit(f"{variant}: an edit does not apply to this header (found {text.count(old)} times): {old.strip()[:80]}")
    text = text.replace(old, new)
open(dst, "w").write(text)
EOF
done
pids=()
for v in tree $VARIANTS; do build_variant "$v" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid" || true; done

# Candidates: the fast product's CUDA cases first; a candidate that fails is not timed.
timed=tree
for v in $VARIANTS; do
  if [[ "$CANDIDATES" == *" $v "* ]]; then
    if "$BUILD/$v/tests/nf4_tests" -tc='cuda gemv fast:*' >"$OUT/test-$v.log" 2>&1; then
      echo "$v: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test-$v.log" | tr -s ' ' | paste -sd ';')"
    else
      echo "$v: tests FAILED, not timed"; tail -30 "$OUT/test-$v.log"; continue
    fi
  fi
  [[ -x "$BUILD/variants/$v" ]] && timed="$timed $v"
done

# Interleaved rounds: every binary once per round, the 256-token form forced.
for round in $(seq 1 "$ROUNDS"); do
  for bin in $timed; do
    NF4_BENCH_TIMING=graph NF4_GEMV_MMA=wgmma256 "$BUILD/variants/$bin" bench --gemv-only --gemv-shapes "$SHAPES" --gemv-m "$M" \
      --gemv-dtype bf16 --gemv-mode fast --iters "$ITERS" --backend cuda >"$OUT/bench-last.txt" 2>&1 || { echo "$bin: bench failed"; cat "$OUT/bench-last.txt"; }
    { echo "== round $round, $bin"; cat "$OUT/bench-last.txt"; } >>"$OUT/bench-all.txt"
    awk -v c="$bin" -v n="$round" '/^gemv W/ {on = 1; next} on && NF >= 7 {printf "r%s %-10s %-12s m%-3s %9s us\n", n, c, $1, $2, $4}' "$OUT/bench-last.txt"
  done
done | tee "$OUT/diag256.txt"
