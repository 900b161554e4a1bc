// SPDX-License-Identifier: MIT
// What one kernel launch of the CUDA backend receives, shared by the host code (cuda_backend.cpp,
// compiled by the C++ compiler) and the kernels (kernels.cu / kernel.cuh, compiled by nvcc).
// Plain data only: no CUDA headers here, so the host side needs nothing but cuda_runtime.h.
//
// A launch is one Dispatch of core's plan (core/plan.h): up to kMaxChunksPerLaunch chunks, each a
// contiguous element range of one tensor. The host turns every chunk into a ChunkArgs whose
// pointers already point at the chunk's first byte / block / output element, so the kernel works
// with 32-bit chunk-relative indices (chunks are at most kMaxChunkElements long) while tensors
// can have up to 2^56 elements.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "nf4/nf4.h"

namespace nf4::cuda {

// Chunks per launch: a grouped call of an MLP (gate, up, down) fits in one launch; the argument
// block (about 1.4 KB) stays far below the 4 KB kernel-parameter limit of every architecture.
inline constexpr int kMaxChunksPerLaunch = 16;
// Keeps chunk-relative element indices, plus a block remainder, inside 32 bits.
inline constexpr std::int64_t kMaxChunkElements = std::int64_t{1} << 30;

// ChunkArgs::align bits, set on the host from the pointers.
enum Align : std::uint8_t {
  kAlignVector = 1,  // packed aligned for the code load (4 bytes, fp32 out: 2) and out to 16 bytes
};

struct ChunkArgs {
  const std::uint8_t* packed;    // packed byte of the chunk's first element (chunks start at even elements)
  const void* absmax;            // float* (flat) or uint8_t* (nested), at the chunk's first block
  const float* nested_absmax;    // nested: at the nested block of the chunk's first block
  const float* nested_code;      // nested: the 256-entry table
  const float* quant_map;        // the 16-entry table stored with the data, or nullptr: LaunchArgs::fp4_table
  const float* offset_ptr;       // nested: device pointer to the offset, or nullptr (then offset_value)
  void* out;                     // output element of the chunk's first element
  float offset_value;
  std::uint32_t n;               // elements in the chunk, 1..kMaxChunkElements
  std::uint32_t first_group;     // the chunk's first group (work item of one CTA) in the launch
  std::uint32_t block_rem;       // chunk's first element mod blocksize
  std::uint32_t nested_rem;      // chunk's first absmax block mod nested_blocksize
  std::uint8_t log2_blocksize;
  std::uint8_t log2_nested_blocksize;
  std::uint8_t nested;           // 0: flat fp32 absmax; 1: uint8 absmax + nested statistics
  std::uint8_t align;            // Align bits
};

template <int N>
struct LaunchArgsN {
  ChunkArgs chunks[N];
  float fp4_table[16];           // the built-in table of the chunks' quant type (core/types.h), e.g. FP4's
  std::uint32_t chunk_count;
  std::uint32_t total_groups;    // sum of the chunks' groups; CTAs loop over them (grid stride)
  unsigned long long* timestamps;  // tuner only (kOptTimestamps): {first CTA start, last CTA end}
};
using LaunchArgs = LaunchArgsN<kMaxChunksPerLaunch>;

// How many CTAs a launch has; with fewer CTAs than groups, each CTA loops over groups.
struct Grid {
  enum Shape : int {
    kPerGroup,      // one CTA per group
    kPerSm,         // factor CTAs per SM
    kPerOccupancy,  // factor times the CTAs of this kernel that fit on an SM at once
  };
  Shape shape = kPerGroup;
  int factor = 1;

  static constexpr Grid per_group() { return {kPerGroup, 1}; }
  static constexpr Grid per_sm(int ctas) { return {kPerSm, ctas}; }
  static constexpr Grid occupancy(int times) { return {kPerOccupancy, times}; }
  constexpr bool operator==(const Grid& o) const { return shape == o.shape && factor == o.factor; }
  constexpr bool operator<(const Grid& o) const { return shape != o.shape ? shape < o.shape : factor < o.factor; }
};

// How a launch is shaped; chosen by the tuning table (tuning.h).
struct KernelConfig {
  int threads;  // CTA size
  int units;    // vector units per thread per group (independent loads in flight)
  int hints;    // cache-hint bits (Hint below)
  Grid grid;
  int options;  // Option bits (below)
};

// KernelConfig::options bits.
enum Option : int {
  kOptSmemCode = 1,         // nested code table in shared memory, loaded alongside the codes, so the
                            // absmax needs no load that waits for another load
  kOptPipeline = 2,         // grid-stride CTAs load their next group while computing the current one
  kOptTimestamps = 4,       // tuner only: first CTA start / last CTA end on the device clock
  kOptSingleChunkArgs = 8,  // one-chunk launches pass a one-chunk argument block (host side)
  kOptPdl = 16,             // sm_90+: launched as a programmatic dependent launch (host side): the
                            // kernel's CTAs may be scheduled while the previous kernel in the stream
                            // drains; they wait (griddepcontrol.wait) before touching memory
};
inline constexpr int kKernelOptionMask = kOptSmemCode | kOptPipeline | kOptTimestamps;  // select a kernel body

// Cache-hint bits of KernelConfig::hints (A/B numbers in docs/PERFORMANCE_LOG.md).
enum Hint : int {
  kHintLoadStream = 1,   // codes: ld.global.nc.L1::no_allocate + L2 evict-first policy (read once)
  kHintStoreStream = 2,  // outputs: st.global.cs (streamed, evict first)
  kHintPrefetch256 = 4,  // codes: .L2::256B prefetch size (a sequential stream)
};

// Output elements one vector unit covers: the 8 codes of one 32-bit load (4 of a 16-bit load for
// fp32), written with one store of at most 16 bytes (8 halves: 16 bytes, 4 floats: 16 bytes, 8
// one-byte elements: 8 bytes).
constexpr int unit_elements_of_size(int size) { return 16 / size < 8 ? 16 / size : 8; }
template <nf4_dtype D>
inline constexpr int kUnitElements = unit_elements_of_size(static_cast<int>(sizeof(typename DtypeCodec<D>::Storage)));
inline int unit_elements(nf4_dtype d) { return unit_elements_of_size(static_cast<int>(dtype_size(d))); }

}  // namespace nf4::cuda
