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
  std::int64_t small_elements; // calls with fewer elements in total use the small configurations
  KernelConfig small;          // one tensor
  KernelConfig large;
  KernelConfig small_grouped;  // several tensors in one launch (an MLP's weights)
  KernelConfig large_grouped;
};

// The cache hints and options the entries combine. kHintsTrain leaves the output stores plain:
// the weight a training step dequantizes is read next by its matmul, and a plain store leaves the
// output's lines in L2 for it, where an evict-first (.cs) store makes every later line of the same
// call evict them first (docs/PERFORMANCE_LOG.md "The training regime"). A grouped call (an MLP's
// three weights) ends with the last tensor's lines in L2 while its consumer reads the first
// tensor first, so plain stores buy it nothing there, and evict-first stores are faster back to
// back: the grouped configurations take kHintsAll.
inline constexpr int kHintsAll = kHintLoadStream | kHintStoreStream | kHintPrefetch256;
inline constexpr int kHintsTrain = kHintLoadStream | kHintPrefetch256;
inline constexpr int kOptsBase = kOptSmemCode | kOptSingleChunkArgs;

// sm_80's configurations (sm_90's of 2026-11-22 without programmatic dependent launch), the same
// for one tensor and for several; the entries below sm_90 take them.
inline constexpr KernelConfig kSm80Small = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::occupancy(1), .options = kOptsBase};
inline constexpr KernelConfig kSm80Large = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase};

// Ordered by min_cc, highest first; the first entry whose min_cc <= the device's applies.
inline constexpr TuningEntry kTuningTable[] = {
    // sm_90: geometry from the H200 sweep of 2026-11-22 (docs/PERFORMANCE_LOG.md "kTuningTable"); one
    // CTA per group and plain output stores from the H100 training-regime A/Bs of 2026-11-26
    // (docs/PERFORMANCE_LOG.md "The training regime": the grouped MLP 13.8 -> 12.3 us, dequantize +
    // x[16] matmul 38.4 -> 29.9 us at 2048x8192); a small tensor alone in CTAs of 512 threads with
    // two units each, the grouped MLP in 256 of four (H100, same process as Unsloth, 2026-11-26
    // 23:50 UTC, docs/PERFORMANCE_LOG.md "The small size class's geometry": 1024x4096 back to back
    // 5.42 -> 5.07 us, cold calls 1-4% faster; the grouped MLP 2% slower that way).
    {.min_cc = 90,
     .small_elements = std::int64_t{1} << 24,  // 1024x4096 and the grouped MLP of three: small
     .small = {.threads = 512, .units = 2, .hints = kHintsTrain, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl},
     .large = {.threads = 256, .units = 2, .hints = kHintsTrain, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl},
     .small_grouped = {.threads = 256, .units = 4, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl},
     .large_grouped = {.threads = 256, .units = 2, .hints = kHintsAll, .grid = Grid::per_group(), .options = kOptsBase | kOptPdl}},
    // sm_80 .. sm_89: not measured; sm_90's entry of 2026-11-22 without programmatic dependent
    // launch (same section).
    {.min_cc = 80,
     .small_elements = std::int64_t{1} << 24,
     .small = kSm80Small,
     .large = kSm80Large,
     .small_grouped = kSm80Small,
     .large_grouped = kSm80Large},
    // sm_75 (T4) and below: not measured; sm_80's entry, load hints compiled as plain loads (same section).
    {.min_cc = 0,
     .small_elements = std::int64_t{1} << 24,
     .small = kSm80Small,
     .large = kSm80Large,
     .small_grouped = kSm80Small,
     .large_grouped = kSm80Large},
};

inline const TuningEntry& tuning_for(int cc) {
  for (const TuningEntry& e : kTuningTable)
    if (cc >= e.min_cc) return e;
  return kTuningTable[sizeof kTuningTable / sizeof kTuningTable[0] - 1];
}

// The configuration of one launch of `tensors` tensors holding `total_elements` elements together.
inline KernelConfig select_config(int cc, std::int64_t total_elements, std::size_t tensors = 1) {
  const TuningEntry& e = tuning_for(cc);
  const bool small = total_elements < e.small_elements;
  if (tensors > 1) return small ? e.small_grouped : e.large_grouped;
  return small ? e.small : e.large;
}

}  // namespace nf4::cuda
