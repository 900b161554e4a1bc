// SPDX-License-Identifier: MIT
// The kernel variants compiled into the library: (units per thread, cache hints, options), for each of
// the three output dtypes. Each costs compile time on every architecture of the fat binary, so
// only what the tuning table (tuning.h) uses is here; tune.cu sweeps a wider set on one
// architecture. X(units, hints, options) is expanded once per dtype.
#pragma once

#define NF4_CUDA_VARIANTS(X) \
  X(2, 3, 9)                 \
  X(4, 3, 9)                 \
  X(2, 3, 11)                \
  X(4, 3, 11)                \
  X(4, 0, 9)
