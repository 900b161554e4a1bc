// SPDX-License-Identifier: MIT
// The kernel variants compiled into the library: (units per thread) x (cache hints), for each of
// the three output dtypes. Each costs compile time on every architecture of the fat binary, so
// only what the tuning table (tuning.h) uses is here; tune.cu sweeps a wider set on one
// architecture. X(units, hints) is expanded once per dtype.
#pragma once

#define NF4_CUDA_VARIANTS(X) \
  X(1, 0)                    \
  X(2, 0)                    \
  X(4, 0)                    \
  X(8, 0)                    \
  X(1, 3)                    \
  X(2, 3)                    \
  X(4, 3)                    \
  X(8, 3)
