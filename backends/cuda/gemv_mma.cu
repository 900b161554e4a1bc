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
//     that each half-warp's 8-byte loads fall in distinct banks. Per weight: half a PRMT, half an
//     LDS.64, one FMUL and half a CVT (two floats to a packed 16-bit pair).
//   - A CTA of 8 warps holds R = 8 / S row tiles of 16 rows; the S warps of a tile take its chunks
//     in turn (chunk c to part c % S) and their fp32 partial tiles are added in part order, in
//     shared memory. S depends on k only (gemv_mma_split), never on m or n: with the fixed chunk
//     order inside each part, every output's sequence of MMAs and additions is a function of k and
//     the blocksize, whatever m, the token tile or the launch: batch-invariant and repeatable.
//   - The next chunk's codes and absmax are loaded before the current one is decoded (two register
//     stages), with L1::no_allocate and an L2 evict-first policy: W is read once.
// Shapes the vector path cannot take (k % 32 != 0, codes or x not 16-byte aligned) decode element
// by element through the same fragment layout, so both paths give the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/gemv_launch.h"
#include "core/gemv.h"

namespace nf4::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kChunkCols = 128;  // columns per warp per chunk: 32 per lane group of 4
constexpr int kTileRows = 16;    // rows of W per MMA tile
constexpr int kCopies = 16;      // pair table copies: one per lane of a half-warp
constexpr int kPairTableBytes = 256 * kCopies * 8;

// Which architectures have code for a variant: bf16 MMAs from sm_80, fp16 from sm_75 (K8: two
// m16n8k8 per k16 step, the shape sm_75 has).
template <nf4_dtype XD, bool K8>
__host__ __device__ constexpr bool mma_has_code(int arch) {
  return K8 ? XD == NF4_DTYPE_F16 && arch >= 750 : arch >= 800;
}
template <nf4_dtype XD, bool K8>
__device__ constexpr bool mma_compiled() {
#if defined(__CUDA_ARCH__)
  return mma_has_code<XD, K8>(__CUDA_ARCH__);
#else
  return true;
#endif
}

// Two fp32 values rounded to nearest even into a packed pair of x's dtype, the first in the low half.
template <nf4_dtype XD>
__device__ __forceinline__ std::uint32_t pack_pair(float lo, float hi) {
  if constexpr (XD == NF4_DTYPE_F16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    const __half2_raw r = h;
    return static_cast<std::uint32_t>(r.x) | (static_cast<std::uint32_t>(r.y) << 16);
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    const __nv_bfloat162_raw r = h;
    return static_cast<std::uint32_t>(r.x) | (static_cast<std::uint32_t>(r.y) << 16);
#else
    return static_cast<std::uint32_t>(bf16_from_bits(__float_as_uint(lo))) | (static_cast<std::uint32_t>(bf16_from_bits(__float_as_uint(hi))) << 16);
#endif
  }
}

// D += A B for one k16 step. a[0..3]: rows g / g + 8 at k slots 2t.. and 2t + 8..; b[0..1]: k slots
// 2t.. and 2t + 8.. of token g. K8: the same step as two m16n8k8 (slots 0-7, then 8-15).
template <nf4_dtype XD, bool K8>
__device__ __forceinline__ void mma16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  if constexpr (K8) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[2]), "r"(a[3]), "r"(b1));
  } else if constexpr (XD == NF4_DTYPE_F16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  (void)d, (void)a, (void)b0, (void)b1;
#endif
}

// One row's part of a chunk for one lane: its 32 codes and their absmax.
struct RowCodes {
  uint4 codes;
  float scale;    // flat: the absmax; nested: the block's nested absmax
  unsigned code;  // nested: the block's 8-bit absmax code
  bool live;      // inside W: otherwise every weight is 0
};

// NT: 8-token tiles per warp; VEC: the vector path (k % 32 == 0, codes and x 16-byte aligned);
// K8: m16n8k8 steps (sm_75).
template <nf4_dtype XD, int NT, bool VEC, bool K8>
__global__ void __launch_bounds__(kThreads, (K8 || NT >= 4) ? 1 : 2) gemv_mma_kernel(const __grid_constant__ GemvArgs a) {
  if constexpr (!mma_compiled<XD, K8>()) {
    (void)a;
    __trap();
  } else {
  extern __shared__ __align__(16) unsigned char smem[];
  float* code2 = reinterpret_cast<float*>(smem + kPairTableBytes);
  float* values = code2 + 256;
  float* partial = values + 16;  // [kWarps][4 NT][32]: each warp's accumulators, for the part sum
  const unsigned tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const unsigned g = lane / 4, t = lane % 4;

  for (unsigned b = tid; b < 256; b += kThreads) {
    const float hi = a.quant_map ? __ldg(a.quant_map + (b >> 4)) : a.fp4_table[b >> 4];
    const float lo = a.quant_map ? __ldg(a.quant_map + (b & 15)) : a.fp4_table[b & 15];
    float2* row = reinterpret_cast<float2*>(smem) + b * kCopies;
#pragma unroll
    for (int j = 0; j < kCopies; ++j) row[j] = make_float2(hi, lo);
    if (a.nested) code2[b] = __ldg(a.nested_code + b);
    if (b < 16) values[b] = a.quant_map ? __ldg(a.quant_map + b) : a.fp4_table[b];
  }
  __syncthreads();

  const std::int64_t n = a.n, k = a.k;
  const std::uint64_t uk = static_cast<std::uint64_t>(k);
  const unsigned lbs = a.log2_blocksize, lnbs = a.log2_nested_blocksize;
  const unsigned S = 1u << a.log2_split, R = kWarps / S;
  const unsigned tile_in_cta = warp / S, part = warp % S;
  const std::int64_t chunks = (k + kChunkCols - 1) / kChunkCols;
  const std::int64_t row_blocks = (n + static_cast<std::int64_t>(R) * kTileRows - 1) / (static_cast<std::int64_t>(R) * kTileRows);
  const std::int64_t token_tiles = (a.m + 8 * NT - 1) / (8 * NT);
  const std::int64_t items = row_blocks * token_tiles;
  const float offset = a.nested ? (a.offset_ptr ? __ldg(a.offset_ptr) : a.offset_value) : 0.0f;
  const std::uint64_t policy = evict_first_policy();
  const float2* pairs = reinterpret_cast<const float2*>(smem) + (lane % kCopies);
  const auto scale_of = [&](const RowCodes& rc) {
    return !rc.live ? 0.0f : a.nested ? __fadd_rn(__fmul_rn(code2[rc.code], rc.scale), offset) : rc.scale;
  };
  // The weight at (row, col) for the element path, fp32 as nf4_dequantize computes it; 0 outside W.
  const auto weight_at = [&](std::int64_t row, std::int64_t col) -> float {
    if (row >= n || col >= k) return 0.0f;
    const std::uint64_t e = static_cast<std::uint64_t>(row) * uk + static_cast<std::uint64_t>(col), b = e >> lbs;
    const unsigned byte = __ldg(a.packed + (e >> 1));
    const unsigned q = (e & 1) ? (byte & 15u) : (byte >> 4);
    const float am = a.nested ? __fadd_rn(__fmul_rn(code2[__ldg(static_cast<const std::uint8_t*>(a.absmax) + b)], __ldg(a.nested_absmax + (b >> lnbs))), offset)
                              : __ldg(static_cast<const float*>(a.absmax) + b);
    return __fmul_rn(values[q], am);
  };
  const auto x_half = [&](std::int64_t tok, std::int64_t col) -> std::uint32_t {
    if (tok >= a.m || col >= k) return 0u;
    return __ldg(static_cast<const unsigned short*>(a.x) + tok * k + col);
  };

  for (std::int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const std::int64_t rb = item / token_tiles, tt = item % token_tiles;
    const std::int64_t row0 = (rb * R + tile_in_cta) * kTileRows;
    const std::int64_t tok0 = tt * 8 * NT;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    if (row0 < n) {
      const std::int64_t r_lo = row0 + g, r_hi = row0 + g + 8;
      // Loads of chunk c's codes for one row (zeros past n or k).
      const auto load_row = [&](RowCodes& rc, std::int64_t row, std::int64_t c) {
        const std::uint64_t col = static_cast<std::uint64_t>(c) * kChunkCols + 32 * t;
        rc.codes = make_uint4(0, 0, 0, 0);
        rc.scale = 0.0f;
        rc.code = 0;
        rc.live = row < n && col < uk;
        if (rc.live) {
          const std::uint64_t e = static_cast<std::uint64_t>(row) * uk + col, b = e >> lbs;
          rc.codes = load_stream16(a.packed + (e >> 1), policy);
          if (a.nested) {
            rc.code = __ldg(static_cast<const std::uint8_t*>(a.absmax) + b);
            rc.scale = __ldg(a.nested_absmax + (b >> lnbs));
          } else {
            rc.scale = __ldg(static_cast<const float*>(a.absmax) + b);
          }
        }
      };
      RowCodes cur[2] = {}, nxt[2] = {};
      std::int64_t c = part;
      if constexpr (VEC) {
        if (c < chunks) load_row(cur[0], r_lo, c), load_row(cur[1], r_hi, c);
      }
#pragma unroll 1
      for (; c < chunks; c += S) {
        const std::int64_t cn = c + S;
        if constexpr (VEC) {
          if (cn < chunks) load_row(nxt[0], r_lo, cn), load_row(nxt[1], r_hi, cn);
        }
        const std::int64_t colbase = c * kChunkCols + 32 * t;
        float am_lo = 0.0f, am_hi = 0.0f;
        if constexpr (VEC) am_lo = scale_of(cur[0]), am_hi = scale_of(cur[1]);
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          std::uint32_t af[4];
          if constexpr (VEC) {
            // Bytes 2s and 2s + 1 of the lane's 16: columns 4s .. 4s + 3.
            const std::uint32_t wl = s < 2 ? cur[0].codes.x : s < 4 ? cur[0].codes.y : s < 6 ? cur[0].codes.z : cur[0].codes.w;
            const std::uint32_t wh = s < 2 ? cur[1].codes.x : s < 4 ? cur[1].codes.y : s < 6 ? cur[1].codes.z : cur[1].codes.w;
            const unsigned sh = (s & 1) * 16;
            const float2 p0 = pairs[((wl >> sh) & 0xffu) * kCopies], p1 = pairs[((wl >> (sh + 8)) & 0xffu) * kCopies];
            const float2 q0 = pairs[((wh >> sh) & 0xffu) * kCopies], q1 = pairs[((wh >> (sh + 8)) & 0xffu) * kCopies];
            af[0] = pack_pair<XD>(__fmul_rn(p0.x, am_lo), __fmul_rn(p0.y, am_lo));
            af[1] = pack_pair<XD>(__fmul_rn(q0.x, am_hi), __fmul_rn(q0.y, am_hi));
            af[2] = pack_pair<XD>(__fmul_rn(p1.x, am_lo), __fmul_rn(p1.y, am_lo));
            af[3] = pack_pair<XD>(__fmul_rn(q1.x, am_hi), __fmul_rn(q1.y, am_hi));
          } else {
            const std::int64_t col = colbase + 4 * s;
            af[0] = pack_pair<XD>(weight_at(r_lo, col), weight_at(r_lo, col + 1));
            af[1] = pack_pair<XD>(weight_at(r_hi, col), weight_at(r_hi, col + 1));
            af[2] = pack_pair<XD>(weight_at(r_lo, col + 2), weight_at(r_lo, col + 3));
            af[3] = pack_pair<XD>(weight_at(r_hi, col + 2), weight_at(r_hi, col + 3));
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const std::int64_t tok = tok0 + 8 * j + g, col = colbase + 4 * s;
            std::uint32_t b0 = 0, b1 = 0;
            if constexpr (VEC) {
              if (tok < a.m && col < k) {
                const uint2 u = __ldg(reinterpret_cast<const uint2*>(static_cast<const unsigned short*>(a.x) + tok * k + col));
                b0 = u.x, b1 = u.y;
              }
            } else {
              b0 = x_half(tok, col) | (x_half(tok, col + 1) << 16);
              b1 = x_half(tok, col + 2) | (x_half(tok, col + 3) << 16);
            }
            mma16<XD, K8>(acc[j], af, b0, b1);
          }
        }
        if constexpr (VEC) cur[0] = nxt[0], cur[1] = nxt[1];
      }
    }

    // The parts' sums, added in part order by part 0 (the same order for every item and launch).
    if (S > 1) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[(warp * 4 * NT + j * 4 + i) * kWarp + lane] = acc[j][i];
      __syncthreads();
      if (part == 0) {
        for (unsigned p = 1; p < S; ++p)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][i] = __fadd_rn(acc[j][i], partial[((warp + p) * 4 * NT + j * 4 + i) * kWarp + lane]);
      }
      __syncthreads();  // partial is rewritten by the next item
    }
    if (part == 0 && row0 < n) {
      // C fragment: acc[j][0..1] = rows g, tokens 2t, 2t + 1 of tile j; acc[j][2..3] = row g + 8.
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const std::int64_t row = row0 + g + (i >= 2 ? 8 : 0), tok = tok0 + 8 * j + 2 * t + (i & 1);
          if (row < n && tok < a.m) store_value(acc[j][i], a.y, tok * n + row, a.y_dtype);
        }
    }
  }
  }
}

// Per kernel: the dynamic shared memory allowance raised once per device, the occupancy once.
struct MmaLaunchCache {
  std::mutex mu;
  bool raised[64] = {};
  int blocks[64] = {};
};

std::size_t mma_shared_bytes(int nt) { return kPairTableBytes + (256 + 16) * sizeof(float) + static_cast<std::size_t>(kWarps) * 4 * nt * kWarp * sizeof(float); }

template <nf4_dtype XD, int NT, bool VEC, bool K8>
cudaError_t plan_variant(const GemvArgs& a, int sms, GemvKernelLaunch* out) {
  static MmaLaunchCache cache;
  const void* fn = reinterpret_cast<const void*>(&gemv_mma_kernel<XD, NT, VEC, K8>);
  const std::size_t smem = mma_shared_bytes(NT);
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device >= 64) return cudaErrorInvalidDevice;
  int blocks = 0;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (!cache.raised[device]) {
      // A build whose code for this device is a trap stub (compute_75 PTX run on a newer GPU for a
      // bf16 variant) has nothing to run: the caller reports the exact contract instead.
      cudaFuncAttributes attr{};
      if (cudaError_t e = cudaFuncGetAttributes(&attr, fn); e != cudaSuccess) return e;
      if (!mma_has_code<XD, K8>(attr.ptxVersion * 10)) return cudaErrorInvalidConfiguration;
      if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)); e != cudaSuccess) return e;
      if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cache.blocks[device], fn, kThreads, smem); e != cudaSuccess) return e;
      if (cache.blocks[device] < 1) return cudaErrorInvalidConfiguration;
      cache.raised[device] = true;
    }
    blocks = cache.blocks[device];
  }
  const std::int64_t R = kWarps >> a.log2_split;
  const std::int64_t items = (a.n + R * kTileRows - 1) / (R * kTileRows) * ((a.m + 8 * NT - 1) / (8 * NT));
  const std::int64_t resident = static_cast<std::int64_t>(blocks) * sms;
  out->fn = fn;
  out->threads = kThreads;
  out->smem = smem;
  out->grid = static_cast<unsigned>(items < resident ? items : resident);
  return cudaSuccess;
}

template <nf4_dtype XD, bool VEC, bool K8>
cudaError_t plan_tiles(const GemvArgs& a, int sms, GemvKernelLaunch* out) {
  // Token tiles per warp by m: W is decoded once per tile, the accumulators are 4 registers per 8 tokens.
  if (a.m <= 8) return plan_variant<XD, 1, VEC, K8>(a, sms, out);
  if (a.m <= 16) return plan_variant<XD, 2, VEC, K8>(a, sms, out);
  if (a.m <= 32) return plan_variant<XD, 4, VEC, K8>(a, sms, out);
  return plan_variant<XD, 8, VEC, K8>(a, sms, out);
}

template <nf4_dtype XD>
cudaError_t plan_dtype(const GemvArgs& a, bool k8, int sms, GemvKernelLaunch* out) {
  if (k8) {
    if constexpr (XD == NF4_DTYPE_F16) return a.vector ? plan_tiles<XD, true, true>(a, sms, out) : plan_tiles<XD, false, true>(a, sms, out);
    return cudaErrorInvalidValue;
  }
  return a.vector ? plan_tiles<XD, true, false>(a, sms, out) : plan_tiles<XD, false, false>(a, sms, out);
}

}  // namespace

int gemv_mma_split(std::int64_t k) {
  // Parts of at least 8 chunks each (a part's loads stay pipelined), up to the CTA's 8 warps. A
  // function of k alone: the sum order may depend on nothing else.
  const std::int64_t chunks = (k + kChunkCols - 1) / kChunkCols;
  int split = 1;
  while (split < kWarps && chunks >= 16 * split) split *= 2;
  return split;
}

bool gemv_mma_available(int cc, nf4_dtype x_dtype) {
  return cc >= 80 ? (x_dtype == NF4_DTYPE_F16 || x_dtype == NF4_DTYPE_BF16) : cc >= 75 && x_dtype == NF4_DTYPE_F16;
}

cudaError_t plan_gemv_mma(GemvArgs& a, nf4_dtype x_dtype, int cc, bool force_k8, int sms, GemvKernelLaunch* out) {
  if (!gemv_mma_available(cc, x_dtype)) return cudaErrorInvalidConfiguration;
  int split = gemv_mma_split(a.k), log2 = 0;
  while ((1 << log2) < split) ++log2;
  a.log2_split = static_cast<std::uint8_t>(log2);
  const bool k8 = force_k8 || cc < 80;
  return x_dtype == NF4_DTYPE_F16 ? plan_dtype<NF4_DTYPE_F16>(a, k8, sms, out) : plan_dtype<NF4_DTYPE_BF16>(a, k8, sms, out);
}

}  // namespace nf4::cuda
