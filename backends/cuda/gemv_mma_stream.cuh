// SPDX-License-Identifier: MIT
// The streaming kernel (up to 16 tokens per warp), its table-fragment decode, and its plan.
// Part of gemv_mma.cu's translation unit: the headers gemv_mma_common, _ring, _stream, _wide and
// _wgmma.cuh each include the one before, and only gemv_mma.cu includes the last (hence the
// unnamed namespace).
#pragma once

#include "backends/cuda/gemv_mma_ring.cuh"

namespace nf4::cuda {
namespace {

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
constexpr int kStreamTableBytes = pair_table_bytes(kStreamCopies);  // 64 KB
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
// The same copy, always live: no size operand to choose.
[[maybe_unused]] __device__ __forceinline__ void copy16_shared(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
#else
  *static_cast<uint4*>(dst) = __ldg(static_cast<const uint4*>(src));
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
// copies: 32 (256-byte rows, entry (b, L) at 256 b + 8 L) or 16 (128-byte rows, entry (b, L) at
// 128 b + 8 (L % 16): the 256-token warpgroup form, whose shared memory has no room for 64 KB).
[[maybe_unused]] __device__ __forceinline__ void fill_stream_table(const GemvArgs& a, unsigned char* table, float* code2, float* values, unsigned tid,
                                                                   unsigned threads, int copies = kStreamCopies) {
  for (unsigned b = tid; b < 256; b += threads) {
    if (a.nested) code2[b] = __ldg(a.nested_code + b);
    if (b < 16) values[b] = a.quant_map ? __ldg(a.quant_map + b) : a.fp4_table[b];
  }
  __syncthreads();
  for (unsigned i = tid; i < static_cast<unsigned>(pair_table_bytes(copies)) / 16; i += threads) {
    const unsigned b = i / (copies / 2);
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
// kCopies: the table's (fill_stream_table): 32 (lane_off = 8 L) or 16 (lane_off = 16 (L % 16): the
// permute gives 256 b + 16 (L % 16), halved).
template <int kCopies = kStreamCopies>
__device__ __forceinline__ TablePairs table_lookup(const unsigned char* table, const uint4& lo, const uint4& hi, std::uint32_t lane_off, int s) {
  static_assert(kCopies == 32 || kCopies == 16, "the tables fill_stream_table lays out");
  constexpr int kShift = kCopies == 16 ? 1 : 0;
  const std::uint32_t wl = s < 2 ? lo.x : s < 4 ? lo.y : s < 6 ? lo.z : lo.w;
  const std::uint32_t wh = s < 2 ? hi.x : s < 4 ? hi.y : s < 6 ? hi.z : hi.w;
  // Byte b0 (columns 4s, 4s + 1) and b0 + 1 (4s + 2, 4s + 3) of each row's word to byte 1 of the
  // address, 8 L in byte 0.
  const unsigned b0 = (s & 1) * 2, sel0 = 0x5504u | (b0 << 4), sel1 = 0x5504u | ((b0 + 1) << 4);
  TablePairs e;
  e.p0 = *reinterpret_cast<const float2*>(table + (__byte_perm(wl, lane_off, sel0) >> kShift));
  e.p1 = *reinterpret_cast<const float2*>(table + (__byte_perm(wl, lane_off, sel1) >> kShift));
  e.q0 = *reinterpret_cast<const float2*>(table + (__byte_perm(wh, lane_off, sel0) >> kShift));
  e.q1 = *reinterpret_cast<const float2*>(table + (__byte_perm(wh, lane_off, sel1) >> kShift));
  return e;
}
// A chunk's table entries step by step (take(0), take(1), ... in turn), with the loads of the
// kAhead steps after the one taken in flight, so their latency hides behind the multiplies and MMA
// issue of the steps before (kAhead 0: each step's loaded when taken). kCopies: table_lookup's.
template <int kAhead, int kCopies = kStreamCopies>
struct TableAhead {
  const unsigned char* table;
  const uint4 &lo, &hi;
  std::uint32_t lane_off;
  TablePairs ahead[kAhead > 0 ? kAhead : 1];

  __device__ __forceinline__ TableAhead(const unsigned char* t, const uint4& l, const uint4& h, std::uint32_t off) : table(t), lo(l), hi(h), lane_off(off) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) ahead[i] = table_lookup<kCopies>(table, lo, hi, lane_off, i);
  }
  // The first kAhead steps' entries loaded by the caller (earlier, from the same lo and hi).
  __device__ __forceinline__ TableAhead(const unsigned char* t, const uint4& l, const uint4& h, std::uint32_t off,
                                        const TablePairs (&first)[kAhead > 0 ? kAhead : 1])
      : table(t), lo(l), hi(h), lane_off(off) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) ahead[i] = first[i];
  }
  __device__ __forceinline__ TablePairs take(int s) {
    if constexpr (kAhead > 0) {
      const TablePairs e = ahead[0];
#pragma unroll
      for (int i = 0; i + 1 < kAhead; ++i) ahead[i] = ahead[i + 1];
      if (s + kAhead < 8) ahead[kAhead - 1] = table_lookup<kCopies>(table, lo, hi, lane_off, s + kAhead);
      return e;
    } else {
      return table_lookup<kCopies>(table, lo, hi, lane_off, s);
    }
  }
};
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
    // 4 j + i). Token rows past m are never copied in full chunks (the partial chunk of k writes
    // them as zeros): an MMA's output token depends on its own B column alone and their outputs
    // are never stored, so whatever their stage rows hold (zeros, another item's x, anything)
    // reaches no stored bit. Copying zeros for them cost a copy and its address per unit and
    // chunk (most of the copies at one, two or nine tokens); reading row m - 1 for them instead
    // (copies of one row by many lanes) cost up to 16% at 5 and 12 tokens.
    [[maybe_unused]] const unsigned short* xcopy[SX ? NT : 1];
    [[maybe_unused]] unsigned xtok_live = 0;
    // Where this lane's unit of token row lane / 16 lies in a stage's tile, in units; row lane / 16
    // + 2 i is 32 i units further (wide_unit's swizzle depends on the row's parity alone).
    [[maybe_unused]] const unsigned xunit = wide_unit(lane / 16, lane % 16);
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
    // (empty past c_end). Full (c below `full`): every column of x lies inside k, so only the units
    // of token rows below m are copied, each without a size operand (predicated: a warp-wide branch
    // past the dead row pairs was 1-3% slower at 3-8 rows and 3-6% at 16); otherwise as many units
    // as the stage holds, zeros past k or m.
    const auto copy_codes = [&](std::int64_t c, std::int64_t c_end, std::uint32_t col, unsigned st, auto full_tag) {
      [[maybe_unused]] constexpr bool kFull = decltype(full_tag)::value;
      if (c < c_end) {
#pragma unroll
        for (int h = 0; h < H; ++h) copy16(my_ring + (st * H + h) * kWarp, rows.code[h] + col / 2, true, policy);
        if constexpr (SX) {
          const std::uint32_t xcol = static_cast<std::uint32_t>(c) * kChunkCols;  // the chunk's, for every lane
          if constexpr (kFull) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              const unsigned short* src = xcopy[j] + xcol;  // row lane / 16 + 2 i: 2 i k further
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                if (((xtok_live >> (4 * j + i)) & 1u) != 0) copy16_shared(x_tile(st, j) + xunit + 32 * i, src);
                src += 2 * k;
              }
            }
          } else {
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
        for (int d = 0; d < D; ++d) copy_codes(c0 + d, cf, static_cast<std::uint32_t>((c0 + d) * kChunkCols), d, std::true_type{});
        StreamChunk<NT, RT> set[2];
        load(static_cast<std::uint32_t>(c0 * kChunkCols), set[0]);
        unsigned st = 0;  // chunk c's ring stage: (c - c0) mod (D + 1)
        const auto step = [&](std::int64_t c, StreamChunk<NT, RT>& cur, StreamChunk<NT, RT>& next) {
          if constexpr (SX) __syncwarp();  // every lane's reads of the stage about to be refilled are done
          copy_codes(c + D, cf, static_cast<std::uint32_t>((c + D) * kChunkCols), st == 0 ? D : st - 1, std::true_type{});
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
        copy_codes(cf, c1, tail_col(cf), 0, std::false_type{});
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

template <nf4_dtype XD, int NT, int RT, bool SPLIT, int D, bool SX, int W>
cudaError_t plan_stream(const GemvArgs& a, int sms, GemvKernelLaunch* out) {
  static MmaLaunchCache cache;
  // A row group's items (the kernel's walk): as many CTAs as items, up to the resident ones.
  return plan_launch(cache, reinterpret_cast<const void*>(&gemv_mma_stream_kernel<XD, NT, RT, SPLIT, D, SX, W>), stream_shared_bytes<NT, RT, D, SX, W>(),
                     [](int arch) { return mma_has_code<XD, false>(arch); }, item_grid(a.n, a.m, 1, kTileRows * RT, NT).items, sms, out, 1, kWarp * W);
}

template <nf4_dtype XD, int NT, int RT, bool SX = false, int W = kStreamWarps<NT, RT>>
cudaError_t plan_stream_schedule(const GemvArgs& a, GemvMmaSchedule schedule, int sms, GemvKernelLaunch* out) {
  return resolve_schedule(a, schedule, kTileRows * RT, NT, sms) == GemvMmaSchedule::split ? plan_stream<XD, NT, RT, true, kStreamDepth, SX, W>(a, sms, out)
                                                                                           : plan_stream<XD, NT, RT, false, kStreamDepth, SX, W>(a, sms, out);
}

}  // namespace
}  // namespace nf4::cuda
