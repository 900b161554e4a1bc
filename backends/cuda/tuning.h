// SPDX-License-Identifier: MIT
// Per-architecture launch geometry and cache hints of the CUDA kernel (kernel.cuh). Each entry
// says which measurement it comes from; docs/PERFORMANCE.md has the tables. Only variants listed
// in variants.h can be named here (tests/test_cuda.cpp checks every entry).
//
// Override for experiments: NF4_CUDA_CONFIG=threads,units,hints,ctas_per_sm,options (read once per
// context; the variant must be compiled in).
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

// Ordered by min_cc, highest first; the first entry whose min_cc <= the device's applies.
inline constexpr TuningEntry kTuningTable[] = {
    // sm_90 (H100 / H200): placeholder until the second GPU run (docs/PERFORMANCE.md).
    {90, std::int64_t{1} << 23, {128, 2, 3, 0, 9}, {128, 4, 3, 0, 9}},
    // sm_80 .. sm_89: not measured here (no such GPU lent); Hopper's geometry, which only assumes
    // 16-byte stores and several loads in flight per thread.
    {80, std::int64_t{1} << 23, {128, 2, 3, 0, 9}, {128, 4, 3, 0, 9}},
    // sm_75 (T4): not measured here. The load hints compile to plain loads below sm_80;
    // st.global.cs exists there.
    {0, std::int64_t{1} << 23, {128, 2, 3, 0, 9}, {128, 4, 3, 0, 9}},
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
