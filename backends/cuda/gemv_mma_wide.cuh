// SPDX-License-Identifier: MIT
// The wide kernel (x staged per CTA, W decoded once per 32 or 64 tokens), the CTA walk the
// warpgroup kernels share with it, and its plan.
// Part of gemv_mma.cu's translation unit: the headers gemv_mma_common, _ring, _stream, _wide and
// _wgmma.cuh each include the one before, and only gemv_mma.cu includes the last (hence the
// unnamed namespace).
#pragma once

#include "backends/cuda/gemv_mma_stream.cuh"

namespace nf4::cuda {
namespace {

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

  // copies: the pair table's (fill_stream_table), 32 or 16.
  __device__ __forceinline__ WideCta(const GemvArgs& a, unsigned char* smem, int nt, int copies = kStreamCopies) {
    code2 = reinterpret_cast<float*>(smem + pair_table_bytes(copies));
    tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, g = lane / 4, t = lane % 4;
    fill_stream_table(a, smem, code2, code2 + 256, tid, kThreads, copies);
    n = a.n, k = a.k, uk = static_cast<std::uint64_t>(k);
    lbs = a.log2_blocksize, lnbs = a.log2_nested_blocksize;
    const PartPlan pp = part_plan(a, warp, false);
    chunks = static_cast<int>(pp.chunks), span = static_cast<int>(pp.span);
    const ItemGrid grid = item_grid(n, a.m, kWarps, kTileRows, nt);
    token_tiles = grid.token_tiles, items = grid.items;
    offset = a.nested ? (a.offset_ptr ? __ldg(a.offset_ptr) : a.offset_value) : 0.0f;
    lane_off = copies == kStreamCopies ? 8 * lane : 16 * (lane % 16);  // table_lookup's
  }
  // Shared memory past the table, the nested code and the values.
  static __device__ __forceinline__ unsigned char* after_table(unsigned char* smem, int copies = kStreamCopies) {
    return smem + pair_table_bytes(copies) + (256 + 16) * sizeof(float);
  }
};

// Where an item of the wide and warpgroup kernels lies: its row block and token tile, this warp's
// first row and the item's first token.
struct WideItem {
  std::int64_t rb, tt, row0, tok0;
  __device__ __forceinline__ WideItem(const WideCta& cta, std::int64_t item, int tokens)
      : rb(item / cta.token_tiles), tt(item % cta.token_tiles), row0((rb * kWarps + cta.warp) * kTileRows), tok0(tt * tokens) {}
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
    const WideItem place(cta, item, kTokens);
    const std::int64_t row0 = place.row0, tok0 = place.tok0;
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

template <nf4_dtype XD, int NT>
cudaError_t plan_wide(const GemvArgs& a, int sms, GemvKernelLaunch* out) {
  static MmaLaunchCache cache;
  return plan_launch(cache, reinterpret_cast<const void*>(&gemv_mma_wide_kernel<XD, NT, kWideDepth>), wide_shared_bytes<NT, kWideDepth>(),
                     [](int arch) { return mma_has_code<XD, false>(arch); }, item_grid(a.n, a.m, kWarps, kTileRows, NT).items, sms, out);
}

}  // namespace
}  // namespace nf4::cuda
