// SPDX-License-Identifier: MIT
// The kernel variants compiled into the library: (units per thread, cache hints, options), for each of
// the three output dtypes. Each costs compile time on every architecture of the fat binary, so
// only what the tuning table (tuning.h) uses is here; tune.cu sweeps a wider set on one
// architecture. X(units, hints, options) is expanded once per dtype.
#pragma once

// (4, 7, 9): the tuning table's choice; (2 | 8, 7, 9) and (4, 7, 11) (pipelined) its nearest
// rivals, for NF4_CUDA_CONFIG experiments; (4, 0, 9): the choice with the cache hints off, for the
// hint A/B through `nf4 bench` (NF4_CUDA_CONFIG=128,4,0,0,9).
#define NF4_CUDA_VARIANTS(X) \
  X(4, 7, 9)                 \
  X(2, 7, 9)                 \
  X(8, 7, 9)                 \
  X(4, 7, 11)                \
  X(4, 0, 9)
