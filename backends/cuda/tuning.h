// SPDX-License-Identifier: MIT
// Per-architecture launch geometry and cache hints of the CUDA kernel (kernel.cuh). Each entry
// says which measurement it comes from; docs/PERFORMANCE.md has the tables. Only variants listed
// in variants.h can be named here (tests/test_cuda_backend.cpp checks every entry).
//
// Override for experiments: NF4_CUDA_CONFIG=threads,units,hints,grid,options with grid one of
// `group`, `N/sm` or `Nxocc` (read once per context; the variant must be compiled in).
#pragma once

#include <cstdint>

#include "backends/cuda/launch.h"

namespace nf4::cuda {

struct TuningEntry {
  int min_cc;                  // applies to compute capability >= min_cc (major * 10 + minor)
  std::int64_t small_elements; // calls with fewer elements in total use `small`
  KernelConfig small;
  KernelConfig large;
};

// The cache hints and options the entries combine.
inline constexpr int kHintsAll = kHintLoadStream | kHintStoreStream | kHintPrefetch256;
inline constexpr int kOptsBase = kOptSmemCode | kOptSingleChunkArgs;

// Ordered by min_cc, highest first; the first entry whose min_cc <= the device's applies.
inline constexpr TuningEntry kTuningTable[] = {
    // sm_90 (H200, 2026-11-22; docs/PERFORMANCE.md "CUDA backend"). nf4_cuda_tune swept threads
    // {128,256} x units {1,2,4,8} x hints {none, loads+stores, all} x grid {per group, 1x and 2x
    // occupancy} x options; every variant bit-exact. Events per call, fp16, us:
    //  - hints: loads L1::no_allocate + L2 evict_first AND stores .cs are worth 4-11%: 4096x14336
    //    at 128 threads, 2 units, per group: 46.4 (none) / 47.7 (loads only) / 47.3 (stores only)
    //    / 41.1 (both); .L2::256B prefetch on top is within noise (41.1).
    //  - units: 1 is 10-25% slower everywhere; 2, 4, 8 within 2% up to 4096x14336; at 8192x28672,
    //    128 threads: 155.9 (2) / 152.0 (4) / 152.4 (8).
    //  - grid: one CTA per group beats occupancy-sized persistent CTAs at 4096x14336 and up (40.5
    //    vs 42.6), with or without the pipelined loop (43.5); equal at 1024x4096.
    //  - options: the one-chunk argument block saves 0.3-0.5 us a launch (empty kernel: 3.60 vs
    //    3.33 us between events); the shared-memory nested code table 0.1-0.2 us at 1024x4096.
    // Graph-replay timing, same sweep, fp16 us at 1024x4096 / 2048x8192 / 4096x14336 / 8192x28672
    // / mlp3: 256 threads, 2 units, per group: 5.08 / 12.78 / 38.52 / 147.23 / 10.14 (large:
    // 1.003x the best of each); 128, 4, per group: 4.57 / 12.90 / 38.94 / 148.84 / 10.02; 256, 4,
    // 1x occupancy: 4.54 / 13.44 / 42.24 / 165.79 / 9.78 (small: 1.009x the best of each); hints
    // off at the best geometry: +19% (1024x4096), +5% (2048x8192), +13% (4096x14336).
    // Programmatic dependent launch overlaps one dequantization's launch with the previous one's
    // drain (back-to-back, fp16 us, 1024x4096 / 2048x8192 / 4096x14336 / 8192x28672 / mlp3:
    // 4.30 / 12.50 / 37.77 / 144.22 / 10.80 with it; 5.42 / 13.67 / 38.87 / 145.72 / 10.59 without).
    {.min_cc = 90,
     .small_elements = std::int64_t{1} << 24,  // 1024x4096 and the grouped MLP of three: small
     .small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase | kOptPdl},
     .large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl}},
    // sm_80 .. sm_89: not measured (no such GPU lent): Hopper's choice, which only relies on
    // 16-byte stores, several loads in flight per thread and sm_80's cache-policy loads; no
    // programmatic dependent launch before sm_90.
    {.min_cc = 80,
     .small_elements = std::int64_t{1} << 24,
     .small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase},
     .large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase}},
    // sm_75 (T4): not measured. The load hints compile to plain loads below sm_80 (st.global.cs
    // exists there); its correctness is tested on Hopper through a compute_75-only build.
    {.min_cc = 0,
     .small_elements = std::int64_t{1} << 24,
     .small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase},
     .large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase}},
};

inline const TuningEntry& tuning_for(int cc) {
  for (const TuningEntry& e : kTuningTable)
    if (cc >= e.min_cc) return e;
  return kTuningTable[sizeof kTuningTable / sizeof kTuningTable[0] - 1];
}

inline KernelConfig select_config(int cc, std::int64_t total_elements) {
  const TuningEntry& e = tuning_for(cc);
  return total_elements < e.small_elements ? e.small : e.large;
}

}  // namespace nf4::cuda
