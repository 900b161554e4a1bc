// SPDX-License-Identifier: MIT
// The product's fast contract (nf4.h, NF4_GEMV_FAST; docs/GEMV.md "The fast contract") on tensor
// cores: Y[m, n] = X[m, k] @ W^T with each weight dequantized in registers, rounded to x's dtype
// exactly as nf4_dequantize writes it, and fed to mma.sync with fp32 accumulation. No dense copy of
// W exists anywhere.
//
// The MMA's M side is W's rows, its N side the tokens (rows of X): m16n8k16 with A = 16 rows of W
// by 16 columns, B = 16 columns by 8 tokens. So one to eight tokens cost one MMA per 16 x 16
// weights, and W, the only large operand, is read once per token tile.
//
// Why it is shaped this way:
//   - Columns are permuted inside a 128-column chunk so that each lane's operands come from one
//     16-byte load of codes per row: lane (g = lane / 4, t = lane % 4) holds columns
//     32 t .. 32 t + 31 of rows g and g + 8, and MMA step s of the chunk takes columns
//     32 t + 4 s + {0, 1} into its k slots 2 t, 2 t + 1 and 32 t + 4 s + {2, 3} into 2 t + 8,
//     2 t + 9. B is loaded with the same permutation (8 bytes of x per token and step), so the
//     product is unchanged: only which column meets which k slot moves, and that is fixed by k.
//     With k % 32 == 0 and blocksizes >= 32, a lane's 32 columns of a row share one absmax.
//   - Decode, two weights per shared load: a pair table holds, for every byte value b,
//     (value[b >> 4], value[b & 15]) (element 2i is the high nibble of byte i), in 16 copies so
//     that each half-warp's 8-byte loads fall in distinct banks (32 KB: three CTAs fit an SM).
//     Per weight: half a PRMT and shift, half an LDS.64, one FMUL and half a CVT (two floats to a
//     packed 16-bit pair).
//   - k is summed in S parts of consecutive chunks, each from zero, and the parts' sums are added
//     in part order. Either the S warps of a row tile take a part each (a CTA holds 8 / S tiles)
//     and part 0 adds the others' sums from shared memory, or one warp takes all parts in turn:
//     the same additions. S depends on k only (gemv_mma_split), never on m or n: with the fixed chunk
//     order inside each part, every output's sequence of MMAs and additions is a function of k and
//     the blocksize, whatever m, the token tile or the launch: batch-invariant and repeatable.
//   - Each lane copies its codes and absmax kStages - 1 chunks ahead into its own slots of a ring
//     in shared memory (cp.async, L2 evict-first: W is read once), so waiting for its own copy
//     groups is the only synchronization.
// Shapes the vector path cannot take (k % 32 != 0, codes or x not 16-byte aligned) decode element
// by element through the same fragment layout, so both paths give the same bits. Four kernels run
// the vector path with the same MMAs in the same order: the ring kernel, the streaming kernel
// below it, which does less work around each MMA (chosen up to 16 tokens), the wide kernel, which
// stages x per CTA and decodes W once per 32 or 64 tokens, and on sm_90 the warpgroup kernel, the
// wide kernel with one wgmma per step for 64 or 128 tokens, whose 64-token form can also spread an
// item's parts of k over the CTAs of a cluster, and its 256-token form, whose total lives in shared
// memory (past 16 tokens the kernel whose waves of items take the least modelled time;
// automatic_wide, with the models, in gemv_mma_model.h).
//
// Each kernel family and its plan is a header, each including the one before: gemv_mma_common.cuh
// (geometry, instructions, tables, launch planning), gemv_mma_ring.cuh, gemv_mma_stream.cuh,
// gemv_mma_wide.cuh, gemv_mma_wgmma.cuh, gemv_mma_wgmma256.cuh. This file holds the automatic choice
// and the entry points.
#include "backends/cuda/gemv_mma_wgmma256.cuh"

namespace nf4::cuda {
namespace {

// The automatic choice's kernel (gemv_mma_model.h) as the launch names it.
GemvMmaKernel to_kernel(WideKernel k) {
  switch (k) {
    case WideKernel::stream2: return GemvMmaKernel::stream2;
    case WideKernel::wide32: return GemvMmaKernel::wide32;
    case WideKernel::wide64: return GemvMmaKernel::wide64;
    case WideKernel::wgmma64: return GemvMmaKernel::wgmma64;
    case WideKernel::wgmma128: return GemvMmaKernel::wgmma128;
    case WideKernel::wgmma64_cluster: return GemvMmaKernel::wgmma64_cluster;
    case WideKernel::wgmma64_split: return GemvMmaKernel::wgmma64_split;
    case WideKernel::wgmma128_split: return GemvMmaKernel::wgmma128_split;
    case WideKernel::wgmma256: return GemvMmaKernel::wgmma256;
  }
  return GemvMmaKernel::stream2;
}

// The cluster form's modelled time for `a` where it can run (an sm_90a build on sm_90, k in more
// than one part), its launch planned into `plan`; else infinite.
template <nf4_dtype XD>
double wide_cluster_time(const GemvArgs& a, int cc, int sms, GemvKernelLaunch* plan) {
  if (!gemv_wgmma_available(cc) || a.log2_split == 0) return 1e300;
  return plan_wgmma<XD, 8, true>(a, sms, plan) == cudaSuccess ? cluster_launch_time(a, *plan, sms) : 1e300;
}

// The modelled time of a form that needs a workspace (for its part sums and x's image) where it
// can run: an sm_90a build on sm_90 and `workspace` bytes that hold what it asks for; else
// infinite. plan(args, launch, time): the form's planner, on a copy of `a`.
template <class Plan>
double workspace_form_time(const GemvArgs& a, int cc, std::size_t workspace, Plan plan) {
  if (!gemv_wgmma_available(cc)) return 1e300;
  GemvArgs priced = a;
  GemvKernelLaunch launch;
  double time = 1e300;
  if (plan(priced, &launch, &time) != cudaSuccess || launch.workspace_bytes > workspace) return 1e300;
  return time;
}
template <nf4_dtype XD, int NT>
double wide_split_time(const GemvArgs& a, int cc, int sms, std::size_t workspace) {
  return workspace_form_time(a, cc, workspace, [&](GemvArgs& p, GemvKernelLaunch* l, double* t) { return plan_wgmma_split<XD, NT>(p, sms, l, 0, t); });
}
template <nf4_dtype XD>
double wide256_time(const GemvArgs& a, int cc, int sms, std::size_t workspace) {
  return workspace_form_time(a, cc, workspace, [&](GemvArgs& p, GemvKernelLaunch* l, double* t) { return plan_wgmma256<XD>(p, sms, l, 0, t); });
}

template <nf4_dtype XD>
cudaError_t plan_dtype(GemvArgs& a, bool k8, int cc, const GemvMmaChoice& c, int sms, std::size_t workspace, GemvKernelLaunch* out) {
  if (k8) {
    if constexpr (XD == NF4_DTYPE_F16)
      return a.vector ? plan_tiles<XD, true, true>(a, c.schedule, sms, out) : plan_tiles<XD, false, true>(a, c.schedule, sms, out);
    return cudaErrorInvalidValue;
  }
  if (!a.vector) {
    if (c.kernel == GemvMmaKernel::stream1 || c.kernel == GemvMmaKernel::stream2) return cudaErrorInvalidValue;
    return plan_tiles<XD, false, false>(a, c.schedule, sms, out);
  }
  GemvMmaKernel kernel = c.kernel;
  if (c.stream_warps != 0 && kernel != GemvMmaKernel::stream1) return cudaErrorInvalidValue;
  // The streaming kernel offsets columns in 32 bits. It holds up to two token tiles per warp;
  // more tokens are more work items (W decoded once per 16 tokens, from L2 after the first).
  const bool streams = a.k < (std::int64_t{1} << 31);
  if (kernel == GemvMmaKernel::automatic) {
    // Two row tiles per warp (x read once for both) where the weight gives every SM its warps
    // (8192 rows or more, or a weight of 2^25 weights or more: 4096x14336 takes two tiles, 4096x4096
    // one) and x is read for more than a few tokens (H200 and H100 A/Bs, docs/PERFORMANCE_LOG.md).
    const bool large = a.n >= 8192 || a.n * a.k >= (std::int64_t{1} << 25);
    GemvKernelLaunch cluster_plan;  // the cluster form's launch, planned to be priced
    kernel = !streams       ? GemvMmaKernel::ring
             : a.m > 16     ? to_kernel(automatic_wide(a.n, a.k, a.m, sms, gemv_wgmma_available(cc),
                                                       wide_cluster_time<XD>(a, cc, sms, &cluster_plan), wide_split_time<XD, 8>(a, cc, sms, workspace),
                                                       wide_split_time<XD, 16>(a, cc, sms, workspace), wide256_time<XD>(a, cc, sms, workspace)))
             : a.m > 4 && large ? GemvMmaKernel::stream2
                                : GemvMmaKernel::stream1;
    if (kernel == GemvMmaKernel::wgmma64_cluster) {
      *out = cluster_plan;
      return cudaSuccess;
    }
  }
  if (kernel == GemvMmaKernel::ring) return plan_tiles<XD, true, false>(a, c.schedule, sms, out);
  if (!streams) return cudaErrorInvalidValue;
  if (kernel == GemvMmaKernel::wgmma64_split || kernel == GemvMmaKernel::wgmma128_split || kernel == GemvMmaKernel::wgmma256) {
    // Parts per CTA are the forms' own choice.
    if (c.schedule == GemvMmaSchedule::split) return cudaErrorInvalidValue;
    if (!gemv_wgmma_available(cc)) return cudaErrorInvalidConfiguration;
    const cudaError_t e = kernel == GemvMmaKernel::wgmma64_split    ? plan_wgmma_split<XD, 8>(a, sms, out, c.cluster_parts)
                          : kernel == GemvMmaKernel::wgmma128_split ? plan_wgmma_split<XD, 16>(a, sms, out, c.cluster_parts)
                                                                    : plan_wgmma256<XD>(a, sms, out, c.cluster_parts);
    // Without room for what its workspace holds it cannot run: refused when forced (a test, an A/B).
    return e == cudaSuccess && out->workspace_bytes > workspace ? cudaErrorInvalidValue : e;
  }
  const bool wgmma = kernel == GemvMmaKernel::wgmma64 || kernel == GemvMmaKernel::wgmma128 || kernel == GemvMmaKernel::wgmma64_cluster;
  if (wgmma || kernel == GemvMmaKernel::wide32 || kernel == GemvMmaKernel::wide64) {
    // They take every part in turn: a forced split is refused, an automatic choice ignores it.
    if (c.schedule == GemvMmaSchedule::split && c.kernel != GemvMmaKernel::automatic) return cudaErrorInvalidValue;
    // The warpgroup kernels are sm_90a machine code only (PTX of an earlier target run on a later
    // GPU has none).
    if (wgmma && !gemv_wgmma_available(cc)) return cudaErrorInvalidConfiguration;
    const cudaError_t e = kernel == GemvMmaKernel::wide32            ? plan_wide<XD, 4>(a, sms, out)
                          : kernel == GemvMmaKernel::wide64          ? plan_wide<XD, 8>(a, sms, out)
                          : kernel == GemvMmaKernel::wgmma64         ? plan_wgmma<XD, 8, false>(a, sms, out)
                          : kernel == GemvMmaKernel::wgmma128        ? plan_wgmma<XD, 16, false>(a, sms, out)
                                                                     : plan_wgmma<XD, 8, true>(a, sms, out, c.cluster_parts);
    // Chosen automatically on a device whose shared memory cannot hold its stages: stream instead.
    if (e != cudaErrorInvalidConfiguration || c.kernel != GemvMmaKernel::automatic) return e;
    kernel = GemvMmaKernel::stream2;
  }
  if (kernel == GemvMmaKernel::stream2) {
    // x staged through shared memory where the device holds it beside the table (169 KB up to 8
    // tokens, 225 KB up to 16: sm_90), else in registers; the same sums either way.
    cudaError_t e = a.m <= 8 ? plan_stream_schedule<XD, 1, 2, true>(a, c.schedule, sms, out)
                             : plan_stream_schedule<XD, 2, 2, true>(a, c.schedule, sms, out);
    if (e == cudaErrorInvalidConfiguration)
      e = a.m <= 8 ? plan_stream_schedule<XD, 1, 2>(a, c.schedule, sms, out) : plan_stream_schedule<XD, 2, 2>(a, c.schedule, sms, out);
    // Chosen automatically on a device whose shared memory cannot hold even that (sm_86/89: 99 KB):
    // one row tile per warp.
    if (e != cudaErrorInvalidConfiguration || c.kernel != GemvMmaKernel::automatic) return e;
  }
  // One row tile per warp: x staged likewise where the device holds it (217 KB up to 8 tokens, 193
  // KB up to 16: sm_90), else in registers (121 KB up to 8 tokens, 97 KB up to 16: sm_80); up to 8
  // tokens in 8 warps where not even that fits (93 KB: sm_86/89).
  if (c.stream_warps != 0) {
    if (c.stream_warps != 8 || a.m > 8) return cudaErrorInvalidValue;
    return plan_stream_schedule<XD, 1, 1, false, 8>(a, c.schedule, sms, out);
  }
  cudaError_t e = a.m <= 8 ? plan_stream_schedule<XD, 1, 1, true>(a, c.schedule, sms, out) : plan_stream_schedule<XD, 2, 1, true>(a, c.schedule, sms, out);
  if (e != cudaErrorInvalidConfiguration) return e;
  if (a.m > 8) return plan_stream_schedule<XD, 2, 1>(a, c.schedule, sms, out);
  e = plan_stream_schedule<XD, 1, 1>(a, c.schedule, sms, out);
  return e == cudaErrorInvalidConfiguration ? plan_stream_schedule<XD, 1, 1, false, 8>(a, c.schedule, sms, out) : e;
}

}  // namespace

int gemv_mma_split(std::int64_t k) { return split_parts(k); }

bool gemv_wgmma_available(int cc) { return kWgmmaBuilt && cc == 90; }

bool gemv_mma_available(int cc, nf4_dtype x_dtype) {
  return cc >= 80 ? (x_dtype == NF4_DTYPE_F16 || x_dtype == NF4_DTYPE_BF16) : cc >= 75 && x_dtype == NF4_DTYPE_F16;
}

cudaError_t plan_gemv_mma(GemvArgs& a, nf4_dtype x_dtype, int cc, const GemvMmaChoice& choice, int sms, std::size_t workspace, GemvKernelLaunch* out) {
  if (!gemv_mma_available(cc, x_dtype)) return cudaErrorInvalidConfiguration;
  a.log2_split = static_cast<std::uint8_t>(split_log2(a.k));
  const bool k8 = choice.k8 || cc < 80;
  return x_dtype == NF4_DTYPE_F16 ? plan_dtype<NF4_DTYPE_F16>(a, k8, cc, choice, sms, workspace, out)
                                  : plan_dtype<NF4_DTYPE_BF16>(a, k8, cc, choice, sms, workspace, out);
}

}  // namespace nf4::cuda
