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

// p (or v) itself, through an empty asm that emits nothing. The front end cannot look through
// it: a constant added to the result is not folded into the computation of p, so it reaches the
// assembler as an addition of its own, which becomes the immediate of the copy that reads the
// address; and a value formed once is not re-formed under each predicated copy that uses it.
template <class T>
__device__ __forceinline__ const T* apart(const T* p) {
  asm("" : "+l"(p));
  return p;
}
__device__ __forceinline__ unsigned apart(unsigned v) {
  asm("" : "+r"(v));
  return v;
}

// copy16_shared, always live (no size operand to choose), to a shared-window address, to which
// an immediate added after apart() stays the instruction's own.
[[maybe_unused]] __device__ __forceinline__ void copy16_shared_at(unsigned dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
#else
  *static_cast<uint4*>(__cvta_shared_to_generic(dst)) = __ldg(static_cast<const uint4*>(src));
#endif
}

// f(std::integral_constant<int, E>{}) for E = 0, 1, ... N - 1, while f returns true.
template <int E, int N, class F>
__device__ __forceinline__ void unroll_while(const F& f) {
  if constexpr (E < N) {
    if (f(std::integral_constant<int, E>{})) unroll_while<E + 1, N>(f);
  }
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
// Bytes of one stage of a warp's ring: the chunk's codes ([row][lane]) and, where x is staged
// (SX), its x ([token tile][wide_unit]). One stage offset then places every copy and read of a
// chunk.
template <int NT, int RT, bool SX>
constexpr int kStreamStageBytes = 2 * RT * kWarp * static_cast<int>(sizeof(uint4)) + (SX ? NT * kStreamXTileBytes : 0);

// The table, the nested code and values, the part sums and the rings ([warp][stage]).
template <int NT, int RT, int D, bool SX, int W>
constexpr std::size_t stream_shared_bytes() {
  return kStreamTableBytes + (256 + 16) * sizeof(float) + W * RT * NT * 4 * kWarp * sizeof(float) + std::size_t{W} * (D + 1) * kStreamStageBytes<NT, RT, SX>;
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
  constexpr unsigned kStage = kStreamStageBytes<NT, RT, SX>;
  // The chunk loop takes D + 1 chunks a turn, one per stage, where x is staged and one row tile
  // or one token tile leaves the registers for D + 1 sets of statistics; else two. With x in
  // registers D + 1 sets of it would not fit; with two row tiles and two token tiles the turn was
  // 1-3% slower on an H200 at 12-16 rows (4-5% faster with one token tile at 8 rows).
  constexpr bool kStageTurn = SX && (RT == 1 || NT == 1);
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
  // This warp's ring: stage s at byte s * kStage, named below by that offset (`so`), which the
  // chunk loop steps by constants alone.
  unsigned char* const my_ring = reinterpret_cast<unsigned char*>(partials + W * RT * NT * 4 * kWarp) + warp * (kSlots * kStage);
  // This lane's codes of row slot h in the stage at `so`: 512 h bytes past lane_codes + so.
  unsigned char* const lane_codes = my_ring + lane * sizeof(uint4);
  const auto code_slot = [lane_codes](unsigned so, int h) { return reinterpret_cast<uint4*>(lane_codes + so + h * kWarp * sizeof(uint4)); };
  // Staged x: a stage holds each token tile's chunk in wide_unit's order after the codes. The
  // lanes copy whole 16-byte units of consecutive columns (unit u of token row r for p = lane + 32 i,
  // r = p / 16, u = p % 16: four full lines per copy instruction), and each lane reads its own
  // columns back from the swizzled rows without bank conflicts.
  [[maybe_unused]] const auto x_tile = [my_ring](unsigned so, int j) {
    return reinterpret_cast<uint4*>(my_ring + so + H * kWarp * sizeof(uint4)) + j * (kStreamXTileBytes / 16);
  };
  // The same places as byte addresses of stage 0 (a stage at `so` is so bytes further, token tile
  // j 2048 j): the unit this lane reads for MMA steps 2 q and 2 q + 1 (token row g), and the one it
  // copies of token row lane / 16 (row lane / 16 + 2 r is 512 r bytes further: wide_unit's swizzle
  // depends on the row's parity alone).
  [[maybe_unused]] const unsigned char* x_read[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) x_read[q] = reinterpret_cast<const unsigned char*>(x_tile(0, 0) + wide_unit(g, 4 * t + q));
  [[maybe_unused]] unsigned char* const x_write = reinterpret_cast<unsigned char*>(x_tile(0, 0) + wide_unit(lane / 16, lane % 16));
  // lane_codes and x_write as shared-window addresses (the copies' destinations).
  const unsigned lane_codes_s = static_cast<unsigned>(__cvta_generic_to_shared(lane_codes));
  [[maybe_unused]] const unsigned x_write_s = static_cast<unsigned>(__cvta_generic_to_shared(x_write));
  // Bytes from a token row of x to the row two further. k is below 2^31 here (plan_dtype streams
  // only then); from its low word the compiler keeps the product in a uniform register.
  [[maybe_unused]] const std::uint64_t x_pair_bytes = 4 * std::uint64_t{static_cast<std::uint32_t>(k)};

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
    // per tile, row i being 2 i k elements further), and which of them lie on tokens below m
    // (xtok_live[j]: m less token row lane / 16 of tile j, at most 8, so that row lane / 16 + 2 i
    // is live where it exceeds 2 i: one 32-bit compare per copy where the compiler rebuilds the
    // predicate). Token rows past m are never copied in full chunks (the partial chunk of k writes
    // them as zeros): an MMA's output token depends on its own B column alone and their outputs
    // are never stored, so whatever their stage rows hold (zeros, another item's x, anything)
    // reaches no stored bit. Copying zeros for them cost a copy and its address per unit and
    // chunk (most of the copies at one, two or nine tokens); reading row m - 1 for them instead
    // (copies of one row by many lanes) cost up to 16% at 5 and 12 tokens.
    [[maybe_unused]] const unsigned short* xcopy[SX ? NT : 1];
    [[maybe_unused]] int xtok_live[SX ? NT : 1];
    if constexpr (SX) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const std::int64_t tok = tok0 + 8 * j + lane / 16;
        xcopy[j] = static_cast<const unsigned short*>(a.x) + min(tok, std::int64_t{a.m} - 1) * k + 8 * (lane % 16);
        xtok_live[j] = static_cast<int>(min(std::int64_t{a.m} - tok, std::int64_t{8}));
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
    // The partial chunk of k (column xcol, the same in every lane; `col`: tail_col's) into ring
    // stage 0, codes and, where staged, x: as many units as the stage holds, zeros past k or m.
    // Its sources are offsets from the part's pointers (code_src, x_src, at column col0), so that
    // the rows' own pointers are dead once those are formed (col lies below col0 in lanes past k,
    // which read column 0).
    const auto copy_tail = [&](const std::uint8_t* const (&code_src)[H], const unsigned char* const (&x_src)[SX ? NT : 1], std::uint32_t col0,
                               std::uint32_t col, std::uint32_t xcol, unsigned codes_at) {
#pragma unroll
      for (int h = 0; h < H; ++h) copy16_at(codes_at + h * kWarp * sizeof(uint4), code_src[h] + (std::int64_t{col} - col0) / 2, true, policy);
      if constexpr (SX) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const unsigned p = lane + 32 * i;
            const bool live = xtok_live[j] > 2 * i && static_cast<std::uint64_t>(xcol + 8 * (p % 16)) < uk;
            copy16_shared(x_tile(0, j) + wide_unit(p / 16, p % 16), live ? x_src[j] + 2 * (2 * i * k + (xcol - col0)) : x_src[j], live);
          }
      }
      copy_commit();
    };
    // A chunk's statistics and x from column `col`.
    const auto load = [&](std::uint32_t col, StreamChunk<NT, RT>& ch) {
      if constexpr (kNested) {
        // As rows.stats, with the nested entry found from the absmax entry's index alone:
        // (b + blk) >> lnbs, b the row's first block, is the nested block that rows.nest and
        // in_nested name, without holding either.
        const auto* const codes = static_cast<const std::uint8_t*>(a.absmax);
#pragma unroll
        for (int h = 0; h < H; ++h) {
          const std::uint8_t* at = rows.am8[h] + ((rows.in_block[h] + col) >> lbs);
          ch.am[h] = __ldg(at);
          ch.nest[h] = __ldg(a.nested_absmax + (static_cast<std::uint64_t>(at - codes) >> lnbs));
        }
      } else {
        rows.stats(col, lbs, lnbs, ch.am, ch.nest);
      }
      if constexpr (!SX) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) ch.x[j][i] = __ldg(reinterpret_cast<const uint4*>(xrow[j] + col) + i);
      }
    };
    // The MMAs of the chunk at column xcol (the same in every lane) from its loads `ch` and its
    // codes in the ring stage at `so`. Full: every lane's columns lie inside k; otherwise lanes past
    // k use zero weights and x.
    const auto body = [&](std::uint32_t xcol, const StreamChunk<NT, RT>& ch, unsigned so, auto full_tag) {
      constexpr bool kFull = decltype(full_tag)::value;
      const bool ck = kFull || static_cast<std::uint64_t>(xcol) + 32 * t < uk;
      uint4 codes[H];
#pragma unroll
      for (int h = 0; h < H; ++h) codes[h] = *code_slot(so, h);
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
            if constexpr (SX) staged = *reinterpret_cast<const uint4*>(x_read[s / 2] + so + j * kStreamXTileBytes);
            const uint4& u = SX ? staged : ch.x[j][s / 2];
            mma16<XD, false>(acc[i][j], af, ck ? (s % 2 ? u.z : u.x) : 0u, ck ? (s % 2 ? u.w : u.y) : 0u);
          }
        }
      }
    };
    // Part p's chunks into acc (from zero): its full chunks pipelined (a register set of the
    // statistics, and of x where it is not staged, per chunk of a turn, each named at compile
    // time), then the partial chunk of k, if this part has it, on its own.
    const auto run_part = [&](std::int64_t p) {
#pragma unroll
      for (int i = 0; i < RT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
      const std::int64_t c0 = p * span, c1 = c0 + span < chunks ? c0 + span : chunks;
      if (row0 >= n || c0 >= c1) return;
      const std::int64_t cf = c1 < full ? c1 : full;
      const std::uint32_t col0 = static_cast<std::uint32_t>(c0) * kChunkCols;
      // lane_codes_s plus a zero known only at run time (col0 < 2^31): sm_90a's ptxas (CUDA 13.0)
      // encodes an evict-first copy to lane_codes_s plus a constant as [R+UR+imm] with a
      // descriptor register it never sets, which faults (illegal instruction); from a value it
      // cannot fold it forms the address in a register.
      const unsigned lane_codes_rt = lane_codes_s + (col0 >> 31);
      const std::uint8_t* code_src[H];
#pragma unroll
      for (int h = 0; h < H; ++h) code_src[h] = rows.code[h] + col0 / 2;
      [[maybe_unused]] const unsigned char* x_src[SX ? NT : 1];
      if constexpr (SX) {
#pragma unroll
        for (int j = 0; j < NT; ++j) x_src[j] = reinterpret_cast<const unsigned char*>(xcopy[j] + col0);
      }
      if (c0 < cf) {
        // The part's full chunks, i = 0 .. nf - 1 at column col0 + 128 i, counted in 32 bits (cf
        // * 128 is at most k, below 2^31), their copies read from per-part pointers.
        const std::uint32_t nf = static_cast<std::uint32_t>(cf - c0);
        // Full chunk b + e's codes and, where staged, x into the stage at `so`, one copy group
        // (empty unless live): every column of x lies inside k, so only the units of token rows
        // below m are copied, each without a size operand (predicated: a warp-wide branch past
        // the dead row pairs was 1-3% slower at 3-8 rows and 3-6% at 16). e is a constant: each
        // source is a pointer at chunk b (one IMAD.WIDE) plus e's bytes in the copy's immediate,
        // and x's rows step from one another by a uniform 4 k bytes.
        const auto copy_full = [&](bool live, std::uint32_t b, int e, unsigned so) {
          if (live) {
            // A stage offset named at compile time goes to the copies' immediates.
            const unsigned codes_at = kStageTurn ? lane_codes_rt + so : apart(lane_codes_rt + so);
#pragma unroll
            for (int h = 0; h < H; ++h)
              copy16_at(codes_at + h * kWarp * sizeof(uint4), apart(code_src[h] + std::uint64_t{b} * (kChunkCols / 2)) + e * (kChunkCols / 2), true, policy);
            if constexpr (SX) {
              const unsigned x_at = apart(x_write_s + so);
#pragma unroll
              for (int j = 0; j < NT; ++j) {
                const unsigned char* src = apart(x_src[j] + std::uint64_t{b} * (kChunkCols * 2));
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                  if (xtok_live[j] > 2 * r) copy16_shared_at(x_at + j * kStreamXTileBytes + r * (32 * sizeof(uint4)), src + e * (kChunkCols * 2));
                  src = apart(src + x_pair_bytes);
                }
              }
            }
          }
          copy_commit();
        };
        if constexpr (SX) __syncwarp();  // the last part's reads of x's ring are done
#pragma unroll
        for (int d = 0; d < D; ++d) copy_full(d < nf, 0, d, d * kStage);
        if constexpr (kStageTurn) {
          // A turn of D + 1 chunks, one per ring stage, so that every stage offset and register
          // set is named at compile time: chunk i = b + e (b a multiple of D + 1) lies in stage
          // e, its statistics in set[e], and chunk i + D refills stage (e + D) mod (D + 1), chunk
          // i - 1's.
          StreamChunk<NT, RT> set[kSlots];
          load(col0, set[0]);
          const auto step = [&](std::uint32_t b, auto e_tag) {
            constexpr int e = decltype(e_tag)::value;
            const std::uint32_t i = b + e;
            __syncwarp();  // every lane's reads of the stage about to be refilled are done
            copy_full(i + D < nf, b, e + D, (e + D) % kSlots * kStage);
            const bool more = i + 1 < nf;
            if (more) load(col0 + (i + 1) * kChunkCols, set[(e + 1) % kSlots]);
            copy_wait<D>();
            __syncwarp();  // the other lanes' copies of chunk i's x are visible
            body(col0 + i * kChunkCols, set[e], e * kStage, std::true_type{});
            return more;
          };
          for (std::uint32_t b = 0; b < nf; b += kSlots) unroll_while<0, kSlots>([&](auto e_tag) { return step(b, e_tag); });
        } else {
          // Two register sets, so two chunks a turn; chunk i's stage at so = (i mod (D + 1))
          // kStage, and chunk i + D refills chunk i - 1's, at `fill`.
          StreamChunk<NT, RT> set[2];
          load(col0, set[0]);
          unsigned so = 0, fill = D * kStage;
          // Chunk i = b + e (b: the turn's first).
          const auto step = [&](std::uint32_t b, int e, StreamChunk<NT, RT>& cur, StreamChunk<NT, RT>& next) {
            const std::uint32_t i = b + e;
            if constexpr (SX) __syncwarp();  // every lane's reads of the stage about to be refilled are done
            copy_full(i + D < nf, b, e + D, fill);
            if (i + 1 < nf) load(col0 + (i + 1) * kChunkCols, next);
            copy_wait<D>();
            if constexpr (SX) __syncwarp();  // the other lanes' copies of chunk i's x are visible
            body(col0 + i * kChunkCols, cur, so, std::true_type{});
            fill = so;
            so = so == D * kStage ? 0 : so + kStage;
          };
          for (std::uint32_t b = 0; b < nf; b += 2) {
            step(b, 0, set[0], set[1]);
            if (b + 1 < nf) step(b, 1, set[1], set[0]);
          }
        }
        copy_wait<0>();
      }
      if (cf < c1) {  // c1 - 1 == full: the partial chunk
        StreamChunk<NT, RT> last;
        const std::uint32_t xcol = static_cast<std::uint32_t>(cf) * kChunkCols;  // cf = full: at most k
        if constexpr (SX) __syncwarp();
        copy_tail(code_src, x_src, col0, tail_col(cf), xcol, lane_codes_rt);
        load(tail_col(cf), last);
        copy_wait<0>();
        if constexpr (SX) __syncwarp();
        body(xcol, last, 0, std::false_type{});
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
