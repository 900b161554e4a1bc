// SPDX-License-Identifier: MIT
// The kernel variants compiled into the library: (units per thread, cache hints, options), for each of
// the three output dtypes. Each costs compile time on every architecture of the fat binary, so
// only what the tuning table (tuning.h) uses is here; cuda_tune.cu sweeps a wider set on one
// architecture. X(units, hints, options) is expanded once per dtype.
#pragma once

// (2 | 4, 5, 25): sm_90's tuning-table choices (hints 5 = evict-first code loads with the 256-byte
// prefetch, plain output stores; options 25 = shared nested code table + one-chunk argument block +
// programmatic dependent launch). (2 | 4, 7, 25): every hint, sm_80's and sm_75's entries and the
// earlier sm_90 choice; the same without PDL (options 9) and with the hints off (hints 0), for the
// A/Bs through `nf4 bench` and bench_peers.py --nf4-hints (NF4_CUDA_CONFIG).
#define NF4_CUDA_VARIANTS(X) \
  X(2, 7, 25)                \
  X(4, 7, 25)                \
  X(2, 7, 9)                 \
  X(4, 7, 9)                 \
  X(2, 0, 25)                \
  X(4, 0, 25)                \
  X(2, 5, 25)                \
  X(4, 5, 25)
