// SPDX-License-Identifier: MIT
// The kernel variants compiled into the library: (units per thread, cache hints, options), for each of
// the three output dtypes. Each costs compile time on every architecture of the fat binary, so
// only what the tuning table (tuning.h) uses is here; tune.cu sweeps a wider set on one
// architecture. X(units, hints, options) is expanded once per dtype.
#pragma once

// (2 | 4, 7, 25): the tuning table's choices (options 25 = shared nested code table + one-chunk
// argument block + programmatic dependent launch); the same without PDL (options 9), and the large
// choice with the cache hints off (hints 0), for the A/B through `nf4 bench` (NF4_CUDA_CONFIG).
#define NF4_CUDA_VARIANTS(X) \
  X(2, 7, 25)                \
  X(4, 7, 25)                \
  X(2, 7, 9)                 \
  X(4, 7, 9)                 \
  X(2, 0, 25)
