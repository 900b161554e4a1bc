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
    // sm_90: H200, nf4_cuda_tune sweep and A/Bs, 2026-11-22: these won (docs/PERFORMANCE.md "kTuningTable").
    {.min_cc = 90,
     .small_elements = std::int64_t{1} << 24,  // 1024x4096 and the grouped MLP of three: small
     .small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase | kOptPdl},
     .large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl}},
    // sm_80 .. sm_89: not measured; sm_90's entry without programmatic dependent launch (same section).
    {.min_cc = 80,
     .small_elements = std::int64_t{1} << 24,
     .small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase},
     .large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase}},
    // sm_75 (T4) and below: not measured; sm_80's entry, load hints compiled as plain loads (same section).
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
