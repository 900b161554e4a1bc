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
// item's parts of k over the CTAs of a cluster (past 16 tokens the kernel whose waves of items
// take the least modelled time; automatic_wide).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "backends/cuda/bulk_copy.cuh"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/gemv_launch.h"
#include "core/gemv.h"

namespace nf4::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kChunkCols = 128;  // columns per warp per chunk: 32 per lane group of 4
// Chunks of k, the last one partial where k % 128 != 0.
__host__ __device__ constexpr std::int64_t chunk_count(std::int64_t k) { return (k + kChunkCols - 1) / kChunkCols; }
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

// Asynchronous copies into shared memory (sm_80+): each lane copies its own codes and absmax
// words into its own slots of a ring and later reads back only those, so waiting for its own copy
// groups (cp.async.wait_group) is the only synchronization. Below sm_80 the copy is a plain load
// and store (no pipelining; sm_75 runs this kernel for fp16 only).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool live, std::uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  // src-size 0 fills the slot with zeros without reading (rows past n, columns past k).
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(d), "l"(src), "r"(live ? 16 : 0), "l"(policy));
#else
  (void)policy;
  *static_cast<uint4*>(dst) = live ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void copy4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
#else
  *static_cast<std::uint32_t*>(dst) = __ldg(static_cast<const std::uint32_t*>(src));
#endif
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}
template <int N>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

constexpr int kStages = 3;  // chunks of codes in flight per warp (ring slots)

// Which decode a token-tile count uses (the same weights either way): register lookup tables
// (true) or the pair table in shared memory (false).
template <int NT>
inline constexpr bool kMmaLut = NT >= 4;

// The register decode: per row and chunk, the 16 weights a code can give (value(q) * absmax,
// rounded to x's dtype exactly as nf4_dequantize writes it) as byte planes, lb[i] the low bytes and
// hb[i] the high bytes of weights 4i .. 4i + 3; four codes are then looked up with byte permutes alone.
struct Lut {
  std::uint32_t lb[4], hb[4];
};
template <nf4_dtype XD>
__device__ __forceinline__ Lut build_lut(const float (&v)[16], float am) {
  std::uint32_t tw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) tw[i] = pack2<XD>(__fmul_rn(v[2 * i], am), __fmul_rn(v[2 * i + 1], am));
  Lut lt;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lt.lb[i] = __byte_perm(tw[2 * i], tw[2 * i + 1], 0x6420);
    lt.hb[i] = __byte_perm(tw[2 * i], tw[2 * i + 1], 0x7531);
  }
  return lt;
}
// The codes of half-word h (nibbles: element 4s + 1, 4s, 4s + 3, 4s + 2, low first) to the A
// fragment's pairs (4s, 4s + 1) and (4s + 2, 4s + 3). A permute takes a 3-bit index per byte:
// entries 0-7 and 8-15 are looked up apart, then bit 3 of each code picks (4 + k for byte k).
__device__ __forceinline__ void lut_pairs(const Lut& lt, std::uint32_t h, std::uint32_t& p01, std::uint32_t& p23) {
  const std::uint32_t s1 = h & 0x7777u, s2 = ((h >> 1) & 0x4444u) | 0x3210u;
  const std::uint32_t lr = __byte_perm(__byte_perm(lt.lb[0], lt.lb[1], s1), __byte_perm(lt.lb[2], lt.lb[3], s1), s2);
  const std::uint32_t hr = __byte_perm(__byte_perm(lt.hb[0], lt.hb[1], s1), __byte_perm(lt.hb[2], lt.hb[3], s1), s2);
  p01 = __byte_perm(lr, hr, 0x4051);
  p23 = __byte_perm(lr, hr, 0x6273);
}

// One lane's ring slots, [stage][row][lane] so that a warp's reads of one field are contiguous.
struct Ring {
  uint4 codes[kStages][2][kWarp];
  std::uint32_t absmax[kStages][2][kWarp];  // flat: the absmax's bits; nested: the 4-byte word holding the code
  float nested[kStages][2][kWarp];          // nested: the block's nested absmax
};

// A launch's work items, the same on the host (grid size) and in both kernels (item walk): row
// blocks of `rows` rows for each of a CTA's `groups` warp groups, times token tiles of 8 NT
// tokens; item = row block * token_tiles + token tile.
struct ItemGrid {
  std::int64_t token_tiles, items;
};
__host__ __device__ constexpr ItemGrid item_grid(std::int64_t n, std::int64_t m, std::int64_t groups, std::int64_t rows, int nt) {
  const std::int64_t token_tiles = (m + 8 * nt - 1) / (8 * nt);
  return {token_tiles, (n + groups * rows - 1) / (groups * rows) * token_tiles};
}

// How a CTA's `warps` warps share k, in every kernel: S parts (S from k alone) of `span`
// consecutive chunks, part p being chunks [p span, (p + 1) span). Split: the S warps of a row group
// take a part each, R = warps / S groups per CTA; else each warp takes every part in turn, R = warps
// groups.
struct PartPlan {
  unsigned S, R, group, part;  // parts, row groups per CTA, this warp's group and part
  std::int64_t chunks, span;
};
__device__ __forceinline__ PartPlan part_plan(const GemvArgs& a, unsigned warp, bool split, unsigned warps = kWarps) {
  PartPlan p;
  p.S = 1u << a.log2_split;
  const unsigned warps_per_group = split ? p.S : 1u;
  p.R = warps / warps_per_group;
  p.group = warp / warps_per_group;
  p.part = warp % warps_per_group;
  p.chunks = chunk_count(a.k);
  p.span = (p.chunks + p.S - 1) / p.S;
  return p;
}

// NT: 8-token tiles per warp; SPLIT: the S warps of a tile take one part of k each and part 0 adds
// their sums (few row tiles), else each warp takes all S parts in turn (many row tiles), with the
// same additions; VEC: the vector path (k % 32 == 0, codes and x 16-byte aligned); K8: m16n8k8
// steps (sm_75).
template <nf4_dtype XD, int NT, bool SPLIT, bool VEC, bool K8>
__global__ void __launch_bounds__(kThreads, K8 || NT >= 4 ? 1 : NT == 1 && SPLIT ? 3 : 2) gemv_mma_kernel(const __grid_constant__ GemvArgs a) {
  if constexpr (!mma_compiled<XD, K8>()) {
    (void)a;
    __trap();
  } else {
  wait_for_previous_grid();  // programmatic dependent launch (pdl.h): before any global access
  extern __shared__ __align__(16) unsigned char smem[];
  // The decode: per-row lookup tables in registers from 32 tokens on, the pair table below (H200:
  // the table 6-20% faster at 1 to 8 tokens, the registers 6-9% faster at 32; docs/PERFORMANCE_LOG.md).
  constexpr bool lut = kMmaLut<NT>;
  Ring* rings = reinterpret_cast<Ring*>(smem + (lut ? 0 : kPairTableBytes));
  float* code2 = reinterpret_cast<float*>(rings + kWarps);
  float* values = code2 + 256;
  const unsigned tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const unsigned g = lane / 4, t = lane % 4;

  // The pair table: entry (b, L) at byte b * 128 + 8 (L % 16), formed by one byte permute of a
  // code word and 16 (L % 16) and a shift (L: the lane; a half-warp's 8-byte reads, which the
  // hardware serves apart from the other half's, never share a bank).
  for (unsigned b = tid; b < 256; b += kThreads) {
    if constexpr (!lut) {
      const float hi = a.quant_map ? __ldg(a.quant_map + (b >> 4)) : a.fp4_table[b >> 4];
      const float lo = a.quant_map ? __ldg(a.quant_map + (b & 15)) : a.fp4_table[b & 15];
      float4* row = reinterpret_cast<float4*>(smem + b * (kCopies * 8));
#pragma unroll
      for (int j = 0; j < kCopies / 2; ++j) row[(j + b) % (kCopies / 2)] = make_float4(hi, lo, hi, lo);
    }
    if (a.nested) code2[b] = __ldg(a.nested_code + b);
    if (b < 16) values[b] = a.quant_map ? __ldg(a.quant_map + b) : a.fp4_table[b];
  }
  __syncthreads();

  const std::int64_t n = a.n, k = a.k;
  const std::uint64_t uk = static_cast<std::uint64_t>(k);
  const unsigned lbs = a.log2_blocksize, lnbs = a.log2_nested_blocksize;
  const PartPlan pp = part_plan(a, warp, SPLIT);
  const unsigned S = pp.S, R = pp.R, tile_in_cta = pp.group, my_part = pp.part;
  const std::int64_t chunks = pp.chunks, span = pp.span;
  const ItemGrid grid = item_grid(n, a.m, R, kTileRows, NT);
  const std::int64_t token_tiles = grid.token_tiles, items = grid.items;
  const float offset = a.nested ? (a.offset_ptr ? __ldg(a.offset_ptr) : a.offset_value) : 0.0f;
  const std::uint64_t policy = evict_first_policy();
  const std::uint32_t lane16 = (lane % kCopies) * 16;
  Ring& ring = rings[warp];
  // SPLIT: a warp's part sums, in its own ring once its copies are done ([4 NT][32] floats).
  static_assert(sizeof(Ring) >= 4 * NT * kWarp * sizeof(float), "the part sums fit a ring");
  const auto partial_of = [&](unsigned w) { return reinterpret_cast<float*>(rings + w); };
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
    const std::int64_t r_lo = row0 + g, r_hi = row0 + g + 8;
    // Flat index of each row's first element (the rows' products with k computed once per item).
    const std::uint64_t e_lo = static_cast<std::uint64_t>(r_lo) * uk, e_hi = e_lo + 8 * uk;
    float acc[NT][4], total[SPLIT ? 1 : NT][4];

    // Issues the copies of chunk c's codes and absmax for both rows into ring stage `st`, or an
    // empty group past the warp's last chunk (so that wait_group counts stay uniform).
    const auto issue = [&](int st, std::int64_t c, std::int64_t c_end) {
      if (c < c_end) {
        const std::uint64_t col = static_cast<std::uint64_t>(c) * kChunkCols + 32 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const std::int64_t row = h ? r_hi : r_lo;
          const bool live = row < n && col < uk;
          const std::uint64_t e = live ? (h ? e_hi : e_lo) + col : 0, b = e >> lbs;
          copy16(&ring.codes[st][h][lane], a.packed + (e >> 1), live, policy);
          if (a.nested) {
            // The aligned word holding the code where that word lies inside the array; a code in
            // the array's first or last bytes, whose word would run outside it, is read directly.
            const auto* codes = static_cast<const std::uint8_t*>(a.absmax);
            const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(codes + b), word = at & ~std::uintptr_t{3};
            if (word >= reinterpret_cast<std::uintptr_t>(codes) && word + 4 <= reinterpret_cast<std::uintptr_t>(codes + a.absmax_count))
              copy4(&ring.absmax[st][h][lane], reinterpret_cast<const void*>(word));
            else ring.absmax[st][h][lane] = static_cast<std::uint32_t>(__ldg(codes + b)) << (8 * (at & 3));
            copy4(&ring.nested[st][h][lane], a.nested_absmax + (b >> lnbs));
          } else {
            copy4(&ring.absmax[st][h][lane], static_cast<const float*>(a.absmax) + b);
          }
        }
      }
      copy_commit();
    };
    // The absmax of chunk c's row h from ring stage `st` (0 outside W: every weight 0 there).
    const auto scale_at = [&](int st, int h, std::int64_t c) -> float {
      const std::int64_t row = h ? r_hi : r_lo;
      const std::uint64_t col = static_cast<std::uint64_t>(c) * kChunkCols + 32 * t;
      if (!(row < n && col < uk)) return 0.0f;
      const std::uint32_t w = ring.absmax[st][h][lane];
      if (!a.nested) return __uint_as_float(w);
      const std::uint64_t e = (h ? e_hi : e_lo) + col, b = e >> lbs;
      const unsigned shift = 8 * (reinterpret_cast<std::uintptr_t>(static_cast<const std::uint8_t*>(a.absmax) + b) & 3);
      return __fadd_rn(__fmul_rn(code2[(w >> shift) & 0xffu], ring.nested[st][h][lane]), offset);
    };
    // One k16 step's A fragment for columns 4s .. 4s + 3 of the lane's 32 from the codes.
    const auto decode = [&](const uint4& lo, const uint4& hi, float am_lo, float am_hi, int s, std::uint32_t (&af)[4]) {
      const std::uint32_t wl = s < 2 ? lo.x : s < 4 ? lo.y : s < 6 ? lo.z : lo.w;
      const std::uint32_t wh = s < 2 ? hi.x : s < 4 ? hi.y : s < 6 ? hi.z : hi.w;
      // Byte i of a word to byte 1, 16 (L % 16) in byte 0 (< 256, so its byte 1 is 0), halved.
      const unsigned b0 = (s & 1) * 2, sel0 = 0x5504u | (b0 << 4), sel1 = 0x5504u | ((b0 + 1) << 4);
      const float2 p0 = *reinterpret_cast<const float2*>(smem + (__byte_perm(wl, lane16, sel0) >> 1));
      const float2 p1 = *reinterpret_cast<const float2*>(smem + (__byte_perm(wl, lane16, sel1) >> 1));
      const float2 q0 = *reinterpret_cast<const float2*>(smem + (__byte_perm(wh, lane16, sel0) >> 1));
      const float2 q1 = *reinterpret_cast<const float2*>(smem + (__byte_perm(wh, lane16, sel1) >> 1));
      af[0] = pack2<XD>(__fmul_rn(p0.x, am_lo), __fmul_rn(p0.y, am_lo));
      af[1] = pack2<XD>(__fmul_rn(q0.x, am_hi), __fmul_rn(q0.y, am_hi));
      af[2] = pack2<XD>(__fmul_rn(p1.x, am_lo), __fmul_rn(p1.y, am_lo));
      af[3] = pack2<XD>(__fmul_rn(q1.x, am_hi), __fmul_rn(q1.y, am_hi));
    };
    // One k16 step (columns 4s .. 4s + 3 of each lane's 32) against every token tile, with x's
    // two words per tile in xb.
    const auto step = [&](const std::uint32_t (&af)[4], const std::uint32_t (&xb)[NT][2]) {
#pragma unroll
      for (int j = 0; j < NT; ++j) mma16<XD, K8>(acc[j], af, xb[j][0], xb[j][1]);
    };
    // x's rows for this item's token tiles at the lane's first column (nullptr past m).
    const unsigned short* xrow[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const std::int64_t tok = tok0 + 8 * j + g;
      xrow[j] = tok < a.m ? static_cast<const unsigned short*>(a.x) + tok * k + 32 * t : nullptr;
    }
    // Part p's chunks into acc (from zero).
    const auto run_part = [&](std::int64_t p) {
#pragma unroll
      for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
      const std::int64_t c0 = p * span, c1 = c0 + span < chunks ? c0 + span : chunks;
      if (row0 >= n) return;
      if constexpr (VEC) {
#pragma unroll
        for (int st = 0; st < kStages - 1; ++st) issue(st, c0 + st, c1);
        for (std::int64_t base = c0; base < c1; base += kStages) {
#pragma unroll
          for (int st = 0; st < kStages; ++st) {
            const std::int64_t c = base + st;
            // The chunk kStages - 1 ahead goes into the slot freed by the previous step.
            issue((st + kStages - 1) % kStages, c + kStages - 1, c1);
            if (c < c1) {
              // x of the lane's 32 columns: four 16-byte loads per tile up to two tiles, else 8
              // bytes per step (registers); past k or m, zeros.
              const bool in_k = c * kChunkCols + 32 * t < k;
              uint4 xv[NT <= 2 ? NT : 1][4];
              if constexpr (NT <= 2) {
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                  for (int i = 0; i < 4; ++i)
                    xv[j][i] = xrow[j] && in_k ? __ldg(reinterpret_cast<const uint4*>(xrow[j] + c * kChunkCols) + i) : make_uint4(0, 0, 0, 0);
              }
              copy_wait<kStages - 1>();
              const uint4 lo = ring.codes[st][0][lane], hi = ring.codes[st][1][lane];
              const float am_lo = scale_at(st, 0, c), am_hi = scale_at(st, 1, c);
              Lut lut_lo{}, lut_hi{};
              if constexpr (lut) {
                float v[16];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  const float4 q = reinterpret_cast<const float4*>(values)[i];
                  v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
                }
                lut_lo = build_lut<XD>(v, am_lo);
                lut_hi = build_lut<XD>(v, am_hi);
              }
#pragma unroll
              for (int s = 0; s < 8; ++s) {
                std::uint32_t af[4], xb[NT][2];
                if constexpr (lut) {
                  const std::uint32_t wl = s < 2 ? lo.x : s < 4 ? lo.y : s < 6 ? lo.z : lo.w;
                  const std::uint32_t wh = s < 2 ? hi.x : s < 4 ? hi.y : s < 6 ? hi.z : hi.w;
                  lut_pairs(lut_lo, s % 2 ? wl >> 16 : wl, af[0], af[2]);
                  lut_pairs(lut_hi, s % 2 ? wh >> 16 : wh, af[1], af[3]);
                } else {
                  decode(lo, hi, am_lo, am_hi, s, af);
                }
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                  if constexpr (NT <= 2) {
                    const uint4& u = xv[j][s / 2];
                    xb[j][0] = s % 2 ? u.z : u.x;
                    xb[j][1] = s % 2 ? u.w : u.y;
                  } else {
                    const uint2 u = xrow[j] && in_k ? __ldg(reinterpret_cast<const uint2*>(xrow[j] + c * kChunkCols + 4 * s)) : make_uint2(0, 0);
                    xb[j][0] = u.x;
                    xb[j][1] = u.y;
                  }
                }
                step(af, xb);
              }
            }
          }
        }
        copy_wait<0>();
      } else {
        for (std::int64_t c = c0; c < c1; ++c) {
#pragma unroll
          for (int s = 0; s < 8; ++s) {
            const std::int64_t col = c * kChunkCols + 32 * t + 4 * s;
            const std::uint32_t af[4] = {pack2<XD>(weight_at(r_lo, col), weight_at(r_lo, col + 1)),
                                         pack2<XD>(weight_at(r_hi, col), weight_at(r_hi, col + 1)),
                                         pack2<XD>(weight_at(r_lo, col + 2), weight_at(r_lo, col + 3)),
                                         pack2<XD>(weight_at(r_hi, col + 2), weight_at(r_hi, col + 3))};
            std::uint32_t xb[NT][2];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              const std::int64_t tok = tok0 + 8 * j + g;
              xb[j][0] = x_half(tok, col) | (x_half(tok, col + 1) << 16);
              xb[j][1] = x_half(tok, col + 2) | (x_half(tok, col + 3) << 16);
            }
            step(af, xb);
          }
        }
      }
    };

    if constexpr (SPLIT) {
      run_part(my_part);
      // The parts' sums, added in part order by part 0: ((p0 + p1) + p2) + ..., as the single-warp
      // schedule adds them.
      if (S > 1) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) partial_of(warp)[(j * 4 + i) * kWarp + lane] = acc[j][i];
        __syncthreads();
        if (my_part == 0) {
          for (unsigned p = 1; p < S; ++p)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[j][i] = __fadd_rn(acc[j][i], partial_of(warp + p)[(j * 4 + i) * kWarp + lane]);
        }
        __syncthreads();  // the rings are written by the next item's copies
      }
    } else {
      for (unsigned p = 0; p < S; ++p) {
        run_part(p);
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) total[j][i] = p == 0 ? acc[j][i] : __fadd_rn(total[j][i], acc[j][i]);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = total[j][i];
    }
    if (my_part == 0 && row0 < n) {
      // C fragment: acc[j][0..1] = row g, tokens 2t, 2t + 1 of tile j; acc[j][2..3] = row g + 8.
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

// The streaming kernel (sm_80+, vector shapes, at most 16 tokens per warp, more tokens as more
// work items): the same MMAs on the same operands in the same order as gemv_mma_kernel (the
// column permutation, the parts and their addition above), so the same bits, with less work
// around each MMA:
//   - Codes stream D chunks ahead through a per-lane cp.async ring in shared memory: D sets the
//     bytes in flight, which a 4-bit stream needs many of, without holding them in registers (at one
//     chunk ahead in registers a warp of the 14336x4096 product waits on its codes most of the
//     time; docs/PERFORMANCE_LOG.md). Absmax bytes and nested absmax, a few registers per chunk, go
//     to registers one chunk ahead; so does x, or (SX: where the device's shared memory holds it)
//     x goes through a ring in shared memory beside the codes (whole lines copied: 2-15% faster
//     at 1 to 16 tokens on the H100, docs/PERFORMANCE_LOG.md).
//   - RT 16-row tiles per warp (rows g + 8u + 16i of lane (g, t)) share every x fragment: x is
//     read once per RT tiles.
//   - The pair table has one 8-byte copy per lane in 256-byte rows, so one byte permute of a code
//     word and 8 L forms the address (no shift); a warp's 8-byte loads never share a bank.
constexpr int kStreamCopies = 32;
constexpr int kStreamTableBytes = 256 * kStreamCopies * 8;  // 64 KB
// Chunks of codes in flight ahead of the one in use: 2 and 4 ran within 5% of each other on an
// H200 (4 the slower), 1 in registers up to 25% slower (docs/PERFORMANCE_LOG.md).
constexpr int kStreamDepth = 2;
// Warps per CTA, one CTA per SM: 16 where a lane's registers allow 128 per thread (one row tile,
// one token tile), else 8. One CTA of 16 warps rather than two of 8 keeps one table per SM and
// lets every SM's row groups take the same number of items to within one (docs/PERFORMANCE_LOG.md).
template <int NT, int RT>
inline constexpr int kStreamWarps = RT == 1 && NT == 1 ? 16 : 8;
// CTAs per SM the registers must allow: one row tile and one token tile stay within 128 registers
// per thread (at 8 warps, the form for devices whose shared memory cannot hold 16 warps' rings
// beside the table: two CTAs' worth); the others need more.
template <int NT, int RT, int W>
inline constexpr int kStreamMinBlocks = RT == 1 && NT == 1 ? 16 / W : 1;

// Synchronizes the `threads` threads that use named barrier `id` (1..15; 0 is __syncthreads').
[[maybe_unused]] __device__ __forceinline__ void named_barrier(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Where token row r's 16-byte unit u (columns 8u .. 8u + 7 of the chunk) lies in a stage of x, in
// units. A quarter-warp's LDS.128 reads rows r, r + 1 (r even) at units 4 t + q, t = 0..3: the XOR
// puts those eight units in eight distinct groups of four banks.
__device__ __forceinline__ unsigned wide_unit(unsigned r, unsigned u) { return r * 16 + (u ^ (((u >> 3) & 1u) << 1) ^ (r & 1u)); }

// A 16-byte copy into shared memory that keeps the L2's default policy (x is read by every CTA);
// zeros where !live, without reading src.
[[maybe_unused]] __device__ __forceinline__ void copy16_shared(void* dst, const void* src, bool live) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(live ? 16 : 0));
#else
  *static_cast<uint4*>(dst) = live ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#endif
}

// Bytes of one chunk of x for one token tile: 8 tokens by 128 columns.
constexpr int kStreamXTileBytes = 8 * kChunkCols * 2;

// The table, the nested code and values, the part sums, the code rings ([stage][row][lane]) and,
// where x is staged (SX), x's rings ([warp][stage][token tile][wide_unit]).
template <int NT, int RT, int D, bool SX, int W>
constexpr std::size_t stream_shared_bytes() {
  return kStreamTableBytes + (256 + 16) * sizeof(float) + W * RT * NT * 4 * kWarp * sizeof(float) + W * (D + 1) * 2 * RT * kWarp * sizeof(uint4) +
         (SX ? W * (D + 1) * NT * kStreamXTileBytes : 0);
}

// The streaming and wide kernels' table: the nested code and quant values into `code2` and
// `values`, then entry (b, L) = (value[b >> 4], value[b & 15]) at byte 256 b + 8 L of `table`
// (element 2i is the high nibble of byte i).
// threads: the CTA's.
[[maybe_unused]] __device__ __forceinline__ void fill_stream_table(const GemvArgs& a, unsigned char* table, float* code2, float* values, unsigned tid,
                                                                   unsigned threads) {
  for (unsigned b = tid; b < 256; b += threads) {
    if (a.nested) code2[b] = __ldg(a.nested_code + b);
    if (b < 16) values[b] = a.quant_map ? __ldg(a.quant_map + b) : a.fp4_table[b];
  }
  __syncthreads();
  for (unsigned i = tid; i < kStreamTableBytes / 16; i += threads) {
    const unsigned b = i / (kStreamCopies / 2);
    const float hi = values[b >> 4], lo = values[b & 15];
    reinterpret_cast<float4*>(table)[i] = make_float4(hi, lo, hi, lo);
  }
  __syncthreads();
}

// MMA step s's table entries: rows g (codes lo) and g + 8 (hi) of a lane's 16-byte code words,
// columns 32 t + 4 s .. 4 s + 3, as (value, value) pairs. lane_off = 8 * lane.
struct TablePairs {
  float2 p0, p1, q0, q1;  // row g: columns (4s, 4s + 1), (4s + 2, 4s + 3); q: row g + 8
};
[[maybe_unused]] __device__ __forceinline__ TablePairs table_lookup(const unsigned char* table, const uint4& lo, const uint4& hi, std::uint32_t lane_off, int s) {
  const std::uint32_t wl = s < 2 ? lo.x : s < 4 ? lo.y : s < 6 ? lo.z : lo.w;
  const std::uint32_t wh = s < 2 ? hi.x : s < 4 ? hi.y : s < 6 ? hi.z : hi.w;
  // Byte b0 (columns 4s, 4s + 1) and b0 + 1 (4s + 2, 4s + 3) of each row's word to byte 1 of the
  // address, 8 L in byte 0.
  const unsigned b0 = (s & 1) * 2, sel0 = 0x5504u | (b0 << 4), sel1 = 0x5504u | ((b0 + 1) << 4);
  TablePairs e;
  e.p0 = *reinterpret_cast<const float2*>(table + __byte_perm(wl, lane_off, sel0));
  e.p1 = *reinterpret_cast<const float2*>(table + __byte_perm(wl, lane_off, sel1));
  e.q0 = *reinterpret_cast<const float2*>(table + __byte_perm(wh, lane_off, sel0));
  e.q1 = *reinterpret_cast<const float2*>(table + __byte_perm(wh, lane_off, sel1));
  return e;
}
// The A fragment from a step's entries and the rows' scales, rounded as nf4_dequantize writes them.
template <nf4_dtype XD>
__device__ __forceinline__ void table_finish(const TablePairs& e, float al, float ah, std::uint32_t (&af)[4]) {
  af[0] = pack2<XD>(__fmul_rn(e.p0.x, al), __fmul_rn(e.p0.y, al));
  af[1] = pack2<XD>(__fmul_rn(e.q0.x, ah), __fmul_rn(e.q0.y, ah));
  af[2] = pack2<XD>(__fmul_rn(e.p1.x, al), __fmul_rn(e.p1.y, al));
  af[3] = pack2<XD>(__fmul_rn(e.q1.x, ah), __fmul_rn(e.q1.y, ah));
}
template <nf4_dtype XD>
__device__ __forceinline__ void table_fragment(const unsigned char* table, const uint4& lo, const uint4& hi, float al, float ah,
                                               std::uint32_t lane_off, int s, std::uint32_t (&af)[4]) {
  table_finish<XD>(table_lookup(table, lo, hi, lane_off, s), al, ah, af);
}

// A lane's H rows in the streaming and wide kernels: each row's codes at the lane's first column,
// the absmax (and nested absmax) entry of that column's block, and the column's offset inside the
// block (inside the nested block for the nested entry), so that a chunk's entries are 32-bit
// offsets from these.
template <int H, bool kNested>
struct LaneRows {
  const std::uint8_t* code[H];
  const std::uint8_t* am8[H];  // nested: the absmax codes
  const float* am32[H];        // flat: the absmaxes
  const float* nest[H];
  std::uint32_t in_block[H], in_nested[H];

  // lbs, lnbs: log2 of the blocksize and of the nested blocksize; uk: k.
  __device__ __forceinline__ void set(int h, const GemvArgs& a, std::int64_t row, std::uint32_t lane_col, std::uint64_t uk, unsigned lbs,
                                      unsigned lnbs) {
    const std::uint64_t e = static_cast<std::uint64_t>(row) * uk + lane_col, b = e >> lbs;
    code[h] = a.packed + (e >> 1);
    in_block[h] = static_cast<std::uint32_t>(e & ((std::uint64_t{1} << lbs) - 1));
    if constexpr (kNested) {
      am8[h] = static_cast<const std::uint8_t*>(a.absmax) + b;
      nest[h] = a.nested_absmax + (b >> lnbs);
      in_nested[h] = static_cast<std::uint32_t>(b & ((std::uint64_t{1} << lnbs) - 1));
    } else {
      am32[h] = static_cast<const float*>(a.absmax) + b;
    }
  }
  // The statistics of every row at chunk column `col`: flat, the absmax's bits; nested, the absmax
  // code and the block's nested absmax.
  __device__ __forceinline__ void stats(std::uint32_t col, unsigned lbs, unsigned lnbs, std::uint32_t (&am)[H], float (&nested)[H]) const {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const std::uint32_t blk = (in_block[h] + col) >> lbs;
      if constexpr (kNested) {
        am[h] = __ldg(am8[h] + blk);
        nested[h] = __ldg(nest[h] + ((in_nested[h] + blk) >> lnbs));
      } else {
        am[h] = __float_as_uint(__ldg(am32[h] + blk));
      }
    }
  }
};

// One chunk's statistics and x in registers, for a lane's 2 RT rows and NT token tiles.
template <int NT, int RT>
struct StreamChunk {
  std::uint32_t am[2 * RT];  // flat: the absmax's bits; nested: the absmax code
  float nest[2 * RT];        // nested: the block's nested absmax
  uint4 x[NT][4];            // x of the lane's 32 columns per token tile
};

template <nf4_dtype XD, int NT, int RT, bool SPLIT, int D, bool SX, int W>
__global__ void __launch_bounds__(kWarp * W, (kStreamMinBlocks<NT, RT, W>)) gemv_mma_stream_kernel(const __grid_constant__ GemvArgs a) {
  if constexpr (!mma_compiled<XD, false>()) {
    (void)a;
    __trap();
  } else {
  constexpr int H = 2 * RT;  // rows per lane: slot h is row row0 + 16 (h / 2) + 8 (h % 2) + g
  constexpr int kSlots = D + 1;  // code ring stages
  wait_for_previous_grid();  // programmatic dependent launch (pdl.h): before any global access
  extern __shared__ __align__(16) unsigned char smem[];
  float* code2 = reinterpret_cast<float*>(smem + kStreamTableBytes);
  float* values = code2 + 256;
  float* partials = values + 16;  // SPLIT: per warp [RT NT 4][32] part sums
  uint4* rings = reinterpret_cast<uint4*>(partials + W * RT * NT * 4 * kWarp);
  const unsigned tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const unsigned g = lane / 4, t = lane % 4;

  fill_stream_table(a, smem, code2, values, tid, kWarp * W);

  const std::int64_t n = a.n, k = a.k;
  const std::uint64_t uk = static_cast<std::uint64_t>(k);
  const unsigned lbs = a.log2_blocksize, lnbs = a.log2_nested_blocksize;
  const PartPlan pp = part_plan(a, warp, SPLIT, W);
  const unsigned S = pp.S, R = pp.R, block_in_cta = pp.group, my_part = pp.part;
  const std::int64_t chunks = pp.chunks, span = pp.span;
  constexpr std::int64_t kRows = std::int64_t{kTileRows} * RT;
  const ItemGrid grid = item_grid(n, a.m, 1, kRows, NT);  // a row group's items: RT row tiles by NT token tiles
  const std::int64_t token_tiles = grid.token_tiles, items = grid.items;
  const float offset = a.nested ? (a.offset_ptr ? __ldg(a.offset_ptr) : a.offset_value) : 0.0f;
  const std::uint64_t policy = evict_first_policy();
  const std::uint32_t lane_off = 8 * lane;
  float* my_partials = partials + warp * (RT * NT * 4 * kWarp);
  uint4* my_ring = rings + warp * (kSlots * H * kWarp) + lane;  // slot (stage, h) at (stage H + h) 32
  // Staged x: this warp's ring, a stage holding each token tile's chunk in wide_unit's order. The
  // lanes copy whole 16-byte units of consecutive columns (unit u of token row r for p = lane + 32 i,
  // r = p / 16, u = p % 16: four full lines per copy instruction), and each lane reads its own
  // columns back from the swizzled rows without bank conflicts.
  uint4* const my_x = rings + W * kSlots * H * kWarp + warp * (kSlots * NT * kStreamXTileBytes / 16);
  // Ring stage st's chunk of token tile j.
  [[maybe_unused]] const auto x_tile = [my_x](unsigned st, int j) { return my_x + (st * NT + j) * (kStreamXTileBytes / 16); };

  // The item loop, compiled once per statistics layout so that a chunk's loads carry no branch on it.
  const auto run_items = [&](auto nested_tag) {
  constexpr bool kNested = decltype(nested_tag)::value;
  // Each row group walks its own items, spread over the CTAs first (group g of CTA b takes items
  // b + g G, b + (g + R) G, ... of the grid's G CTAs), so that the CTAs, one per SM, hold the same
  // number of items to within one; the S warps of a split group meet at their own barrier.
  for (std::int64_t item = blockIdx.x + std::int64_t{gridDim.x} * block_in_cta; item < items; item += std::int64_t{gridDim.x} * R) {
    const std::int64_t rb = item / token_tiles, tt = item % token_tiles;
    const std::int64_t row0 = rb * kRows;
    const std::int64_t tok0 = tt * 8 * NT;
    // Per row slot: its codes at the lane's first column, the absmax (and nested absmax) entry of
    // that column's block, and the column's offset inside the block (inside the nested block for
    // the nested entry), so that a chunk's entries are 32-bit offsets from these. Rows past n and
    // tokens past m read row n - 1 and token m - 1: their outputs are never stored, and an MMA's
    // output row (token) depends on its own A row (B column) alone. A lane whose first column
    // lies past k (k < 128) reads column 0 (its body uses zeros).
    const std::uint32_t lane_col = 32 * t < uk ? 32 * t : 0;
    LaneRows<H, kNested> rows;
#pragma unroll
    for (int h = 0; h < H; ++h) rows.set(h, a, min(row0 + 16 * (h / 2) + 8 * (h % 2) + g, n - 1), lane_col, uk, lbs, lnbs);
    const unsigned short* xrow[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) xrow[j] = static_cast<const unsigned short*>(a.x) + min(tok0 + 8 * j + g, std::int64_t{a.m} - 1) * k + lane_col;
    // Staged x: the four units this lane copies per token tile (unit lane % 16 of token rows
    // tok0 + 8 j + lane / 16 + 2 i, i = 0..3: four whole lines per copy instruction; one pointer
    // per tile, row i being 2 i k elements further), and which of them lie on tokens below m (bit
    // 4 j + i). Token rows past m are zeros, copied from nowhere (their outputs are never stored,
    // and an MMA's output token depends on its own B column alone): copies of one row by many
    // lanes, as reading row m - 1 for them would be, cost up to 16% at 5 and 12 tokens.
    [[maybe_unused]] const unsigned short* xcopy[SX ? NT : 1];
    [[maybe_unused]] unsigned xtok_live = 0;
    if constexpr (SX) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const std::int64_t tok = tok0 + 8 * j + lane / 16;
        xcopy[j] = static_cast<const unsigned short*>(a.x) + min(tok, std::int64_t{a.m} - 1) * k + 8 * (lane % 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) xtok_live |= (tok + 2 * i < a.m ? 1u : 0u) << (4 * j + i);
      }
    }
    float acc[RT][NT][4];

    // Chunks below `full` lie inside k for every lane and take the column c * 128, the same in
    // every lane; the last chunk of k % 128 != 0 does not, and there lanes past k read column 0
    // while the body uses zeros (as gemv_mma_kernel does).
    const std::int64_t full = k / kChunkCols;
    const auto tail_col = [&](std::int64_t c) -> std::uint32_t {
      const std::uint64_t col = static_cast<std::uint64_t>(c) * kChunkCols;
      return col + 32 * t < uk ? static_cast<std::uint32_t>(col) : 0u;
    };
    // Chunk c's codes from column `col` into ring stage `st`, and where staged its x, one copy group
    // (empty past c_end).
    const auto copy_codes = [&](std::int64_t c, std::int64_t c_end, std::uint32_t col, unsigned st) {
      if (c < c_end) {
#pragma unroll
        for (int h = 0; h < H; ++h) copy16(my_ring + (st * H + h) * kWarp, rows.code[h] + col / 2, true, policy);
        if constexpr (SX) {
          const std::uint32_t xcol = static_cast<std::uint32_t>(c) * kChunkCols;  // the chunk's, for every lane
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const unsigned p = lane + 32 * i;
              const bool live = ((xtok_live >> (4 * j + i)) & 1u) != 0 && static_cast<std::uint64_t>(xcol + 8 * (p % 16)) < uk;
              copy16_shared(x_tile(st, j) + wide_unit(p / 16, p % 16), live ? xcopy[j] + 2 * i * k + xcol : xcopy[j], live);
            }
        }
      }
      copy_commit();
    };
    // A chunk's statistics and x from column `col`.
    const auto load = [&](std::uint32_t col, StreamChunk<NT, RT>& ch) {
      rows.stats(col, lbs, lnbs, ch.am, ch.nest);
      if constexpr (!SX) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) ch.x[j][i] = __ldg(reinterpret_cast<const uint4*>(xrow[j] + col) + i);
      }
    };
    // Chunk c's MMAs from its loads `ch` and its codes in ring stage `st`. Full: every lane's
    // columns lie inside k; otherwise lanes past k use zero weights and x.
    const auto body = [&](std::int64_t c, const StreamChunk<NT, RT>& ch, unsigned st, auto full_tag) {
      constexpr bool kFull = decltype(full_tag)::value;
      const bool ck = kFull || static_cast<std::uint64_t>(c) * kChunkCols + 32 * t < uk;
      uint4 codes[H];
#pragma unroll
      for (int h = 0; h < H; ++h) codes[h] = my_ring[(st * H + h) * kWarp];
      float am[H];
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const float s = kNested ? __fadd_rn(__fmul_rn(code2[ch.am[h]], ch.nest[h]), offset) : __uint_as_float(ch.am[h]);
        am[h] = ck ? s : 0.0f;
        if (!ck) codes[h] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < RT; ++i) {
        const uint4 &lo = codes[2 * i], &hi = codes[2 * i + 1];
        const float al = am[2 * i], ah = am[2 * i + 1];
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          std::uint32_t af[4];
          table_fragment<XD>(smem, lo, hi, al, ah, lane_off, s, af);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            uint4 staged;
            if constexpr (SX) staged = x_tile(st, j)[wide_unit(g, 4 * t + s / 2)];
            const uint4& u = SX ? staged : ch.x[j][s / 2];
            mma16<XD, false>(acc[i][j], af, ck ? (s % 2 ? u.z : u.x) : 0u, ck ? (s % 2 ? u.w : u.y) : 0u);
          }
        }
      }
    };
    // Part p's chunks into acc (from zero): its full chunks pipelined (two register sets for the
    // statistics and x, so the loop takes two chunks per turn and names each set at compile
    // time), then the partial chunk of k, if this part has it, on its own.
    const auto run_part = [&](std::int64_t p) {
#pragma unroll
      for (int i = 0; i < RT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
      const std::int64_t c0 = p * span, c1 = c0 + span < chunks ? c0 + span : chunks;
      if (row0 >= n || c0 >= c1) return;
      const std::int64_t cf = c1 < full ? c1 : full;
      if (c0 < cf) {
        if constexpr (SX) __syncwarp();  // the last part's reads of x's ring are done
#pragma unroll
        for (int d = 0; d < D; ++d) copy_codes(c0 + d, cf, static_cast<std::uint32_t>((c0 + d) * kChunkCols), d);
        StreamChunk<NT, RT> set[2];
        load(static_cast<std::uint32_t>(c0 * kChunkCols), set[0]);
        unsigned st = 0;  // chunk c's ring stage: (c - c0) mod (D + 1)
        const auto step = [&](std::int64_t c, StreamChunk<NT, RT>& cur, StreamChunk<NT, RT>& next) {
          if constexpr (SX) __syncwarp();  // every lane's reads of the stage about to be refilled are done
          copy_codes(c + D, cf, static_cast<std::uint32_t>((c + D) * kChunkCols), st == 0 ? D : st - 1);
          if (c + 1 < cf) load(static_cast<std::uint32_t>((c + 1) * kChunkCols), next);
          copy_wait<D>();
          if constexpr (SX) __syncwarp();  // the other lanes' copies of chunk c's x are visible
          body(c, cur, st, std::true_type{});
          st = st == D ? 0 : st + 1;
        };
        for (std::int64_t c = c0; c < cf; c += 2) {
          step(c, set[0], set[1]);
          if (c + 1 < cf) step(c + 1, set[1], set[0]);
        }
        copy_wait<0>();
      }
      if (cf < c1) {  // c1 - 1 == full: the partial chunk
        StreamChunk<NT, RT> last;
        if constexpr (SX) __syncwarp();
        copy_codes(cf, c1, tail_col(cf), 0);
        load(tail_col(cf), last);
        copy_wait<0>();
        if constexpr (SX) __syncwarp();
        body(cf, last, 0, std::false_type{});
      }
    };

    if constexpr (SPLIT) {
      run_part(my_part);
      // The parts' sums, added in part order by part 0: ((p0 + p1) + p2) + ...
      if (S > 1) {
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) my_partials[((i * NT + j) * 4 + q) * kWarp + lane] = acc[i][j][q];
        named_barrier(1 + block_in_cta, S * kWarp);
        if (my_part == 0) {
          for (unsigned p = 1; p < S; ++p) {
            const float* other = partials + (warp + p) * (RT * NT * 4 * kWarp);
#pragma unroll
            for (int i = 0; i < RT; ++i)
#pragma unroll
              for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[i][j][q] = __fadd_rn(acc[i][j][q], other[((i * NT + j) * 4 + q) * kWarp + lane]);
          }
        }
        named_barrier(1 + block_in_cta, S * kWarp);  // the partials are written again by the group's next item
      }
    } else {
      float total[RT][NT][4];
      for (unsigned p = 0; p < S; ++p) {
        run_part(p);
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) total[i][j][q] = p == 0 ? acc[i][j][q] : __fadd_rn(total[i][j][q], acc[i][j][q]);
      }
#pragma unroll
      for (int i = 0; i < RT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[i][j][q] = total[i][j][q];
    }
    if (my_part == 0 && row0 < n) {
      // C fragment: acc[i][j][0..1] = row 16 i + g, tokens 2t, 2t + 1 of tile j; [2..3] = row 16 i + g + 8.
#pragma unroll
      for (int i = 0; i < RT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const std::int64_t row = row0 + 16 * i + g + (q >= 2 ? 8 : 0), tok = tok0 + 8 * j + 2 * t + (q & 1);
            if (row < n && tok < a.m) store_value(acc[i][j][q], a.y, tok * n + row, a.y_dtype);
          }
    }
  }
  };
  if (a.nested) run_items(std::true_type{});
  else run_items(std::false_type{});
  }
}

// The wide kernel (sm_80+, vector shapes, many tokens): the streaming kernel's MMAs on the same
// operands in the same order (so the same bits), with W decoded once per 8 NT tokens instead of
// once per 16. Its CTA walks k in lockstep: each chunk's x for all the item's tokens is staged once
// in shared memory by the whole CTA (cp.async, D chunks ahead with the codes) and read by every
// warp, so x costs no registers and the token tiles per warp are bounded by the accumulators
// alone (two sets of 4 NT: the part in progress and the parts' total). Each warp takes one 16-row
// tile and every part of k in turn (the single schedule's additions).
constexpr int kWideDepth = 2;  // chunks in flight ahead of the one in use

template <int NT, int D>
constexpr std::size_t wide_shared_bytes() {
  return kStreamTableBytes + (256 + 16) * sizeof(float) + std::size_t{D + 1} * 8 * NT * (kChunkCols * 2) +
         std::size_t{kWarps} * (D + 1) * 2 * kWarp * sizeof(uint4);
}

// One chunk's statistics in registers, for a lane's two rows.
struct WideStats {
  std::uint32_t am[2];  // flat: the absmax's bits; nested: the absmax code
  float nest[2];        // nested: the block's nested absmax
};

// What the wide and warpgroup kernels' CTAs share: the table (fill_stream_table) and the launch's
// sizes, the lane's place, the parts of k (every part in turn) and the items of 8 NT tokens.
struct WideCta {
  float* code2;
  unsigned tid, lane, warp, g, t;
  std::int64_t n, k;
  std::uint64_t uk;
  unsigned lbs, lnbs;
  int chunks, span;  // k < 2^31 (the caller's condition): chunk indices fit 32 bits
  std::int64_t token_tiles, items;
  float offset;
  std::uint32_t lane_off;

  __device__ __forceinline__ WideCta(const GemvArgs& a, unsigned char* smem, int nt) {
    code2 = reinterpret_cast<float*>(smem + kStreamTableBytes);
    tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, g = lane / 4, t = lane % 4;
    fill_stream_table(a, smem, code2, code2 + 256, tid, kThreads);
    n = a.n, k = a.k, uk = static_cast<std::uint64_t>(k);
    lbs = a.log2_blocksize, lnbs = a.log2_nested_blocksize;
    const PartPlan pp = part_plan(a, warp, false);
    chunks = static_cast<int>(pp.chunks), span = static_cast<int>(pp.span);
    const ItemGrid grid = item_grid(n, a.m, kWarps, kTileRows, nt);
    token_tiles = grid.token_tiles, items = grid.items;
    offset = a.nested ? (a.offset_ptr ? __ldg(a.offset_ptr) : a.offset_value) : 0.0f;
    lane_off = 8 * lane;
  }
  // Shared memory past the table, the nested code and the values.
  static __device__ __forceinline__ unsigned char* after_table(unsigned char* smem) { return smem + kStreamTableBytes + (256 + 16) * sizeof(float); }
};

// A lane's two rows (g and g + 8 of its warp's 16-row tile) in an item of the wide and warpgroup
// kernels. As the streaming kernel: rows past n read row n - 1 (a warp past n still copies x and
// meets every barrier; its outputs are not stored), a lane whose first column lies past k reads
// column 0 and uses zeros.
template <bool kNested>
struct WideRows {
  LaneRows<2, kNested> rows;
  const WideCta& cta;

  __device__ __forceinline__ WideRows(const GemvArgs& a, const WideCta& c, std::int64_t row0) : cta(c) {
    const std::uint32_t lane_col = 32 * c.t < c.uk ? 32 * c.t : 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) rows.set(h, a, min(row0 + 8 * h + c.g, c.n - 1), lane_col, c.uk, c.lbs, c.lnbs);
  }
  // Whether chunk c holds this lane's columns (the partial last chunk of k may not), and its
  // column for the lane's codes and statistics (0 where it does not).
  __device__ __forceinline__ bool live(int c) const { return static_cast<std::uint64_t>(static_cast<std::uint32_t>(c) * kChunkCols + 32 * cta.t) < cta.uk; }
  __device__ __forceinline__ std::uint32_t chunk_col(int c) const { return live(c) ? static_cast<std::uint32_t>(c) * kChunkCols : 0u; }
  // Chunk c's codes into the lane's ring slots of a stage (slot h at slot + h * 32; zeros past k).
  __device__ __forceinline__ void copy_codes(uint4* slot, int c) const {
    const std::uint32_t col = chunk_col(c);
#pragma unroll
    for (int h = 0; h < 2; ++h) copy16(slot + h * kWarp, rows.code[h] + col / 2, live(c), evict_first_policy());
  }
  __device__ __forceinline__ void stats(int c, WideStats& w) const { rows.stats(chunk_col(c), cta.lbs, cta.lnbs, w.am, w.nest); }
  // The two rows' absmax for chunk c from its statistics (0 past k).
  __device__ __forceinline__ void scales(int c, const WideStats& w, float (&am)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sc = kNested ? __fadd_rn(__fmul_rn(cta.code2[w.am[h]], w.nest[h]), cta.offset) : __uint_as_float(w.am[h]);
      am[h] = live(c) ? sc : 0.0f;
    }
  }
};

// An item's outputs from the C fragments: v[4 j + 0..1] = row g, tokens 2t, 2t + 1 of tile j;
// v[4 j + 2..3] = row g + 8.
// One 8-token block j of them: v[0..3] = v[4 j + 0..3] above. Lane: anything with the lane's place
// g and t and the rows n (a WideCta, or the split form's addition's own).
template <class Lane>
__device__ __forceinline__ void store_wide_block(const GemvArgs& a, const Lane& c, std::int64_t row0, std::int64_t tok0, int j, const float* v) {
  if (row0 >= c.n) return;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const std::int64_t row = row0 + c.g + (q >= 2 ? 8 : 0), tok = tok0 + 8 * j + 2 * c.t + (q & 1);
    if (row < c.n && tok < a.m) store_value(v[q], a.y, tok * c.n + row, a.y_dtype);
  }
}
template <int NT>
__device__ __forceinline__ void store_wide(const GemvArgs& a, const WideCta& c, std::int64_t row0, std::int64_t tok0, const float* v) {
#pragma unroll
  for (int j = 0; j < NT; ++j) store_wide_block(a, c, row0, tok0, j, v + 4 * j);
}

template <nf4_dtype XD, int NT, int D>
__global__ void __launch_bounds__(kThreads, 1) gemv_mma_wide_kernel(const __grid_constant__ GemvArgs a) {
  if constexpr (!mma_compiled<XD, false>()) {
    (void)a;
    __trap();
  } else {
  constexpr int kTokens = 8 * NT, kSlots = D + 1, kUnits = kTokens * (kChunkCols / 8);
  wait_for_previous_grid();  // programmatic dependent launch (pdl.h): before any global access
  extern __shared__ __align__(16) unsigned char smem[];
  const WideCta cta(a, smem, NT);
  uint4* xs = reinterpret_cast<uint4*>(WideCta::after_table(smem));  // [stage][kUnits]
  uint4* rings = xs + kSlots * kUnits;                                 // [warp][stage][row][lane]
  const unsigned tid = cta.tid, g = cta.g, t = cta.t;
  const int chunks = cta.chunks, span = cta.span;
  const auto* x = static_cast<const unsigned short*>(a.x);
  uint4* my_ring = rings + cta.warp * (kSlots * 2 * kWarp) + cta.lane;  // slot (stage, h) at (2 stage + h) 32

  const auto run_items = [&](auto nested_tag) {
  constexpr bool kNested = decltype(nested_tag)::value;
  for (std::int64_t item = blockIdx.x; item < cta.items; item += gridDim.x) {
    const std::int64_t rb = item / cta.token_tiles, tt = item % cta.token_tiles;
    const std::int64_t row0 = (rb * kWarps + cta.warp) * kTileRows;
    const std::int64_t tok0 = tt * kTokens;
    const WideRows<kNested> rows(a, cta, row0);
    // This thread's units of every stage: unit u (the same in each, as kThreads % 16 == 0) of token
    // rows tid / 16 + 16 i; tokens past m read token m - 1.
    static_assert(kUnits % kThreads == 0 && kThreads % 16 == 0, "whole units per thread");
    constexpr int kMyUnits = kUnits / kThreads;
    const unsigned my_u = tid % 16;
    const unsigned short* x_src[kMyUnits];
    unsigned x_dst[kMyUnits];
#pragma unroll
    for (int i = 0; i < kMyUnits; ++i) {
      const unsigned r = tid / 16 + 16 * i;
      x_src[i] = x + min(tok0 + r, std::int64_t{a.m} - 1) * cta.k + 8 * my_u;
      x_dst[i] = wide_unit(r, my_u);
    }
    // Chunk c's codes (this lane's) and x (the CTA's) into stage st: one copy group, empty past the
    // last chunk. Codes and x past k are zeros (copies of no bytes), as the other kernels' bodies
    // zero them.
    const auto copy_chunk = [&](int c, unsigned st) {
      if (c < chunks) {
        rows.copy_codes(my_ring + st * 2 * kWarp, c);
        const std::uint32_t base = static_cast<std::uint32_t>(c) * kChunkCols;
        uint4* stage = xs + st * kUnits;
        const bool x_live = static_cast<std::uint64_t>(base + 8 * my_u) < cta.uk;
#pragma unroll
        for (int i = 0; i < kMyUnits; ++i) copy16_shared(stage + x_dst[i], x_src[i] + (x_live ? base : 0), x_live);
      }
      copy_commit();
    };
    float acc[NT][4], total[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    // Chunk c's MMAs from its statistics and its codes and x in stage st.
    const auto body = [&](int c, const WideStats& w, unsigned st) {
      const uint4 lo = my_ring[(st * 2) * kWarp], hi = my_ring[(st * 2 + 1) * kWarp];  // zeros past k
      float am[2];
      rows.scales(c, w, am);
      const uint4* stage = xs + st * kUnits;
      // Steps in pairs (s, s + 1), whose B fragments are one 16-byte load per token tile (token
      // 8 j + g, columns 32 t + 4 s .. 4 s + 7; zeros past k). The next pair's shared loads are
      // issued before this pair's MMAs, which hides their latency at two warps per scheduler; each
      // accumulator still takes step s, then s + 1.
      TablePairs e0 = table_lookup(smem, lo, hi, cta.lane_off, 0), e1 = table_lookup(smem, lo, hi, cta.lane_off, 1);
      uint4 u[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) u[j] = stage[wide_unit(8 * j + g, 4 * t)];
#pragma unroll
      for (int s = 0; s < 8; s += 2) {
        std::uint32_t af0[4], af1[4];
        table_finish<XD>(e0, am[0], am[1], af0);
        table_finish<XD>(e1, am[0], am[1], af1);
        uint4 cur[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) cur[j] = u[j];
        if (s + 2 < 8) {
          e0 = table_lookup(smem, lo, hi, cta.lane_off, s + 2);
          e1 = table_lookup(smem, lo, hi, cta.lane_off, s + 3);
#pragma unroll
          for (int j = 0; j < NT; ++j) u[j] = stage[wide_unit(8 * j + g, 4 * t + (s + 2) / 2)];
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) mma16<XD, false>(acc[j], af0, cur[j].x, cur[j].y);
#pragma unroll
        for (int j = 0; j < NT; ++j) mma16<XD, false>(acc[j], af1, cur[j].z, cur[j].w);
      }
    };

    // Chunks 0 .. chunks - 1 in order are parts 0 .. S - 1 in turn: the sums restart at each part's
    // first chunk and join the total at its last, ((p0 + p1) + p2) + ... as both other kernels add.
#pragma unroll
    for (int d = 0; d < D; ++d) copy_chunk(d, d);
    WideStats set[2];
    rows.stats(0, set[0]);
    unsigned st = 0;  // chunk c's stage: c mod (D + 1)
    int part_end = span < chunks ? span : chunks;  // one past the current part's last chunk
    const auto step = [&](int c, WideStats& cur, WideStats& next) {
      copy_wait<D - 1>();
      __syncthreads();  // chunk c's x is in for every thread; chunk c - 1's stage is free
      copy_chunk(c + D, st == 0 ? D : st - 1);
      if (c + 1 < chunks) rows.stats(c + 1, next);
      body(c, cur, st);
      st = st == D ? 0 : st + 1;
      if (c + 1 == part_end) {
        const bool first = part_end <= span;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            total[j][q] = first ? acc[j][q] : __fadd_rn(total[j][q], acc[j][q]);
            acc[j][q] = 0.0f;
          }
        part_end = part_end + span < chunks ? part_end + span : chunks;
      }
    };
    for (int c = 0; c < chunks; c += 2) {
      step(c, set[0], set[1]);
      if (c + 1 < chunks) step(c + 1, set[1], set[0]);
    }
    copy_wait<0>();
    __syncthreads();  // the next item's copies reuse every stage
    store_wide<NT>(a, cta, row0, tok0, &total[0][0]);
  }
  };
  if (a.nested) run_items(std::true_type{});
  else run_items(std::false_type{});
  }
}

// The warpgroup kernel (sm_90a, vector shapes, many tokens): the wide kernel's decode, with each
// 16-column step of a chunk one wgmma for all the item's tokens instead of one mma.sync per 8, so
// B never passes through registers and the MMAs run asynchronously to the next step's decode.
// wgmma m64nNk16 with A from registers gives the bits of mma.sync m16n8k16 on the same operands
// (checked on the H100, every kernel against the others in the tests), so this kernel is one more
// with the same MMAs in the same order. The CTA's two warpgroups take 64 rows each (a warp's A
// fragment is its 16-row tile, as in mma.sync), and x's chunk is staged per CTA in the layout
// wgmma reads: for step s, core matrices of 8 tokens by 8 k slots (16 bytes a row), the slots in
// the order the A fragments use (slots 2t, 2t + 1 <- columns 32 t + 4 s + {0, 1}; 2t + 8, 2t + 9 <-
// 32 t + 4 s + {2, 3}), so each 4-byte column pair of x lands at its own place: loaded 16 bytes at
// a time into registers a chunk ahead, stored as four words.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NF4_WGMMA_CODE 1
#endif
// Whether the build holds sm_90a code, on the host: the CUDA backend's CMake defines it.
#if defined(NF4_CUDA_SM90A)
constexpr bool kWgmmaBuilt = true;
#else
constexpr bool kWgmmaBuilt = false;
#endif

// Bytes of one step of a stage: 8 NT token blocks of 256 bytes (two core matrices, k slots 0-7 at
// +0 and 8-15 at +128), and 16 more so that the four steps a thread's 16-byte unit feeds start in
// four different bank groups (its four word stores from a warp are then conflict-free).
template <int NT>
constexpr int kWgStepBytes = NT * 256 + 16;
static_assert(kWgStepBytes<8> % 16 == 0 && kWgStepBytes<16> % 16 == 0, "steps in the descriptor's 16-byte units");
template <int NT>
constexpr int kWgStageBytes = 8 * kWgStepBytes<NT>;

// Bytes of one part's sums in the cluster form: a float per token and row of a CTA's item.
template <int NT>
constexpr std::size_t kWgPartBytes = std::size_t{4} * NT * kThreads * sizeof(float);
// FOUR: the cluster form with four parts per CTA, which holds two of its parts' sums beside the
// stages while it sums the next ones. GLOBAL: the split form, whose stages are filled by bulk
// copies that complete on one mbarrier per stage (8 bytes each, past the code rings).
template <int NT, int D, bool FOUR = false, bool GLOBAL = false>
constexpr std::size_t wgmma_shared_bytes() {
  return kStreamTableBytes + (256 + 16) * sizeof(float) + std::size_t{D + 1} * kWgStageBytes<NT> +
         std::size_t{kWarps} * (D + 1) * 2 * kWarp * sizeof(uint4) + (FOUR ? 2 * kWgPartBytes<NT> : 0) + (GLOBAL ? 8 * (D + 1) : 0);
}

// The split form's x image: x laid out beforehand, per token tile and chunk, byte for byte as a
// stage holds it (gemv_mma_x_image_kernel), so that the warpgroup kernel fills a stage with one bulk
// copy instead of loading x into registers and storing it word by word: on the H100 that staging
// cost a 128-token chunk about 0.3 us of its 1.1 and a 256-token one 0.75 of its 2
// (lab/wgmma_overlap, docs/PERFORMANCE_LOG.md). It follows the part sums in the workspace.
// Whether the split form's first CTA of an item adds its parts itself (gemv_mma_wgmma_kernel's
// FOLD): where it takes every one (no addition kernel, no slots) and, for 128 tokens, wherever it
// takes more than one (it saves their slots). The fold's registers slow the 64-token form's chunk:
// with 2 of 8 parts per CTA it ran 1-3% slower than storing each part, where the 128-token form's
// ran up to 5% faster at 256 tokens (H100, docs/PERFORMANCE_LOG.md, "The split forms' fold").
template <int NT>
__host__ __device__ constexpr bool split_folds(unsigned log2_split, unsigned log2_part_group) {
  return log2_part_group == log2_split || (NT == 16 && log2_part_group > 0);
}
// The part sums' slots, [item][part]: none where a CTA takes every part of its item (it stores
// the output itself).
template <int NT>
__host__ __device__ constexpr std::size_t split_sums_bytes(std::int64_t items, unsigned log2_split, unsigned log2_part_group) {
  return log2_part_group == log2_split ? 0 : static_cast<std::size_t>(items) * (std::size_t{1} << log2_split) * kWgPartBytes<NT>;
}
template <int NT>
__host__ __device__ constexpr std::size_t x_image_bytes(std::int64_t token_tiles, std::int64_t k) {
  return static_cast<std::size_t>(token_tiles) * static_cast<std::size_t>(chunk_count(k)) * kWgStageBytes<NT>;
}
// The image's 16-byte rows per token tile and chunk: 8 steps of NT token blocks, two k halves, 8 tokens.
template <int NT>
constexpr std::int64_t kImageRowsPerChunk = std::int64_t{8} * NT * 2 * 8;
template <int NT>
__device__ __forceinline__ unsigned char* x_image(const GemvArgs& a) {
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  return reinterpret_cast<unsigned char*>(a.workspace) + split_sums_bytes<NT>(grid.items, a.log2_split, a.log2_part_group);
}

// The x image (vector shapes: k % 32 == 0, x 16-byte aligned): each thread writes 16-byte rows of
// core matrices, row (token tile, chunk, step s, token block b, k half h, token i) holding columns
// 32 t + 4 s + 2 h + {0, 1} of token 8 b + i for t = 0..3 (the k slots the A fragments use, as
// the warpgroup kernel's own staging places them); tokens past m and columns past k are zeros.
// The 16 bytes after each step are not written: no descriptor reaches them.
template <int NT>
__global__ void __launch_bounds__(kThreads) gemv_mma_x_image_kernel(const __grid_constant__ GemvArgs a) {
  wait_for_previous_grid();  // x may be the previous kernel's output (pdl.h)
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  const std::int64_t chunks = chunk_count(a.k), rows_per_chunk = kImageRowsPerChunk<NT>;
  const std::int64_t total = grid.token_tiles * chunks * rows_per_chunk;
  unsigned char* image = x_image<NT>(a);
  const auto* x = static_cast<const std::uint32_t*>(a.x);  // column pairs
  for (std::int64_t r = blockIdx.x * std::int64_t{kThreads} + threadIdx.x; r < total; r += std::int64_t{gridDim.x} * kThreads) {
    const unsigned i = static_cast<unsigned>(r % 8), h = static_cast<unsigned>(r / 8 % 2), b = static_cast<unsigned>(r / 16 % NT),
                   s = static_cast<unsigned>(r / (16 * NT) % 8);
    const std::int64_t tile_chunk = r / rows_per_chunk, c = tile_chunk % chunks, tt = tile_chunk / chunks;
    const std::int64_t token = tt * 8 * NT + 8 * b + i;
    std::uint32_t w[4] = {0, 0, 0, 0};
    if (token < a.m) {
      const std::int64_t col0 = c * kChunkCols + 4 * s + 2 * h;
#pragma unroll
      for (int t = 0; t < 4; ++t)
        if (col0 + 32 * t < a.k) w[t] = __ldg(x + (token * a.k + col0 + 32 * t) / 2);
    }
    unsigned char* dst = image + static_cast<std::size_t>(tile_chunk) * kWgStageBytes<NT> + s * kWgStepBytes<NT> + b * 256 + h * 128 + i * 16;
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The shared-memory descriptor of a step's B: no swizzle, the next 8 k slots 128 bytes on (the
// leading offset), the next 8 tokens 256 bytes on (the stride offset). Low word: the address in
// 16-byte units (bits 0-13) and the leading offset; high word: the stride offset.
[[maybe_unused]] __device__ __forceinline__ std::uint32_t wgmma_desc_lo(unsigned shared_addr) { return ((shared_addr & 0x3FFFFu) >> 4) | ((128u >> 4) << 16); }
[[maybe_unused]] constexpr std::uint32_t kWgmmaDescHi = 256 >> 4;

// One instruction per shape, its operand types spelled by TY ("bf16" or "f16"); scale-d is 1 (D += A B).
#define NF4_WGMMA_M64N64K16(TY) \
  asm volatile("{ .reg .pred p; .reg .b64 desc; setp.ne.b32 p, %38, 0; mov.b64 desc, {%36, %37};\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, desc, p, 1, 1, 0; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(desc_lo), "r"(desc_hi), "r"(1))
#define NF4_WGMMA_M64N128K16(TY) \
  asm volatile("{ .reg .pred p; .reg .b64 desc; setp.ne.b32 p, %70, 0; mov.b64 desc, {%68, %69};\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, desc, p, 1, 1, 0; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(desc_lo), "r"(desc_hi), "r"(1))

// D (the warpgroup's 64 rows by N tokens; this lane's N / 2 values in the mma.sync C order per
// 8-token block) += A (this warp's 16-row fragment) B (the descriptor's N tokens by 16 k slots).
// The descriptor comes in its two words: the high one (the offsets) is the same for every step, so
// a step's descriptor costs one 32-bit add.
template <nf4_dtype XD, int N>
__device__ __forceinline__ void wgmma_step(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint32_t desc_lo, std::uint32_t desc_hi) {
#if defined(NF4_WGMMA_CODE)
  static_assert(N == 64 || N == 128, "the shapes written below");
  if constexpr (N == 64 && XD == NF4_DTYPE_BF16) NF4_WGMMA_M64N64K16("bf16");
  if constexpr (N == 64 && XD == NF4_DTYPE_F16) NF4_WGMMA_M64N64K16("f16");
  if constexpr (N == 128 && XD == NF4_DTYPE_BF16) NF4_WGMMA_M64N128K16("bf16");
  if constexpr (N == 128 && XD == NF4_DTYPE_F16) NF4_WGMMA_M64N128K16("f16");
#else
  (void)d, (void)a, (void)desc_lo, (void)desc_hi;
#endif
}
#undef NF4_WGMMA_M64N64K16
#undef NF4_WGMMA_M64N128K16
[[maybe_unused]] __device__ __forceinline__ void wgmma_fence() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void wgmma_commit() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Orders a register after the asynchronous MMAs' completion (a wait above it): reads of the
// accumulators must not move before their wait.
[[maybe_unused]] __device__ __forceinline__ void register_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// Makes this thread's generic shared-memory stores visible to the MMAs' reads (the async proxy).
[[maybe_unused]] __device__ __forceinline__ void async_proxy_fence() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Four outputs' part sums added in part order, ((v0 + v1) + v2) + ..., the additions every kernel
// makes; present(i): whether value i exists (value 0 always does; absent ones add nothing).
template <unsigned N, class Present>
__device__ __forceinline__ void add_in_part_order(const float4 (&v)[N], Present present, float (&sum)[4]) {
  sum[0] = v[0].x, sum[1] = v[0].y, sum[2] = v[0].z, sum[3] = v[0].w;
#pragma unroll
  for (unsigned i = 1; i < N; ++i)
    if (present(i)) {
      sum[0] = __fadd_rn(sum[0], v[i].x);
      sum[1] = __fadd_rn(sum[1], v[i].y);
      sum[2] = __fadd_rn(sum[2], v[i].z);
      sum[3] = __fadd_rn(sum[3], v[i].w);
    }
}

// Thread-block clusters (sm_90): this CTA's rank and the cluster's size, a barrier of the whole
// cluster that orders shared memory (release / acquire), and the address of the same shared
// variable in the cluster's CTA `rank` (distributed shared memory, read with generic loads).
struct ClusterPlace {
  unsigned rank = 0, size = 1;
};
[[maybe_unused]] __device__ __forceinline__ ClusterPlace cluster_place() {
  ClusterPlace p;
#if defined(NF4_WGMMA_CODE)
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(p.rank), "=r"(p.size));
#endif
  return p;
}
[[maybe_unused]] __device__ __forceinline__ void cluster_sync() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
template <class T>
__device__ __forceinline__ const T* cluster_map(const T* p, unsigned rank) {
#if defined(NF4_WGMMA_CODE)
  std::uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(reinterpret_cast<std::uint64_t>(p)), "r"(rank));
  return reinterpret_cast<const T*>(out);
#else
  (void)rank;
  return p;
#endif
}

// CLUSTER: the S parts of k are summed by the C CTAs of a thread-block cluster (S / C = 1, 2 or, with
// FOUR, 4 consecutive parts each, for weights of few rows, whose row blocks alone leave SMs idle)
// instead of in turn by one CTA. Each CTA leaves each of its parts' sums in its shared memory (with
// FOUR, CTA 0 adds its four in turn first, the kernel's own additions); then CTA r adds, for its
// NT / C token blocks, every part's sums in part order over distributed shared memory,
// ((p0 + p1) + p2) + ..., as the kernel adds them in turn (the same additions, so the same bits),
// and stores them.
// GLOBAL: the parts over the CTAs of an ordinary grid instead (2^log2_part_group consecutive parts
// per CTA, 1 to S), each part's sums stored in its slot of a.workspace ([item][part][token
// block][thread] float4s) for gemv_mma_split_reduce_kernel, which adds them in part order. With
// FOLD the CTA of an item's first parts (rank 0) adds them in turn and stores their sum in slot 0,
// which the addition starts from; where it holds every part it stores the output itself and no
// addition runs. FOLD's total costs registers (the 128-token form 139 -> 230 on sm_90a), which slow
// its chunks, so the host takes it only where that pays (split_folds). Its x comes from
// the image gemv_mma_x_image_kernel lays out, one bulk copy per stage, so x takes no registers.
template <nf4_dtype XD, int NT, int D, bool CLUSTER, bool FOUR = false, bool GLOBAL = false, bool FOLD = false>
__global__ void __launch_bounds__(kThreads, 1) gemv_mma_wgmma_kernel(const __grid_constant__ GemvArgs a) {
#if !defined(NF4_WGMMA_CODE)
  (void)a;
  __trap();
#else
  // kRing: steps whose A fragments are in registers (as many as the accumulators leave room for);
  // kAhead: steps whose table loads are in flight ahead of the one being finished (two: on the
  // H100 one or three were up to 3% slower in the cluster form, docs/PERFORMANCE_LOG.md).
  constexpr int kTokens = 8 * NT, kSlots = D + 1, kAcc = kTokens / 2, kRing = NT >= 16 && !GLOBAL ? 2 : 4;
  constexpr int kAhead = NT < 16 || GLOBAL ? 2 : 0;
  wait_for_previous_grid();  // programmatic dependent launch (pdl.h): before any global access
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* xs = WideCta::after_table(smem);  // [stage][step][token block][k half][token][16 bytes]
  uint4* rings = reinterpret_cast<uint4*>(xs + kSlots * kWgStageBytes<NT>);  // [warp][stage][row][lane]
  // GLOBAL: stage st's bulk copies complete on the mbarrier at bars + 8 st (initialized before the
  // table's barriers in WideCta make it visible to every thread).
  const unsigned bars = static_cast<unsigned>(__cvta_generic_to_shared(rings + std::size_t{kWarps} * kSlots * 2 * kWarp));
  if (GLOBAL && threadIdx.x == 0) {
    for (int st = 0; st < kSlots; ++st) mbarrier_init(bars + 8 * st, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const WideCta cta(a, smem, NT);
  const unsigned tid = cta.tid;
  const int chunks = cta.chunks, span = cta.span;
  const auto* x = static_cast<const unsigned short*>(a.x);
  uint4* my_ring = rings + cta.warp * (kSlots * 2 * kWarp) + cta.lane;
  const unsigned xs_addr = static_cast<unsigned>(__cvta_generic_to_shared(xs));

  // This thread's 16-byte units of x per chunk: unit u = tid % 16 (columns 8u .. 8u + 7: t = u / 4,
  // q = u % 4) of token rows tid / 16 + 16 i. Its four words are the column pairs (4s, 4s + 1) and
  // (4s + 2, 4s + 3) of t's range for s = 2q, 2q + 1: k halves 0 and 1 of steps 2q and 2q + 1.
  constexpr int kMyUnits = kTokens * 16 / kThreads;
  static_assert(kTokens * 16 % kThreads == 0, "whole units per thread");
  const unsigned my_u = tid % 16, ut = my_u / 4, uq = my_u % 4;
  // The chunks this CTA sums: every part in turn, or its cluster rank's (GLOBAL: its work unit's)
  // `per` parts (none where they are empty: an empty part adds nothing, not even a zero).
  const ClusterPlace place = CLUSTER ? cluster_place() : ClusterPlace{};
  const unsigned cluster = place.size;
  // Parts per CTA: 1 or 2, or with FOUR 4 (the host launches it for S = 8 on clusters of 2 only).
  const unsigned per_log2 = GLOBAL ? a.log2_part_group : FOUR ? 2 : CLUSTER && (1u << a.log2_split) > cluster ? 1 : 0;
  // GLOBAL: work units of one item's part group each, `groups` per item.
  const unsigned groups = GLOBAL ? (1u << a.log2_split) >> per_log2 : 1u;
  // FOUR: where CTA 1 keeps its part q's sums: q = 3 in acc, q = 2 in total (both stored into the x
  // stages after the last chunk), q = 0 and 1 in `held` past the code rings.
  [[maybe_unused]] float4* const held = reinterpret_cast<float4*>(reinterpret_cast<unsigned char*>(rings) + std::size_t{kWarps} * kSlots * 2 * kWarp * sizeof(uint4));
  // (The 128-token form's cluster variant spills: 64 accumulators and their totals leave no room.)
  static_assert(!CLUSTER || NT == 8, "the cluster form for 64 tokens only");
  static_assert(!GLOBAL || ((NT == 8 || NT == 16) && !CLUSTER), "the split form for 64 or 128 tokens, without a cluster");
  static_assert(!FOUR || CLUSTER, "four parts per CTA in a cluster only");
  static_assert(!FOLD || GLOBAL, "the fold in the split form only");
  static_assert(!CLUSTER || 2 * kAcc * kThreads * sizeof(float) <= kSlots * kWgStageBytes<NT> + std::size_t{kWarps} * kSlots * 2 * kWarp * sizeof(uint4),
                "two parts' sums fit the x stages and the code rings");

  // GLOBAL: x from its image (gemv_mma_x_image_kernel), one bulk copy per chunk; bit st of
  // `phases`: the parity of stage st's next phase.
  [[maybe_unused]] const unsigned char* image = GLOBAL ? x_image<NT>(a) : nullptr;
  [[maybe_unused]] unsigned phases = 0;
  const auto run_items = [&](auto nested_tag) {
  constexpr bool kNested = decltype(nested_tag)::value;
  for (std::int64_t unit = blockIdx.x / cluster; unit < cta.items * groups; unit += gridDim.x / cluster) {
    const std::int64_t item = GLOBAL ? unit / groups : unit;
    const unsigned rank = GLOBAL ? static_cast<unsigned>(unit % groups) : place.rank;
    const int first = CLUSTER || GLOBAL ? min(static_cast<int>(rank << per_log2) * span, chunks) : 0;
    const int end = CLUSTER || GLOBAL ? min(first + (span << per_log2), chunks) : chunks;
    const std::int64_t rb = item / cta.token_tiles, tt = item % cta.token_tiles;
    const std::int64_t row0 = (rb * kWarps + cta.warp) * kTileRows;
    const std::int64_t tok0 = tt * kTokens;
    const WideRows<kNested> rows(a, cta, row0);
    const unsigned short* x_src[kMyUnits];
    unsigned x_dst[kMyUnits];
#pragma unroll
    for (int i = 0; i < kMyUnits; ++i) {
      const unsigned r = tid / 16 + 16 * i;
      x_src[i] = x + min(tok0 + r, std::int64_t{a.m} - 1) * cta.k + 8 * my_u;
      x_dst[i] = (2 * uq) * kWgStepBytes<NT> + (r / 8) * 256 + (r % 8) * 16 + 4 * ut;
    }
    // Chunk c's x into registers (zeros past k: whole units, as k % 32 == 0 here).
    uint4 xr[kMyUnits];
    const auto load_x = [&](int c) {
      const std::uint32_t base = static_cast<std::uint32_t>(c) * kChunkCols;
      const bool live = c < end && static_cast<std::uint64_t>(base + 8 * my_u) < cta.uk;
#pragma unroll
      for (int i = 0; i < kMyUnits; ++i) xr[i] = live ? __ldg(reinterpret_cast<const uint4*>(x_src[i] + base)) : make_uint4(0, 0, 0, 0);
    };
    const auto store_x = [&](unsigned st) {
      unsigned char* stage = xs + st * kWgStageBytes<NT>;
#pragma unroll
      for (int i = 0; i < kMyUnits; ++i) {
        unsigned char* p = stage + x_dst[i];
        *reinterpret_cast<std::uint32_t*>(p) = xr[i].x;
        *reinterpret_cast<std::uint32_t*>(p + 128) = xr[i].y;
        *reinterpret_cast<std::uint32_t*>(p + kWgStepBytes<NT>) = xr[i].z;
        *reinterpret_cast<std::uint32_t*>(p + kWgStepBytes<NT> + 128) = xr[i].w;
      }
    };
    const auto copy_codes = [&](int c, unsigned st) {
      if (c < end) rows.copy_codes(my_ring + st * 2 * kWarp, c);
      copy_commit();
    };
    float acc[kAcc];
    [[maybe_unused]] float total[kAcc];  // the parts' sum (the split form: rank 0's parts' only)
    std::uint32_t af[kRing][4];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    // Chunk c's eight steps: step s's A fragment is decoded while the MMAs of the steps before it
    // run (kRing steps' fragments in registers, each rewritten only after the MMA that read it has
    // completed). The MMAs are not waited for here: a chunk's stage is next written two chunks
    // later, after the waits of the chunk between.
    const auto body = [&](int c, const WideStats& w, unsigned st) {
      const uint4 lo = my_ring[(st * 2) * kWarp], hi = my_ring[(st * 2 + 1) * kWarp];
      float am[2];
      rows.scales(c, w, am);
      // Step s's descriptor is stage 0's plus s steps in its address field: every address in the
      // stage lies below 2^18 bytes (the dynamic shared memory), so the field never carries.
      const std::uint32_t desc0 = wgmma_desc_lo(xs_addr + st * kWgStageBytes<NT>);
      // The table loads of steps s + 1 .. s + kAhead are in flight while step s's fragment is
      // finished (where the registers allow), so their latency hides behind the multiplies and
      // MMA issue of the steps before.
      TablePairs ahead[kAhead > 0 ? kAhead : 1];
#pragma unroll
      for (int i = 0; i < kAhead; ++i) ahead[i] = table_lookup(smem, lo, hi, cta.lane_off, i);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        TablePairs e;
        if constexpr (kAhead > 0) {
          e = ahead[0];
#pragma unroll
          for (int i = 0; i + 1 < kAhead; ++i) ahead[i] = ahead[i + 1];
          if (s + kAhead < 8) ahead[kAhead - 1] = table_lookup(smem, lo, hi, cta.lane_off, s + kAhead);
        } else {
          e = table_lookup(smem, lo, hi, cta.lane_off, s);
        }
        wgmma_wait<kRing - 1>();  // the MMA of step s - kRing (this chunk's or the last one's) is done
        std::uint32_t(&f)[4] = af[s % kRing];
        table_finish<XD>(e, am[0], am[1], f);
        wgmma_fence();
        wgmma_step<XD, kTokens>(acc, f, desc0 + s * (kWgStepBytes<NT> >> 4), kWgmmaDescHi);
        wgmma_commit();
      }
    };
    // Before the accumulators are read (a part's last chunk): every MMA done.
    const auto settle = [&] {
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kAcc; ++i) register_fence(acc[i]);
    };

    // Parts as the other kernels: sums restart at each part's first chunk and join the total at its
    // last. x is loaded two chunks ahead and stored one ahead: the store at chunk c's step goes to
    // chunk c - 2's stage, whose MMAs every warpgroup has waited for (by the step waits of chunk c - 1)
    // before the barrier of step c.
    static_assert(D == 2, "x loaded two chunks ahead into the stage of the chunk two before");
    // GLOBAL: chunk c's image is copied into its stage at chunk c - 1's barrier (the stage of chunk
    // c - 3, whose MMAs are complete), the first chunk's here.
    const unsigned char* tile_image = image + static_cast<std::size_t>(tt) * cta.chunks * kWgStageBytes<NT>;
    const auto copy_x = [&](int c, unsigned stage) {
      bulk_copy_to_shared(xs_addr + stage * kWgStageBytes<NT>, tile_image + static_cast<std::size_t>(c) * kWgStageBytes<NT>, kWgStageBytes<NT>,
                          bars + 8 * stage);
    };
    if constexpr (GLOBAL) {
      if (tid == 0 && first < end) copy_x(first, 0);
    } else {
      load_x(first);
      store_x(0);
      load_x(first + 1);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) copy_codes(first + d, d);
    WideStats cur, next;
    rows.stats(first < end ? first : 0, cur);
    unsigned st = 0;
    // One code path for every chunk (no step under a branch the compiler cannot prove uniform,
    // which would make it serialize the MMAs): parts in turn, each a loop over its chunks.
    for (int p0 = first; p0 < end; p0 += span) {
      const int p1 = p0 + span < end ? p0 + span : end;
      for (int c = p0; c < p1; ++c) {
        if constexpr (GLOBAL) {
          mbarrier_wait(bars + 8 * st, (phases >> st) & 1u);
          phases ^= 1u << st;
        }
        copy_wait<D - 1>();
        async_proxy_fence();
        __syncthreads();  // chunk c's x is in; chunk c - 2's MMAs are complete in every warpgroup
        const unsigned next_stage = st == D ? 0 : st + 1, free_stage = st == 0 ? D : st - 1;
        if constexpr (GLOBAL) {
          if (tid == 0 && c + 1 < end) copy_x(c + 1, next_stage);
        } else {
          store_x(next_stage);  // chunk c + 1
          load_x(c + 2);
        }
        copy_codes(c + D, free_stage);
        if (c + 1 < end) rows.stats(c + 1, next);
        body(c, cur, st);
        cur = next;
        st = next_stage;
      }
      settle();
      if constexpr (GLOBAL) {
        if (FOLD && rank == 0) {
          // The first parts of k: added in turn, as the other kernels add them (their sum goes to
          // slot 0 below, or is the output where this CTA takes every part).
#pragma unroll
          for (int i = 0; i < kAcc; ++i) {
            total[i] = p0 == first ? acc[i] : __fadd_rn(total[i], acc[i]);
            acc[i] = 0.0f;
          }
        } else {
          // This part's sums to its slot, [token block][thread] float4s: each thread's 16 bytes
          // beside its neighbours'.
          float4* slot = reinterpret_cast<float4*>(a.workspace) + ((item << a.log2_split) + p0 / span) * (NT * kThreads) + tid;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            slot[j * kThreads] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
            acc[4 * j] = acc[4 * j + 1] = acc[4 * j + 2] = acc[4 * j + 3] = 0.0f;
          }
        }
      } else if constexpr (FOUR) {
        // CTA 0 adds its four parts in turn; CTA 1 keeps each apart (above `held`), to be added by
        // the reduction below, in part order.
        const int q = (p0 - first) / span;
        if (rank == 0 || q == 2) {
          const bool restart = p0 == first || rank != 0;
#pragma unroll
          for (int i = 0; i < kAcc; ++i) {
            total[i] = restart ? acc[i] : __fadd_rn(total[i], acc[i]);
            acc[i] = 0.0f;
          }
        } else if (q < 2) {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            held[(q * NT + j) * kThreads + tid] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
            acc[4 * j] = acc[4 * j + 1] = acc[4 * j + 2] = acc[4 * j + 3] = 0.0f;
          }
        }
      } else {
        // The first part's sums go to the total; in a cluster a second part's stay in acc (each
        // part is added by the reduction below, in part order).
        if (!CLUSTER || p0 == first)
#pragma unroll
          for (int i = 0; i < kAcc; ++i) {
            total[i] = p0 == first ? acc[i] : __fadd_rn(total[i], acc[i]);
            acc[i] = 0.0f;
          }
      }
    }
    copy_wait<0>();
    __syncthreads();  // the next item's stores and copies reuse every stage
    if constexpr (CLUSTER) {
      // Each part's sums into the x stages and code rings (part slot q, token block j of every
      // thread as [q][j][thread] float4s: conflict-free), then each CTA adds its token blocks' sums
      // of every part in part order (all loads issued before the first addition); the second
      // barrier keeps every CTA's sums in place until the others have read them. FOUR: slot 0
      // holds CTA 0's sum of its four parts and CTA 1's third part, slot 1 CTA 1's last.
      float4* sums = reinterpret_cast<float4*>(xs);
      if (first < end)
#pragma unroll
        for (int j = 0; j < NT; ++j) sums[j * kThreads + tid] = make_float4(total[4 * j], total[4 * j + 1], total[4 * j + 2], total[4 * j + 3]);
      if (first + (FOUR ? 3 : 1) * span < end)
#pragma unroll
        for (int j = 0; j < NT; ++j) sums[(NT + j) * kThreads + tid] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
      cluster_sync();
      const unsigned parts = static_cast<unsigned>((chunks + span - 1) / span), blocks = NT / cluster;  // empty parts add nothing
      for (unsigned j = rank * blocks; j < (rank + 1) * blocks; ++j) {
        // Value i: part i's sums; with FOUR, CTA 0's sum of parts 0 .. 3 and then CTA 1's parts 4 .. 7
        // (held 0, held 1, slot 0, slot 1). Values of parts past k are neither read nor added.
        constexpr unsigned kValues = FOUR ? 5 : kWarps;  // at most 8 parts (gemv_mma_split)
        const auto present = [&](unsigned i) { return FOUR ? i == 0 || 3 + i < parts : i < parts; };
        float4 v[kValues];
        if constexpr (FOUR) {
          v[0] = cluster_map(sums, 0)[j * kThreads + tid];
#pragma unroll
          for (unsigned q = 0; q < 4; ++q) {
            const float4* src = q < 2 ? held + q * NT * kThreads : sums + (q - 2) * NT * kThreads;
            if (present(1 + q)) v[1 + q] = cluster_map(src, 1)[j * kThreads + tid];
          }
        } else {
#pragma unroll
          for (unsigned r = 0; r < kValues; ++r)
            if (present(r)) v[r] = cluster_map(sums, r >> per_log2)[((r & ((1u << per_log2) - 1)) * NT + j) * kThreads + tid];
        }
        float sum[4];
        add_in_part_order(v, present, sum);
        store_wide_block(a, cta, row0, tok0, static_cast<int>(j), sum);
      }
      cluster_sync();
    } else if constexpr (GLOBAL) {
      // FOLD: rank 0's sum of the first parts, the output where it took every part, else slot 0,
      // which the addition starts from.
      if (FOLD && rank == 0) {
        if (per_log2 == a.log2_split) {
          store_wide<NT>(a, cta, row0, tok0, total);
        } else {
          float4* slot = reinterpret_cast<float4*>(a.workspace) + (item << a.log2_split) * (NT * kThreads) + tid;
#pragma unroll
          for (int j = 0; j < NT; ++j) slot[j * kThreads] = make_float4(total[4 * j], total[4 * j + 1], total[4 * j + 2], total[4 * j + 3]);
        }
      }
    } else {
      store_wide<NT>(a, cta, row0, tok0, total);
    }
  }
  };
  if (a.nested) run_items(std::true_type{});
  else run_items(std::false_type{});
#endif
}

// The split form's second kernel: one CTA per item and 8-token block, thread tid adding the
// values thread tid of the first kernel left in each part's slot, in part order
// ((p0 + p1) + p2) + ..., as the other kernels add them (the same bits), then storing them where
// the other kernels do (store_wide_block). Slot 0 holds the sum of the first P = 2^log2_part_group
// parts (rank 0 added them in that order; P = 1 without the fold: split_folds), so the addition
// starts there and goes on from part P.
// Parts past k were not written and are not read. Not launched where P = S (no part left).
template <int NT>
__global__ void __launch_bounds__(kThreads) gemv_mma_split_reduce_kernel(const __grid_constant__ GemvArgs a) {
  wait_for_previous_grid();  // the first kernel's sums (pdl.h)
  const unsigned tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, g = lane / 4, t = lane % 4;
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  const std::int64_t item = blockIdx.x / NT;
  const int j = static_cast<int>(blockIdx.x % NT);
  if (item >= grid.items) return;
  const PartPlan pp = part_plan(a, warp, false);  // S parts of span chunks each
  const unsigned first_parts = split_folds<NT>(a.log2_split, a.log2_part_group) ? 1u << a.log2_part_group : 1u;
  const auto present = [&](unsigned q) { return q < pp.S && q * pp.span < pp.chunks && (q == 0 || q >= first_parts); };
  const float4* slots = reinterpret_cast<const float4*>(a.workspace) + (item << a.log2_split) * (NT * kThreads) + j * kThreads + tid;
  float4 v[kWarps];  // at most 8 parts (gemv_mma_split)
#pragma unroll
  for (unsigned q = 0; q < kWarps; ++q)
    if (present(q)) v[q] = slots[q * NT * kThreads];
  float sum[4];
  add_in_part_order(v, present, sum);
  const std::int64_t rb = item / grid.token_tiles, tt = item % grid.token_tiles;
  const struct {
    std::int64_t n;
    unsigned g, t;
  } lane_place{a.n, g, t};
  store_wide_block(a, lane_place, (rb * kWarps + warp) * kTileRows, tt * 8 * NT, j, sum);
}

// The cluster form's modelled time (us on an H100, fitted there on one, two and four parts per CTA:
// docs/PERFORMANCE_LOG.md, "Four parts of k per CTA"): waves of the clusters the device holds at
// once, each item a CTA's parts' chunks plus a fixed cost (its pipeline's start, two cluster
// barriers, the parts' addition).
double cluster_time(std::int64_t items, std::int64_t span, std::int64_t per, std::int64_t at_once) {
  constexpr double kClusterPerChunk = 1.09, kClusterItem = 5.4;
  return static_cast<double>((items + at_once - 1) / at_once) * (static_cast<double>(per * span) * kClusterPerChunk + kClusterItem);
}

// Per kernel: the dynamic shared memory allowance raised once per device, the occupancy once.
struct MmaLaunchCache {
  std::mutex mu;
  bool raised[64] = {};
  int blocks[64] = {};
  int clusters[64][4] = {};  // clusters of 2^i CTAs resident at once (0: not asked yet)
  bool waits[64] = {};       // the code waits for the previous grid (pdl.h)
};

constexpr std::size_t mma_shared_bytes(bool lut) { return (lut ? 0 : kPairTableBytes) + kWarps * sizeof(Ring) + (256 + 16) * sizeof(float); }

// A kernel's launch: `items` work items over at most the resident CTAs, `cluster` CTAs per item
// where a cluster shares one. has_code: whether the kernel's PTX version can run it (a build whose
// code for this device is a trap stub, compute_75 PTX run on a newer GPU for a bf16 variant, has
// nothing to run: the caller reports the exact contract instead).
cudaError_t plan_launch(MmaLaunchCache& cache, const void* fn, std::size_t smem, bool (*has_code)(int), std::int64_t items, int sms,
                        GemvKernelLaunch* out, unsigned cluster = 1, unsigned threads = kThreads) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device >= 64) return cudaErrorInvalidDevice;
  int log2 = 0;
  while ((1u << log2) < cluster) ++log2;
  if (log2 >= 4) return cudaErrorInvalidConfiguration;
  std::int64_t resident = 0;  // CTAs, or clusters, that run at once
  bool pdl = false;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (!cache.raised[device]) {
      cudaFuncAttributes attr{};
      if (cudaError_t e = cudaFuncGetAttributes(&attr, fn); e != cudaSuccess) return e;
      if (!has_code(attr.ptxVersion * 10)) return cudaErrorInvalidConfiguration;
      cache.waits[device] = ptx_waits_for_previous_grid(attr.ptxVersion);
      int optin = 0;
      if (cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device); e != cudaSuccess) return e;
      if (smem > static_cast<std::size_t>(optin)) return cudaErrorInvalidConfiguration;  // sm_86/89: 99 KB
      if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)); e != cudaSuccess) return e;
      if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cache.blocks[device], fn, static_cast<int>(threads), smem); e != cudaSuccess) return e;
      if (cache.blocks[device] < 1) return cudaErrorInvalidConfiguration;
      cache.raised[device] = true;
    }
    pdl = cache.waits[device];
    if (cluster <= 1) {
      resident = std::max<std::int64_t>(static_cast<std::int64_t>(cache.blocks[device]) * sms, 1);
    } else {
      // Clusters resident at once: fewer than SMs / cluster, as a cluster's CTAs share one GPC. A
      // grid of more would leave the clusters past them to run their items after the others.
      int& clusters = cache.clusters[device][log2];
      if (clusters == 0) {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t config = cluster_launch_config(cluster, kThreads, smem, nullptr, cluster, attr);
        if (cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, fn, &config); e != cudaSuccess) return e;
        if (clusters < 1) return cudaErrorInvalidConfiguration;
      }
      resident = clusters;
    }
  }
  out->fn = fn;
  out->threads = threads;
  out->smem = smem;
  out->grid = static_cast<unsigned>((items < resident ? items : resident) * cluster);
  out->cluster = cluster;
  out->pdl = pdl;
  return cudaSuccess;
}

// The launch's work items (item_grid) for the warp groups a schedule gives a CTA.
std::int64_t mma_items(const GemvArgs& a, bool split, std::int64_t rows, int nt) {
  return item_grid(a.n, a.m, split ? kWarps >> a.log2_split : kWarps, rows, nt).items;
}

template <nf4_dtype XD, int NT, bool SPLIT, bool VEC, bool K8>
cudaError_t plan_variant(const GemvArgs& a, int sms, GemvKernelLaunch* out) {
  static MmaLaunchCache cache;
  return plan_launch(cache, reinterpret_cast<const void*>(&gemv_mma_kernel<XD, NT, SPLIT, VEC, K8>), mma_shared_bytes(kMmaLut<NT>),
                     [](int arch) { return mma_has_code<XD, K8>(arch); }, mma_items(a, SPLIT, kTileRows, NT), sms, out);
}

template <nf4_dtype XD, int NT, int RT, bool SPLIT, int D, bool SX, int W>
cudaError_t plan_stream(const GemvArgs& a, int sms, GemvKernelLaunch* out) {
  static MmaLaunchCache cache;
  // A row group's items (the kernel's walk): as many CTAs as items, up to the resident ones.
  return plan_launch(cache, reinterpret_cast<const void*>(&gemv_mma_stream_kernel<XD, NT, RT, SPLIT, D, SX, W>), stream_shared_bytes<NT, RT, D, SX, W>(),
                     [](int arch) { return mma_has_code<XD, false>(arch); }, item_grid(a.n, a.m, 1, kTileRows * RT, NT).items, sms, out, 1, kWarp * W);
}

// Which warps take a row block's parts (the sums and their order are the same either way):
// split: one part per warp, so few row blocks still fill the device; single: one warp takes all
// parts in turn, which reads x once per CTA step for eight row blocks. Automatic: single where
// that gives every SM at least 16 warps.
GemvMmaSchedule resolve_schedule(const GemvArgs& a, GemvMmaSchedule schedule, std::int64_t rows, int nt, int sms) {
  if (schedule != GemvMmaSchedule::automatic) return schedule;
  const std::int64_t warps = item_grid(a.n, a.m, 1, rows, nt).items;  // a warp per row tile and token tile
  return warps >= 16 * static_cast<std::int64_t>(sms) ? GemvMmaSchedule::single : GemvMmaSchedule::split;
}

// The ring kernel. The element path and sm_75's steps are compiled split only.
template <nf4_dtype XD, int NT, bool VEC, bool K8>
cudaError_t plan_schedule(const GemvArgs& a, GemvMmaSchedule schedule, int sms, GemvKernelLaunch* out) {
  if constexpr (!VEC || K8) {
    if (schedule == GemvMmaSchedule::single) return cudaErrorInvalidValue;
    return plan_variant<XD, NT, true, VEC, K8>(a, sms, out);
  } else {
    return resolve_schedule(a, schedule, kTileRows, NT, sms) == GemvMmaSchedule::split ? plan_variant<XD, NT, true, VEC, K8>(a, sms, out)
                                                                                        : plan_variant<XD, NT, false, VEC, K8>(a, sms, out);
  }
}

template <nf4_dtype XD, bool VEC, bool K8>
cudaError_t plan_tiles(const GemvArgs& a, GemvMmaSchedule schedule, int sms, GemvKernelLaunch* out) {
  // Token tiles per warp by m: W is decoded once per tile, the accumulators are 4 registers per 8 tokens.
  if (a.m <= 8) return plan_schedule<XD, 1, VEC, K8>(a, schedule, sms, out);
  if (a.m <= 16) return plan_schedule<XD, 2, VEC, K8>(a, schedule, sms, out);
  // 8 tiles (64 tokens) would need more than 255 registers with the loads the steps keep in flight.
  return plan_schedule<XD, 4, VEC, K8>(a, schedule, sms, out);
}

template <nf4_dtype XD, int NT>
cudaError_t plan_wide(const GemvArgs& a, int sms, GemvKernelLaunch* out) {
  static MmaLaunchCache cache;
  return plan_launch(cache, reinterpret_cast<const void*>(&gemv_mma_wide_kernel<XD, NT, kWideDepth>), wide_shared_bytes<NT, kWideDepth>(),
                     [](int arch) { return mma_has_code<XD, false>(arch); }, item_grid(a.n, a.m, kWarps, kTileRows, NT).items, sms, out);
}

// A planned cluster launch's modelled time (its grid holds every item's cluster or as many as fit).
double cluster_launch_time(const GemvArgs& a, const GemvKernelLaunch& l) {
  const std::int64_t parts = std::int64_t{1} << a.log2_split, chunks = chunk_count(a.k);
  const std::int64_t items = item_grid(a.n, a.m, kWarps, kTileRows, 8).items;
  return cluster_time(items, (chunks + parts - 1) / parts, parts / l.cluster, l.grid / l.cluster);
}

// One warpgroup kernel's launch: `cluster` CTAs per item (1: none).
template <nf4_dtype XD, int NT, bool CLUSTER, bool FOUR>
cudaError_t plan_wgmma_kernel(const GemvArgs& a, int sms, GemvKernelLaunch* out, unsigned cluster) {
  static MmaLaunchCache cache;
  const void* fn = reinterpret_cast<const void*>(&gemv_mma_wgmma_kernel<XD, NT, kWideDepth, CLUSTER, FOUR>);
  const auto has_code = [](int arch) { return kWgmmaBuilt && arch == 900; };
  return plan_launch(cache, fn, wgmma_shared_bytes<NT, kWideDepth, FOUR>(), has_code, item_grid(a.n, a.m, kWarps, kTileRows, NT).items, sms, out,
                     cluster);
}

// The split forms' modelled time (us on an H100, fitted there on both forms with 1 to 8 parts per
// CTA, within 8% for 64 tokens and 2% for 128: docs/PERFORMANCE_LOG.md, "The split form for 128
// tokens, and the models refitted"; the chunk's cost and x's image refitted in "x through a bulk
// copy"): waves of the resident CTAs over the units, each its chunks plus a fixed cost, then the
// part sums' traffic (written, then read by the addition), x's image (a third kernel, and its
// bytes written and read) and, for 64 tokens, a fixed cost of the addition.
template <int NT>
double split_time(std::int64_t units, std::int64_t resident, std::int64_t unit_chunks, std::size_t sums_bytes, std::size_t image_bytes) {
  constexpr double kPerChunk = NT == 8 ? 0.91 : 1.16, kPerWave = NT == 8 ? 0.97 : 5.6, kPerMiB = NT == 8 ? 0.53 : 0.61,
                   kFixed = NT == 8 ? 4.5 : 0.0, kImageFixed = 0.8, kImagePerMiB = 0.6;
  return static_cast<double>((units + resident - 1) / resident) * (static_cast<double>(unit_chunks) * kPerChunk + kPerWave) +
         static_cast<double>(sums_bytes) / (1 << 20) * kPerMiB + kFixed + kImageFixed +
         static_cast<double>(image_bytes) / (1 << 20) * kImagePerMiB;
}

// The split form for 8 NT tokens: items x S / P work units of P consecutive parts (P = 1 to S:
// forced_parts, else whichever takes less modelled time by the CTAs resident at once), then the
// addition; its modelled time into *time where asked.
template <nf4_dtype XD, int NT>
cudaError_t plan_wgmma_split(GemvArgs& a, int sms, GemvKernelLaunch* out, int forced_parts, double* time = nullptr) {
  static MmaLaunchCache plain_cache, fold_cache;
  const unsigned parts = 1u << a.log2_split;
  if (forced_parts != 0 && forced_parts != 1 && forced_parts != 2 && forced_parts != 4 && forced_parts != 8) return cudaErrorInvalidValue;
  if (forced_parts > static_cast<int>(parts)) forced_parts = static_cast<int>(parts);  // k has fewer parts
  const void* plain_fn = reinterpret_cast<const void*>(&gemv_mma_wgmma_kernel<XD, NT, kWideDepth, false, false, true, false>);
  const void* fold_fn = reinterpret_cast<const void*>(&gemv_mma_wgmma_kernel<XD, NT, kWideDepth, false, false, true, true>);
  const auto has_code = [](int arch) { return kWgmmaBuilt && arch == 900; };
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  const std::int64_t items = grid.items;
  const std::int64_t chunks = chunk_count(a.k), span = (chunks + parts - 1) / parts;
  const std::size_t image_bytes = x_image_bytes<NT>(grid.token_tiles, a.k);
  unsigned best_log2 = 0;
  double best = 1e300;
  for (unsigned per_log2 = 0; per_log2 <= a.log2_split; ++per_log2) {
    if (forced_parts != 0 && (1 << per_log2) != forced_parts) continue;
    GemvKernelLaunch l;
    const bool folds = split_folds<NT>(a.log2_split, per_log2);
    if (cudaError_t e = plan_launch(folds ? fold_cache : plain_cache, folds ? fold_fn : plain_fn, wgmma_shared_bytes<NT, kWideDepth, false, true>(), has_code,
                                    items * (parts >> per_log2), sms, &l);
        e != cudaSuccess)
      return e;
    // Slots written and read: none where P = S; with the fold rank 0's one and every other part's;
    // without it a slot per part.
    const std::size_t slots = per_log2 == a.log2_split ? 0
                              : folds                  ? static_cast<std::size_t>(items) * (parts - (1u << per_log2) + 1)
                                                       : static_cast<std::size_t>(items) * parts;
    const double t = split_time<NT>(items * (parts >> per_log2), l.grid, span << per_log2, slots * kWgPartBytes<NT>, image_bytes);
    if (t < best) best = t, best_log2 = per_log2, *out = l;
  }
  if (time) *time = best;
  a.log2_part_group = static_cast<std::uint8_t>(best_log2);
  // x's image first: its 16-byte rows over at most 8 CTAs per SM, grid-stride.
  const std::int64_t image_rows = grid.token_tiles * chunks * kImageRowsPerChunk<NT>;
  out->before_fn = reinterpret_cast<const void*>(&gemv_mma_x_image_kernel<NT>);
  out->before_grid = static_cast<unsigned>(std::min<std::int64_t>((image_rows + kThreads - 1) / kThreads, std::int64_t{8} * sms));
  out->before_threads = kThreads;
  // The addition where some part is left to add (P < S).
  if (best_log2 < a.log2_split) {
    out->then_fn = reinterpret_cast<const void*>(&gemv_mma_split_reduce_kernel<NT>);
    out->then_grid = static_cast<unsigned>(items * NT);
    out->then_threads = kThreads;
  }
  out->workspace_bytes = split_sums_bytes<NT>(items, a.log2_split, best_log2) + image_bytes;
  return cudaSuccess;
}

// The cluster form takes a cluster of S CTAs (a part each), of S / 2 (two parts each) or of S / 4
// (four each), whichever runs its items in fewer chunk-times by the clusters the device holds at
// once (clusters of 8 leave more SMs idle than clusters of 4, and those than clusters of 2: a
// cluster's CTAs share a GPC). forced_parts: parts per CTA, 1, 2 or 4 (fewer where k has fewer parts).
template <nf4_dtype XD, int NT, bool CLUSTER>
cudaError_t plan_wgmma(const GemvArgs& a, int sms, GemvKernelLaunch* out, int forced_parts = 0) {
  if constexpr (!CLUSTER) {
    (void)forced_parts;
    return plan_wgmma_kernel<XD, NT, false, false>(a, sms, out, 1);
  } else {
    const unsigned parts = 1u << a.log2_split, most = std::max(parts / 2, 1u);
    const auto plan_per = [&](unsigned per, GemvKernelLaunch* o) {
      return per == 4 ? plan_wgmma_kernel<XD, NT, true, true>(a, sms, o, parts / 4) : plan_wgmma_kernel<XD, NT, true, false>(a, sms, o, parts / per);
    };
    if (forced_parts != 0) {
      if (forced_parts != 1 && forced_parts != 2 && forced_parts != 4) return cudaErrorInvalidValue;
      return plan_per(std::min(static_cast<unsigned>(forced_parts), most), out);
    }
    const cudaError_t e = plan_per(1, out);
    if (e != cudaSuccess) return e;
    for (unsigned per = 2; per <= std::min(most, 4u); per *= 2) {
      GemvKernelLaunch fewer;
      if (plan_per(per, &fewer) == cudaSuccess && cluster_launch_time(a, fewer) < cluster_launch_time(a, *out)) *out = fewer;
    }
    return cudaSuccess;
  }
}

// Past 16 tokens the automatic choice takes the kernel of least modelled time: the streaming
// kernel decodes W once per 16 tokens with its work spread evenly over the SMs; the wide and
// warpgroup kernels decode it once per item of 32, 64 or 128 tokens, one CTA per SM, so they run
// whole waves of items (few rows leave SMs idle). Costs are SM-times of one 128-row, 128-column
// chunk, measured on an H100 (docs/PERFORMANCE_LOG.md, "The fast contract past 16 tokens" and
// "on warpgroup MMAs"), plus a fixed 5 us for the streaming kernel (its small-weight times, "... on
// a cluster's SMs"); the 64-token warpgroup kernel's as a cost per chunk and one per wave (its
// pipeline's start: "Four parts of k per CTA"), which a cost per chunk alone overstates for long k
// by a fifth, and so the 128-token one's ("The split form for 128 tokens": 1.48 us a chunk and
// 11.7 a wave, within 1% of 14336x4096, 4096x14336 and 8192x28672 at 128 and 256 tokens, where
// 1.91 a chunk overstated 8192x28672 by a quarter). wgmma: whether the warpgroup kernels can run
// (gemv_wgmma_available).
// cluster: the cluster form's modelled time from its planned launch (cluster_launch_time), which
// knows the clusters the device holds at once; split, split128: the split form's for 64 and 128
// tokens (split_time); unavailable: infinite.
GemvMmaKernel automatic_wide(std::int64_t n, std::int64_t k, std::int64_t m, int sms, bool wgmma, double cluster, double split,
                             double split128) {
  constexpr double kStreamPer16 = 0.85, kStreamFixed = 5.0, kWide32 = 1.10, kWide64 = 1.55, kWgmma64 = 0.967, kWgmma64Wave = 8.0, kWgmma128 = 1.48,
                   kWgmma128Wave = 11.7;
  // A split form must model a tenth faster than the rest: the models err by up to 8% (8192x28672 at
  // 64 tokens: the split form modelled 1% faster than the cluster form ran 9% slower), and a split
  // also takes the caller's memory.
  constexpr double kSplitMargin = 1.1;
  const double chunks = static_cast<double>(chunk_count(k));
  const double stream =
      static_cast<double>((m + 15) / 16) * (static_cast<double>(n) / (kWarps * kTileRows)) * chunks / sms * kStreamPer16 + kStreamFixed;
  const auto waves = [&](int nt, double per_chunk, double per_wave = 0.0) {
    const std::int64_t items = item_grid(n, m, kWarps, kTileRows, nt).items;
    return static_cast<double>((items + sms - 1) / sms) * (chunks * per_chunk + per_wave);
  };
  struct Cost {
    GemvMmaKernel kernel;
    double time;
  };
  Cost best{GemvMmaKernel::stream2, stream};
  // The warpgroup kernels last, so that without them the first two are the candidates.
  const Cost wide[] = {{GemvMmaKernel::wide32, waves(4, kWide32)},
                       {GemvMmaKernel::wide64, waves(8, kWide64)},
                       {GemvMmaKernel::wgmma64, waves(8, kWgmma64, kWgmma64Wave)},
                       {GemvMmaKernel::wgmma128, waves(16, kWgmma128, kWgmma128Wave)},
                       {GemvMmaKernel::wgmma64_cluster, cluster},
                       {GemvMmaKernel::wgmma64_split, split * kSplitMargin},
                       {GemvMmaKernel::wgmma128_split, split128 * kSplitMargin}};
  for (int i = 0; i < (wgmma ? 7 : 2); ++i)
    if (wide[i].time < best.time) best = wide[i];
  return best.kernel;
}

// The cluster form's modelled time for `a` where it can run (an sm_90a build on sm_90, k in more
// than one part), its launch planned into `plan`; else infinite.
template <nf4_dtype XD>
double wide_cluster_time(const GemvArgs& a, int cc, int sms, GemvKernelLaunch* plan) {
  if (!gemv_wgmma_available(cc) || a.log2_split == 0) return 1e300;
  return plan_wgmma<XD, 8, true>(a, sms, plan) == cudaSuccess ? cluster_launch_time(a, *plan) : 1e300;
}

// The split form's modelled time for `a` where it can run (an sm_90a build on sm_90, a workspace
// of `workspace` bytes that holds its sums); else infinite.
template <nf4_dtype XD, int NT>
double wide_split_time(const GemvArgs& a, int cc, int sms, std::size_t workspace) {
  if (!gemv_wgmma_available(cc)) return 1e300;
  GemvArgs priced = a;
  GemvKernelLaunch plan;
  double time = 1e300;
  if (plan_wgmma_split<XD, NT>(priced, sms, &plan, 0, &time) != cudaSuccess || plan.workspace_bytes > workspace) return 1e300;
  return time;
}

template <nf4_dtype XD, int NT, int RT, bool SX = false, int W = kStreamWarps<NT, RT>>
cudaError_t plan_stream_schedule(const GemvArgs& a, GemvMmaSchedule schedule, int sms, GemvKernelLaunch* out) {
  return resolve_schedule(a, schedule, kTileRows * RT, NT, sms) == GemvMmaSchedule::split ? plan_stream<XD, NT, RT, true, kStreamDepth, SX, W>(a, sms, out)
                                                                                           : plan_stream<XD, NT, RT, false, kStreamDepth, SX, W>(a, sms, out);
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
             : a.m > 16     ? automatic_wide(a.n, a.k, a.m, sms, gemv_wgmma_available(cc), wide_cluster_time<XD>(a, cc, sms, &cluster_plan),
                                             wide_split_time<XD, 8>(a, cc, sms, workspace), wide_split_time<XD, 16>(a, cc, sms, workspace))
             : a.m > 4 && large ? GemvMmaKernel::stream2
                                : GemvMmaKernel::stream1;
    if (kernel == GemvMmaKernel::wgmma64_cluster) {
      *out = cluster_plan;
      return cudaSuccess;
    }
  }
  if (kernel == GemvMmaKernel::ring) return plan_tiles<XD, true, false>(a, c.schedule, sms, out);
  if (!streams) return cudaErrorInvalidValue;
  if (kernel == GemvMmaKernel::wgmma64_split || kernel == GemvMmaKernel::wgmma128_split) {
    if (c.schedule == GemvMmaSchedule::split) return cudaErrorInvalidValue;
    if (!gemv_wgmma_available(cc)) return cudaErrorInvalidConfiguration;
    const cudaError_t e = kernel == GemvMmaKernel::wgmma64_split ? plan_wgmma_split<XD, 8>(a, sms, out, c.cluster_parts)
                                                                  : plan_wgmma_split<XD, 16>(a, sms, out, c.cluster_parts);
    // Without room for its sums it cannot run: refused when forced (a test, an A/B).
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

int gemv_mma_split(std::int64_t k) {
  // Parts of at least 8 chunks each (a part's copies stay pipelined), up to the CTA's 8 warps. A
  // function of k alone: the sum order may depend on nothing else.
  const std::int64_t chunks = chunk_count(k);
  int split = 1;
  while (split < kWarps && chunks >= 16 * split) split *= 2;
  return split;
}

bool gemv_wgmma_available(int cc) { return kWgmmaBuilt && cc == 90; }

bool gemv_mma_available(int cc, nf4_dtype x_dtype) {
  return cc >= 80 ? (x_dtype == NF4_DTYPE_F16 || x_dtype == NF4_DTYPE_BF16) : cc >= 75 && x_dtype == NF4_DTYPE_F16;
}

cudaError_t plan_gemv_mma(GemvArgs& a, nf4_dtype x_dtype, int cc, const GemvMmaChoice& choice, int sms, std::size_t workspace, GemvKernelLaunch* out) {
  if (!gemv_mma_available(cc, x_dtype)) return cudaErrorInvalidConfiguration;
  int split = gemv_mma_split(a.k), log2 = 0;
  while ((1 << log2) < split) ++log2;
  a.log2_split = static_cast<std::uint8_t>(log2);
  const bool k8 = choice.k8 || cc < 80;
  return x_dtype == NF4_DTYPE_F16 ? plan_dtype<NF4_DTYPE_F16>(a, k8, cc, choice, sms, workspace, out)
                                  : plan_dtype<NF4_DTYPE_BF16>(a, k8, cc, choice, sms, workspace, out);
}

}  // namespace nf4::cuda
