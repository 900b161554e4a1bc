// SPDX-License-Identifier: MIT
// How a device runner times one operation: the one timing mode of `nf4 bench`, the CUDA tuner and
// the peers, chosen by NF4_BENCH_TIMING=batch|graph|events (default batch). Every backend's
// runner reads the same value, so the backends of one run are measured the same way; what each
// mode means on a device is written next to its runner (bench/cuda/cuda_bench.h,
// bench/vulkan/vulkan_bench.cpp).
#pragma once

#include <string_view>

namespace nf4::bench {

enum class Timing {
  kBatch,   // K operations back to back between two device timestamps, time per operation = span / K
  kGraph,   // the K operations captured once and replayed (CUDA graphs; elsewhere the same as kBatch)
  kEvents,  // a timestamp pair around every operation (per-call timing)
};

// "batch" | "graph" | "events" (empty: batch); throws nf4::Error (NF4_ERR_INVALID_ARGUMENT)
// naming `source` otherwise.
Timing parse_timing(std::string_view text, std::string_view source = "NF4_BENCH_TIMING");
// NF4_BENCH_TIMING, read on every call (tests and tools change it at run time).
Timing timing_from_env();

}  // namespace nf4::bench
