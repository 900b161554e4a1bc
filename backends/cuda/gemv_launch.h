// SPDX-License-Identifier: MIT
// What one launch of the matrix-vector kernel (gemv.cu) receives, and its tuning table. Plain
// data only, shared by the host side (gemv_backend.cpp, C++) and the kernel (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/pdl.h"
#include "nf4/nf4.h"

namespace nf4::cuda {

struct GemvArgs {
  const std::uint8_t* packed;
  const void* absmax;          // float* (flat) or uint8_t* (nested)
  const float* nested_absmax;  // nested only
  const float* nested_code;    // nested only: 256 entries
  const float* quant_map;      // NF4: 16 entries; FP4: nullptr (fp4_table is used)
  const float* offset_ptr;     // nested: device pointer to the offset, or nullptr (offset_value)
  const void* x;               // [m, k] of the kernel's x dtype
  void* y;                     // [m, n] of y_dtype
  float* workspace;            // the split form's part sums (GemvKernelLaunch::workspace_bytes), else nullptr
  std::int64_t n, k;
  float offset_value;
  std::uint32_t pad_bits;      // core/gemv.h gemv_pad_bits(k)
  std::int32_t m;              // 1..the kernel's row capacity
  std::int32_t y_dtype;        // nf4_dtype
  std::uint8_t log2_blocksize, log2_nested_blocksize, nested;
  std::uint8_t vector;         // k % 32 == 0 and packed and x 16-byte aligned: 16-byte loads
  std::uint8_t log2_split;     // fast kernel: a row group's chunk tree is split over 2^this warps of a CTA;
                               // tensor-core kernel: k is summed in 2^this parts
  std::int64_t absmax_count;   // entries of absmax (the tensor-core kernel's copies stay inside it)
  std::uint8_t log2_part_group; // the split forms: consecutive parts of k per CTA (2^this)
  // Always 0. The fast kernel folds the registers of an item's loads into the next item's
  // addresses through it, which ptxas cannot see through: see gemv_fast.cu ("ordered prefetch").
  std::uint32_t opaque_zero = 0;
  float fp4_table[16];
};

// Launch shape per architecture (gemv.cu's kernel: one warp per row of W at a time).
struct GemvTuning {
  int min_cc;            // applies to compute capability >= min_cc, first match wins
  int threads;           // CTA size, a multiple of 32: threads / 32 rows in flight per CTA
  int chunks_in_flight;  // 1024-column chunks whose codes a warp loads before using any, for m > 2
                         // (twice as many for m <= 2, whose registers allow it); compiled: 2
  int ctas_per_sm;       // grid cap: SMs * ctas_per_sm CTAs (grid-stride over rows); 0 = one warp per row
};

inline constexpr GemvTuning kGemvTuning[] = {
    // sm_90: not swept; the dequantization kernel's geometry (docs/PERFORMANCE_LOG.md "kGemvTuning").
    {90, 256, 2, 0},
    // sm_80 .. sm_89: not measured; the same geometry (same section).
    {80, 256, 2, 0},
    // below sm_80: not measured; the same geometry, code loads without cache hints (same section).
    {0, 256, 2, 0},
};

inline const GemvTuning& gemv_tuning_for(int cc) {
  for (const GemvTuning& t : kGemvTuning)
    if (cc >= t.min_cc) return t;
  return kGemvTuning[sizeof kGemvTuning / sizeof kGemvTuning[0] - 1];
}

// The fast kernel (gemv_fast.cu): sm_80 and later, vector shapes (GemvArgs::vector). Row counts
// per warp item compiled for each x-row bucket (m = 1, 2, 3-4, 5-8):
#define GEMV_FAST_ROWS_M1 2, 4
#define GEMV_FAST_ROWS_M2 2
#define GEMV_FAST_ROWS_M4 2, 4
#define GEMV_FAST_ROWS_M8 1, 2
struct GemvFastTuning {
  int min_cc;                    // applies to compute capability >= min_cc, first match wins
  int threads;                   // CTA size, a multiple of 32 up to 256; CTAs per SM from the occupancy
  int rows[4];                   // rows of W per warp item for m = 1, 2, 3-4, 5-8 (x reused across them)
  std::int64_t x_shared_max[4];  // per bucket: x staged in shared memory when its padded size is at most this
  int split;                     // warps sharing a row group's chunks: 0 = chosen per shape (up to
                                 // kGemvMaxSplit), else this power of two (capped by the CTA's warps
                                 // and the padded chunk count)
};
inline constexpr int kGemvMaxSplit = 8;

inline constexpr GemvFastTuning kGemvFastTuning[] = {
    // sm_90: H100 CUDA-graph A/Bs, 2026-11-23 and 2026-11-25: these won (docs/PERFORMANCE_LOG.md "kGemvFastTuning");
    // x staged at m = 1 up to 16 KB only where there are rows to amortize it (gemv_fast.cu plan_xs).
    {90, 256, {4, 2, 2, 2}, {16 << 10, 0, 0, 128 << 10}, 0},
    // sm_80 .. sm_89: not measured; sm_90's first shape without staged x, not compiled there (same section).
    {80, 256, {4, 2, 2, 1}, {0, 0, 0, 0}, 0},
};

// The fast kernel's entry for `cc`, or nullptr below sm_80 (its table needs 64 KB of shared
// memory and the L2 cache-hint loads).
inline const GemvFastTuning* gemv_fast_tuning_for(int cc) {
  for (const GemvFastTuning& t : kGemvFastTuning)
    if (cc >= t.min_cc) return &t;
  return nullptr;
}

// One launch decided: the kernel, its grid and its dynamic shared memory. Planning may query the
// device (occupancy, shared-memory limits; cached per kernel); enqueueing a plan does not.
struct GemvKernelLaunch {
  const void* fn = nullptr;
  unsigned grid = 0, threads = 0;
  std::size_t smem = 0;
  unsigned cluster = 1;  // CTAs per thread-block cluster (sm_90; grid a multiple of it)
  bool pdl = false;      // programmatic dependent launch on streams the caller created (pdl.h)
  // A kernel before the first (the split form's x image) and one after it (the split form's
  // addition of the parts), same arguments, or none.
  const void* before_fn = nullptr;
  unsigned before_grid = 0, before_threads = 0;
  const void* then_fn = nullptr;
  unsigned then_grid = 0, then_threads = 0;
  std::size_t workspace_bytes = 0;  // what args.workspace must hold (the split form), else 0
};

// A launch of `grid` CTAs in clusters of `cluster` along x; `attr` holds the cluster's shape and
// must outlive the configuration (which points to it).
inline cudaLaunchConfig_t cluster_launch_config(unsigned grid, unsigned threads, std::size_t smem, cudaStream_t stream, unsigned cluster,
                                                cudaLaunchAttribute& attr) {
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  return config;
}

// Enqueues `plan` with `args` on `stream`: its kernel launch (three for the split form), nothing else.
inline cudaError_t enqueue_gemv_plan(const GemvKernelLaunch& plan, const GemvArgs& args, cudaStream_t stream) {
  void* params[] = {const_cast<GemvArgs*>(&args)};
  const bool pdl = plan.pdl && stream_takes_pdl(stream);
  const auto launch = [&](const void* fn, unsigned grid, unsigned threads, std::size_t smem, unsigned cluster) {
    if (cluster <= 1 && !pdl) return cudaLaunchKernel(fn, dim3(grid), dim3(threads), params, smem, stream);
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t config = cluster_launch_config(grid, threads, smem, stream, cluster, attr[0]);
    if (cluster <= 1) config.numAttrs = 0;
    if (pdl) attr[config.numAttrs++] = pdl_attribute();
    config.attrs = attr;
    return cudaLaunchKernelExC(&config, fn, params);
  };
  if (plan.before_fn)
    if (const cudaError_t e = launch(plan.before_fn, plan.before_grid, plan.before_threads, 0, 1); e != cudaSuccess) return e;
  const cudaError_t e = launch(plan.fn, plan.grid, plan.threads, plan.smem, plan.cluster);
  if (e != cudaSuccess || !plan.then_fn) return e;
  return launch(plan.then_fn, plan.then_grid, plan.then_threads, 0, 1);
}

bool gemv_fast_has_variant(const GemvFastTuning& t);
// The fast kernel's plan for `args` (gemv_fast.cu), which also sets args.log2_split:
// cudaErrorInvalidValue when !args.vector or no variant is compiled for `t`,
// cudaErrorInvalidConfiguration when the device's shared memory cannot hold it, the build has
// no code of sm_80 or later for it (compute_75 PTX only) or k is past its 32-bit offsets (2^26).
cudaError_t plan_gemv_fast(GemvArgs& args, nf4_dtype x_dtype, const GemvFastTuning& t, int sms, GemvKernelLaunch* out);

// The fast contract's tensor-core kernel (gemv_mma.cu). Available for fp16 x from sm_75 (two
// m16n8k8 per step there) and for fp16 and bf16 x from sm_80 (m16n8k16).
bool gemv_mma_available(int cc, nf4_dtype x_dtype);
// Whether the warpgroup kernels (GemvMmaKernel::wgmma64, wgmma128, wgmma64_cluster) can run on a device of
// compute capability cc: the build holds sm_90a code and the device is sm_90.
bool gemv_wgmma_available(int cc);
// Warps that share a 16-row tile's chunks: a function of k alone (the sum order depends on it).
int gemv_mma_split(std::int64_t k);
// Which warps take a row tile's parts of k (gemv_mma.cu): the same sums in the same order either way.
enum class GemvMmaSchedule { automatic, split, single };
// Which kernel runs the vector path: the ring kernel (codes through a cp.async ring in shared
// memory, any m), the streaming kernel (statistics and x in registers, up to 16 tokens per work
// item) with 1 or 2 16-row tiles per warp, or the wide kernel (x staged per CTA, 32 or 64 tokens
// per work item; single schedule only), or the warpgroup kernel (the wide kernel's staging with
// one wgmma per step for 64 or 128 tokens; sm_90a builds on sm_90 devices only), for 64 tokens
// also with the parts of k summed by the CTAs of a cluster (wgmma64_cluster: weights of few rows
// still fill the device). All give the same bits.
// wgmma64_split, wgmma128_split: the same parts on separate CTAs of an ordinary grid, each part's
// sums through a workspace in global memory and added in part order by a second kernel (any number
// of CTAs at once, where clusters are limited by the GPCs), for 64 or 128 tokens per item.
// wgmma256: 256 tokens per item, the parts' total in shared memory, x from its image in a
// workspace; one CTA takes every part in turn, or each of several its consecutive parts, their
// sums added in part order by the split forms' second kernel.
enum class GemvMmaKernel {
  automatic,
  ring,
  stream1,
  stream2,
  wide32,
  wide64,
  wgmma64,
  wgmma128,
  wgmma64_cluster,
  wgmma64_split,
  wgmma128_split,
  wgmma256
};
// A tensor-core plan's free choices, forced by tests and A/B runs (automatic: the tuned rule).
struct GemvMmaChoice {
  bool k8 = false;  // sm_75's m16n8k8 steps on any device (fp16 x)
  GemvMmaSchedule schedule = GemvMmaSchedule::automatic;
  GemvMmaKernel kernel = GemvMmaKernel::automatic;
  int cluster_parts = 0;  // wgmma64_cluster: parts of k per CTA, 1, 2 or 4 (0: by the clusters the device holds);
                          // the split and 256-token forms: 1, 2, 4 or 8 (0: by the model)
  // stream1 up to 8 tokens: 8 forces the form of 8 warps per CTA with x in registers (the one for
  // devices whose shared memory cannot hold 16 warps' rings; tests run it anywhere); 0: automatic.
  int stream_warps = 0;
  bool automatic() const {
    return !k8 && schedule == GemvMmaSchedule::automatic && kernel == GemvMmaKernel::automatic && cluster_parts == 0 && stream_warps == 0;
  }
};
// The plan for `args` (sets args.log2_split and the split form's args.log2_part_group; the caller
// sets args.workspace where out->workspace_bytes > 0): cudaErrorInvalidConfiguration where the
// device or the build has no code for it, cudaErrorInvalidValue for a forced variant that does not
// exist for it or needs more than `workspace` bytes (the workspace the launch will have).
cudaError_t plan_gemv_mma(GemvArgs& args, nf4_dtype x_dtype, int cc, const GemvMmaChoice& choice, int sms, std::size_t workspace,
                          GemvKernelLaunch* out);

// gemv.cu's kernel: whether it exists for (chunks_in_flight); its plan (grid from the tuning and
// the SM count; cudaErrorInvalidValue for a variant that is not compiled in).
bool gemv_has_variant(const GemvTuning& t);
cudaError_t plan_gemv(const GemvArgs& args, nf4_dtype x_dtype, const GemvTuning& t, int sms, GemvKernelLaunch* out);

}  // namespace nf4::cuda
