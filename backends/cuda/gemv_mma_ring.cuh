// SPDX-License-Identifier: MIT
// The ring kernel (gemv_mma_kernel: every shape, sm_75's m16n8k8 steps, the element path) and its plan.
// Part of gemv_mma.cu's translation unit: the headers gemv_mma_common, _ring, _stream, _wide and
// _wgmma.cuh each include the one before, and only gemv_mma.cu includes the last (hence the
// unnamed namespace).
#pragma once

#include "backends/cuda/gemv_mma_common.cuh"

namespace nf4::cuda {
namespace {

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

constexpr std::size_t mma_shared_bytes(bool lut) { return (lut ? 0 : kPairTableBytes) + kWarps * sizeof(Ring) + (256 + 16) * sizeof(float); }

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

}  // namespace
}  // namespace nf4::cuda
