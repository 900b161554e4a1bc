// SPDX-License-Identifier: MIT
// Per-architecture launch geometry and cache hints of the CUDA kernel (kernel.cuh). Each entry
// says which measurement it comes from; docs/PERFORMANCE_LOG.md has the tables. Only variants listed
// in variants.h can be named here (tests/test_cuda_backend.cpp checks every entry).
//
// Override for experiments: NF4_CUDA_CONFIG=threads,units,hints,grid,options with grid one of
// `group`, `N/sm` or `Nxocc` (read once per context; the variant must be compiled in).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/launch.h"

namespace nf4::cuda {

struct TuningEntry {
  int min_cc;                  // applies to compute capability >= min_cc (major * 10 + minor)
  std::int64_t small_elements; // calls with fewer elements in total use `small`
  KernelConfig small;
  KernelConfig large;
  int grouped_hints;           // replaces the config's hints for a launch of several tensors
};

// The cache hints and options the entries combine. kHintsTrain leaves the output stores plain:
// the weight a training step dequantizes is read next by its matmul, and a plain store leaves the
// output's lines in L2 for it, where an evict-first (.cs) store makes every later line of the same
// call evict them first (docs/PERFORMANCE_LOG.md "The training regime"). A grouped call (an MLP's
// three weights) ends with the last tensor's lines in L2 while its consumer reads the first
// tensor first, so plain stores buy it nothing there, and evict-first stores are faster back to
// back: grouped_hints.
inline constexpr int kHintsAll = kHintLoadStream | kHintStoreStream | kHintPrefetch256;
inline constexpr int kHintsTrain = kHintLoadStream | kHintPrefetch256;
inline constexpr int kOptsBase = kOptSmemCode | kOptSingleChunkArgs;

// Ordered by min_cc, highest first; the first entry whose min_cc <= the device's applies.
inline constexpr TuningEntry kTuningTable[] = {
    // sm_90: geometry from the H200 sweep of 2026-11-22 (docs/PERFORMANCE_LOG.md "kTuningTable"); one
    // CTA per group and plain output stores from the H100 training-regime A/Bs of 2026-11-26
    // (docs/PERFORMANCE_LOG.md "The training regime": the grouped MLP 13.8 -> 12.3 us, dequantize +
    // x[16] matmul 38.4 -> 29.9 us at 2048x8192).
    {.min_cc = 90,
     .small_elements = std::int64_t{1} << 24,  // 1024x4096 and the grouped MLP of three: small
     .small = {.threads = 256, .units = 4, .hints = kHintsTrain, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl},
     .large = {.threads = 256, .units = 2, .hints = kHintsTrain, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl},
     .grouped_hints = kHintsAll},
    // sm_80 .. sm_89: not measured; sm_90's entry without programmatic dependent launch (same section).
    {.min_cc = 80,
     .small_elements = std::int64_t{1} << 24,
     .small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase},
     .large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase},
     .grouped_hints = kHintsAll},
    // sm_75 (T4) and below: not measured; sm_80's entry, load hints compiled as plain loads (same section).
    {.min_cc = 0,
     .small_elements = std::int64_t{1} << 24,
     .small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase},
     .large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase},
     .grouped_hints = kHintsAll},
};

inline const TuningEntry& tuning_for(int cc) {
  for (const TuningEntry& e : kTuningTable)
    if (cc >= e.min_cc) return e;
  return kTuningTable[sizeof kTuningTable / sizeof kTuningTable[0] - 1];
}

// The configuration of one launch of `tensors` tensors holding `total_elements` elements together.
inline KernelConfig select_config(int cc, std::int64_t total_elements, std::size_t tensors = 1) {
  const TuningEntry& e = tuning_for(cc);
  KernelConfig c = total_elements < e.small_elements ? e.small : e.large;
  if (tensors > 1) c.hints = e.grouped_hints;
  return c;
}

}  // namespace nf4::cuda
