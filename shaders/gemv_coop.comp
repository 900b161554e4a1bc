// SPDX-License-Identifier: MIT
// The product's fast contract (nf4.h NF4_GEMV_FAST, docs/GEMV.md section 6) on cooperative
// matrices (VK_KHR_cooperative_matrix): Y[m, n] = sum_k w16(n, k) * X[m, k], w16 the weight rounded
// to x's dtype exactly as dequantize.comp writes it, products summed in fp32 by the device's matrix
// unit. The CUDA mirror is backends/cuda/gemv_mma.cu.
//
// The order of the sum (what makes the result batch-invariant and repeatable):
//   - W's rows are the matrix A side (TM rows per tile), tokens the B side (TN per tile).
//   - K is cut into chunks of 128 columns and the chunks into PARTS consecutive ranges of
//     ceil(chunks / PARTS) chunks (PARTS a constant, so the cut depends on K alone). Each range is
//     summed in column order, one coopMatMulAdd per TK columns into an fp32 accumulator that starts
//     at zero, then the ranges' sums are added in order: ((p0 + p1) + p2) + p3 (an empty range adds
//     a zero accumulator). Every range is walked to its chunks' end: columns past K are zero weights
//     times zero x.
//   - Two schedules run that sequence. SPLIT (few tokens): subgroup p of the workgroup sums range p
//     for the workgroup's rows, and the ranges meet through shared memory at the end. Otherwise each
//     subgroup owns its rows and walks the ranges in turn (K in lockstep with the others, which share
//     its x tile), folding each range's accumulator into a total. KC, the columns staged at a time,
//     divides 128 and changes nothing in the sequence; nor do RT and TT (row and token tiles).
//   - So the operations for an output depend on K, TK (the device's shape for x's dtype) and PARTS
//     only, never on m; a column of the accumulator depends on the same column of B alone (tokens
//     past m are zeros and never written), so a token's result is the same alone or in any batch,
//     whichever schedule, token block or tile holds it.
// The same shader serves fp16 and bf16 x: it declares float16_t matrices, and the host retypes
// them to bfloat16 in the SPIR-V for bf16 x (SPV_KHR_bfloat16; vk_kernels.cpp, with_bfloat16),
// which glslang 13 cannot spell. Nothing else in the shader touches a 16-bit float: weights and x
// travel as 16-bit patterns in uint words.
//
// Memory shape: per stage (KC columns) each subgroup decodes its W tile (RT * TM rows) into shared
// memory, 32 weights per invocation from one 16-byte load of codes (vector path), in the row-major
// layout coopMatLoad reads (rows SW uvec4 apart, SW odd so that 8 consecutive rows' 16 bytes fall in
// distinct banks: consecutive lanes take consecutive rows, for the stores and the matrix loads
// alike). x's tile (TT * TN tokens) is staged beside it in 16-byte vectors. The next stage's codes,
// absmax and x are loaded into registers before this stage is decoded. Loops run to compile-time
// bounds (MAX_*) with the specialization constants as guards, so that every array indexes with
// constants once the driver unrolls.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

#include "format.glsl"

// The count too: y's dtype is read from two bits of the flags and stored by out_bits, which knows
// these three rows only.
#if NF4_DTYPE_COUNT != 3 || NF4_DTYPE_F16 != 0 || NF4_DTYPE_BF16 != 1 || NF4_DTYPE_F32 != 2
#error "gemv_coop.comp rounds weights to fp16 (0) or bf16 (1) and stores fp16, bf16 or fp32 (2)"
#endif

layout(constant_id = 0) const uint WG = 128;         // invocations: PARTS subgroups of SG
layout(constant_id = 1) const uint PARTS = 4;        // ranges of K (fixed: part of the K order), and subgroups
layout(constant_id = 2) const uint TM = 16;          // the device's matrix shape (a row of its property list)
layout(constant_id = 3) const uint TN = 16;
layout(constant_id = 4) const uint TK = 16;
layout(constant_id = 5) const uint TT = 1;           // token tiles per workgroup (1..MAX_TT)
layout(constant_id = 6) const uint KC = 128;         // columns per stage: 32, 64 or 128
layout(constant_id = 7) const bool VEC = false;      // k % 32 == 0 and 16-byte aligned codes (host-checked)
layout(constant_id = 8) const uint XD = 0;           // x dtype: the weights' rounding (0 fp16, 1 bf16)
layout(constant_id = 9) const uint SG = 32;          // the subgroup size (host: the device's)
layout(constant_id = 10) const bool SPLIT = true;    // subgroups take ranges of K (else rows)
layout(constant_id = 11) const uint RT = 1;          // row tiles per subgroup (1..MAX_RT)
layout(constant_id = 12) const bool XVEC = false;    // k % 8 == 0 and x 16-byte aligned (host-checked)
layout(constant_id = 13) const bool HWF16 = false;   // packHalf2x16 proven exact on this device (fp16 x)
layout(local_size_x_id = 0) in;

const uint MAX_RT = 2u, MAX_TT = 4u, MAX_ACC = MAX_RT * MAX_TT;
const uint MAX_UPL = 4u;                // 32-weight units per invocation and stage
const uint MAX_XPL = 8u;                // x vectors per invocation and stage
const uint CHUNK = 128u;                // columns per chunk: the unit of the K cut
const uint TOK = TT * TN;               // tokens per workgroup
const uint SW = KC / 8u + 1u;           // uvec4 per shared row (8 16-bit values each), odd
const uint SROWS = RT * TM;             // rows of a subgroup's W tile
const uint WROWS = SPLIT ? SROWS : PARTS * SROWS;  // rows of W per workgroup
const uint UNITS = SROWS * (KC / 32u);  // 32-weight units of W per stage and subgroup
const uint UPL = (UNITS + SG - 1u) / SG;
const uint XT = SPLIT ? SG : WG;        // invocations staging one x tile
const uint XVECS = TOK * (KC / 8u);     // 16-byte x vectors per tile and stage
const uint XPL = (XVECS + XT - 1u) / XT;
const uint XSETS = SPLIT ? PARTS : 1u;  // x tiles: one per subgroup, or one shared

// The push constants and bindings of gemv.comp (the host fills both the same way).
layout(push_constant) uniform Params {
  uint k;
  uint rows;         // rows of W in this dispatch
  uint row0;         // global index of its first row (for y)
  uint n;            // y's row stride
  uint m;            // rows of X and Y (1..256)
  uint elem_rem;     // first row's first element - EB (EB: the dispatch's base element, a block start)
  uint packed_off;
  uint absmax_off;
  uint qmap_off;
  uint nested_off;
  uint code_off;
  uint offset_word;
  uint offset_bits;
  uint block_rem;
  uint log2_bs;
  uint log2_nbs;
  uint x_off;
  uint y_off;
  uint pad_bits;     // unused here (the exact contract's padding)
  uint flags;        // bit 0 nested, bits 2-3 x dtype, bits 4-5 y dtype, bits 8-12 quant type
  uint groups;       // row groups (workgroups along x) of this dispatch
  uint zero;
} pc;

layout(std430, set = 0, binding = 0) readonly restrict buffer PackedBuf { uint packed_words[]; };
layout(std430, set = 0, binding = 0) readonly restrict buffer PackedVecBuf { uvec4 packed_vecs[]; };
layout(std430, set = 0, binding = 1) readonly restrict buffer AbsmaxBuf { uint absmax_words[]; };
layout(std430, set = 0, binding = 2) readonly restrict buffer QuantMapBuf { uint qmap_words[]; };
layout(std430, set = 0, binding = 3) readonly restrict buffer NestedAbsmaxBuf { uint nested_words[]; };
layout(std430, set = 0, binding = 4) readonly restrict buffer NestedCodeBuf { uint code_words[]; };
layout(std430, set = 0, binding = 5) readonly restrict buffer OffsetBuf { uint offset_words[]; };
layout(std430, set = 0, binding = 6) readonly restrict buffer XBuf { uint x_words[]; };
layout(std430, set = 0, binding = 6) readonly restrict buffer XVecBuf { uvec4 x_vecs[]; };
layout(std430, set = 0, binding = 7) buffer YBuf { uint y_words[]; };

shared float value_s[16];
shared float code_s[NF4_NESTED_CODE_SIZE];
// w_s[(p * SROWS + r) * SW + c / 8] holds subgroup p's row r, stage columns c..c+7 (16-bit
// patterns, the even column in each word's low half); x_s[(q * TOK + t) * SW + c / 8] token t's
// columns (q: the subgroup in SPLIT, else 0); acc_s[p * TM * TN + ...] one accumulator tile of
// subgroup p on its way to y.
shared uvec4 w_s[PARTS * SROWS * SW];
shared uvec4 x_s[XSETS * TOK * SW];
shared float acc_s[PARTS * TM * TN];

float g_offset;
// The next stage's operands, loaded one stage ahead (load_stage).
uvec4 next_codes[MAX_UPL];
float next_am[MAX_UPL];
uvec4 next_x[MAX_XPL];

bool nested() { return (pc.flags & 1u) != 0u; }
bool stored_table() { return ((NF4_STORED_TABLE_QUANT_TYPES >> ((pc.flags >> 8) & 31u)) & 1u) != 0u; }
uint y_dtype() { return (pc.flags >> 4) & 3u; }

// absmax of local block b: flat, its fp32; nested, fl32(fl32(code2[q] * s) + offset), no FMA.
float block_absmax(uint b) {
  if (nested()) {
    uint byte_index = pc.absmax_off + b;
    uint q = (absmax_words[byte_index >> 2] >> ((byte_index & 3u) << 3)) & 0xffu;
    float s = uintBitsToFloat(nested_words[pc.nested_off + ((pc.block_rem + b) >> pc.log2_nbs)]);
    precise float scaled = code_s[q] * s;
    precise float a = scaled + g_offset;
    return a;
  }
  return uintBitsToFloat(absmax_words[pc.absmax_off + b]);
}

uint code_at(uint e) {
  uint byte_ = e >> 1;
  uint b = (packed_words[pc.packed_off + (byte_ >> 2)] >> ((byte_ & 3u) << 3)) & 0xffu;
  return (e & 1u) != 0u ? (b >> NF4_ODD_NIBBLE_SHIFT) & 15u : (b >> NF4_EVEN_NIBBLE_SHIFT) & 15u;
}

// The weight as dequantize writes it in x's dtype: RNE(fl32(value * absmax)), by integer rounding
// (any input, NaN included).
uint w16(uint code, float am) {
  precise float v = value_s[code] * am;
  uint u = floatBitsToUint(v);
  return XD == 1u ? bf16_from_bits(u) : f16_from_bits(u);
}

// Two weights' 16-bit patterns (a low) where neither product can be NaN (finite absmax and table):
// bf16 by integer rounding without the NaN case; fp16 by packHalf2x16 where the device proved it
// equal to f16_from_bits on every non-NaN input (shaders/f16_check.comp), else f16_from_bits.
uint w16_pair(float a, float b) {
  if (XD == 1u) return bf16_pair_not_nan(floatBitsToUint(a), floatBitsToUint(b));
  if (HWF16) return packHalf2x16(vec2(a, b));
  return f16_from_bits(floatBitsToUint(a)) | (f16_from_bits(floatBitsToUint(b)) << 16);
}

uint out_bits(float v) {
  uint u = floatBitsToUint(v);
  bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint d = y_dtype();
  if (d == 0u) return nan ? 0x7e00u : f16_from_bits(u);
  if (d == 1u) return nan ? 0x7fc0u : bf16_from_bits(u);
  return nan ? 0x7fc00000u : u;
}

// Stores one 16-bit result into its half of y's word (the other half may be another row's, written
// by another workgroup).
void store_half(uint yi, uint bits) {
  uint word = pc.y_off + (yi >> 1);
  uint shift = (yi & 1u) << 4;
  atomicAnd(y_words[word], ~(0xffffu << shift));
  atomicOr(y_words[word], bits << shift);
}

// Rows r and r + 1 (local to the dispatch, r even) of token j.
void store_pair(uint r, uint j, float v0, float v1) {
  const bool second = r + 1u < pc.rows;
  const uint b0 = out_bits(v0);
  const uint b1 = second ? out_bits(v1) : 0u;
  const uint yi = j * pc.n + pc.row0 + r;
  if (y_dtype() == 2u) {
    y_words[pc.y_off + yi] = b0;
    if (second) y_words[pc.y_off + yi + 1u] = b1;
  } else if ((yi & 1u) == 0u && second) {
    y_words[pc.y_off + (yi >> 1)] = b0 | (b1 << 16);
  } else {
    store_half(yi, b0);
    if (second) store_half(yi + 1u, b1);
  }
}

// Accumulator i is row tile i / MAX_TT, token tile i % MAX_TT.
bool tile_used(uint i) { return i / MAX_TT < RT && i % MAX_TT < TT; }

void stage_barrier() {
  if (SPLIT) {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
  } else {
    memoryBarrierShared();
    barrier();
  }
}

// Loads the operands of the stage at column lc into next_*: on the vector path unit i of the lane
// (u = lane + i * SG) is row u % SROWS, columns (u / SROWS) * 32 .. + 31 of the stage; x vector i
// (v = xl + i * XT) is token v / (KC / 8), columns (v % (KC / 8)) * 8 .. + 7. Units past the rows
// or past k, and tokens past m, load zeros.
void load_stage(uint lc, uint lane, uint xl, uint row_base, uint tok_base, uint live_tokens) {
  if (VEC) {
    [[unroll]] for (uint i = 0u; i < MAX_UPL; ++i) {
      const uint u = lane + i * SG, r = u % SROWS, col = lc + (u / SROWS) * 32u;
      next_codes[i] = uvec4(0u);
      next_am[i] = 0.0;
      if (i < UPL && u < UNITS && row_base + r < pc.rows && col < pc.k) {
        const uint e = pc.elem_rem + (row_base + r) * pc.k + col;
        next_codes[i] = packed_vecs[(pc.packed_off >> 2) + (e >> 5)];
        next_am[i] = block_absmax(e >> pc.log2_bs);
      }
    }
  }
  if (XVEC) {
    [[unroll]] for (uint i = 0u; i < MAX_XPL; ++i) {
      const uint v = xl + i * XT, t = v / (KC / 8u), col = lc + (v % (KC / 8u)) * 8u;
      next_x[i] = uvec4(0u);
      if (i < XPL && v < XVECS && t < live_tokens && col < pc.k)
        next_x[i] = x_vecs[(pc.x_off >> 2) + ((tok_base + t) * pc.k + col) / 8u];
    }
  }
}

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;  // the host sizes WG as PARTS subgroups of SG
  const uint row_base = gl_WorkGroupID.x * WROWS + (SPLIT ? 0u : sg * SROWS);  // this subgroup's first row
  const uint tok_base = gl_WorkGroupID.y * TOK;
  const uint live_tokens = min(TOK, pc.m - tok_base);
  const uint wb = sg * SROWS * SW;             // this subgroup's W tile
  const uint xb = SPLIT ? sg * TOK * SW : 0u;  // the x tile it reads (and, in SPLIT, writes)
  const uint xl = SPLIT ? lane : lid;          // index among the invocations staging that tile

  if (lid < 16u)
    value_s[lid] = uintBitsToFloat(stored_table() ? qmap_words[pc.qmap_off + lid] : NF4_BUILTIN_VALUE_BITS[(pc.flags >> 8) & 31u][lid]);
  if (nested()) {
    for (uint i = lid; i < NF4_NESTED_CODE_SIZE; i += WG) code_s[i] = uintBitsToFloat(code_words[pc.code_off + i]);
    g_offset = uintBitsToFloat(pc.offset_word == 0xffffffffu ? pc.offset_bits : offset_words[pc.offset_word]);
  }
  // The tokens past m hold zeros for the whole run.
  for (uint i = lid; i < XSETS * TOK * SW; i += WG)
    if ((i / SW) % TOK >= live_tokens) x_s[i] = uvec4(0u);
  barrier();
  bool table_finite = true;
  [[unroll]] for (uint c = 0u; c < 16u; ++c) table_finite = table_finite && !isinf(value_s[c]) && !isnan(value_s[c]);

  coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> acc[MAX_ACC];
  coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> total[MAX_ACC];
  [[unroll]] for (uint i = 0u; i < MAX_ACC; ++i) {
    acc[i] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);
    total[i] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);
  }

  // The stages this subgroup walks: SPLIT, its range's; else all of K's, the ranges folded in turn
  // (fold: the range's accumulator into the total, the first one copied).
  const uint chunks = (pc.k + CHUNK - 1u) / CHUNK;
  const uint per = (chunks + PARTS - 1u) / PARTS;
  const uint lo = SPLIT ? min(sg * per, chunks) : 0u;
  const uint hi = SPLIT ? min(lo + per, chunks) : chunks;
  const uint s_lo = lo * (CHUNK / KC), s_hi = hi * (CHUNK / KC);
  const uint part_stages = per * (CHUNK / KC);
  uint folded = 0u;

  [[unroll]] for (uint i = 0u; i < MAX_UPL; ++i) {
    next_codes[i] = uvec4(0u);
    next_am[i] = 0.0;
  }
  [[unroll]] for (uint i = 0u; i < MAX_XPL; ++i) next_x[i] = uvec4(0u);
  if (s_lo < s_hi) load_stage(s_lo * KC, lane, xl, row_base, tok_base, live_tokens);

  for (uint s = s_lo; s < s_hi; ++s) {
    const uint c0 = s * KC;
    uvec4 codes[MAX_UPL];
    float am[MAX_UPL];
    uvec4 xv[MAX_XPL];
    [[unroll]] for (uint i = 0u; i < MAX_UPL; ++i) {
      codes[i] = next_codes[i];
      am[i] = next_am[i];
    }
    [[unroll]] for (uint i = 0u; i < MAX_XPL; ++i) xv[i] = next_x[i];
    if (s + 1u < s_hi) load_stage(c0 + KC, lane, xl, row_base, tok_base, live_tokens);

    if (VEC) {
      [[unroll]] for (uint i = 0u; i < MAX_UPL; ++i) {
        const uint u = lane + i * SG, r = u % SROWS, cu = u / SROWS;
        if (i >= UPL || u >= UNITS) continue;
        const uint at = wb + r * SW + cu * 4u;
        // Units past the rows or past k have zero codes and absmax: value * 0 = 0 (or -0: the
        // table's negative entries), so they are written as zero bits explicitly.
        const bool live = row_base + r < pc.rows && c0 + cu * 32u < pc.k;
        if (!live) {
          [[unroll]] for (uint w = 0u; w < 4u; ++w) w_s[at + w] = uvec4(0u);
        } else if (table_finite && !isinf(am[i]) && !isnan(am[i])) {
          [[unroll]] for (uint w = 0u; w < 4u; ++w) {
            uvec4 o;
            [[unroll]] for (uint t = 0u; t < 4u; ++t) {
              const uint byte_ = (codes[i][w] >> (8u * t)) & 0xffu;
              o[t] = w16_pair(value_s[(byte_ >> NF4_EVEN_NIBBLE_SHIFT) & 15u] * am[i], value_s[(byte_ >> NF4_ODD_NIBBLE_SHIFT) & 15u] * am[i]);
            }
            w_s[at + w] = o;
          }
        } else {
          // A NaN or infinite absmax or table entry: products may be NaN, rounded one by one.
          [[unroll]] for (uint w = 0u; w < 4u; ++w) {
            uvec4 o;
            [[unroll]] for (uint t = 0u; t < 4u; ++t) {
              const uint byte_ = (codes[i][w] >> (8u * t)) & 0xffu;
              o[t] = w16((byte_ >> NF4_EVEN_NIBBLE_SHIFT) & 15u, am[i]) | (w16((byte_ >> NF4_ODD_NIBBLE_SHIFT) & 15u, am[i]) << 16);
            }
            w_s[at + w] = o;
          }
        }
      }
    } else {
      // Element by element: any k, blocks straddling rows.
      for (uint p = lane; p < SROWS * (KC / 2u); p += SG) {
        const uint r = p / (KC / 2u), cp = p % (KC / 2u), col = c0 + 2u * cp;
        uint pair = 0u;
        if (row_base + r < pc.rows) {
          const uint e = pc.elem_rem + (row_base + r) * pc.k + col;
          if (col < pc.k) pair = w16(code_at(e), block_absmax(e >> pc.log2_bs));
          if (col + 1u < pc.k) pair |= w16(code_at(e + 1u), block_absmax((e + 1u) >> pc.log2_bs)) << 16;
        }
        w_s[wb + r * SW + cp / 4u][cp % 4u] = pair;
      }
    }
    // x: the live tokens' KC columns.
    if (XVEC) {
      [[unroll]] for (uint i = 0u; i < MAX_XPL; ++i) {
        const uint v = xl + i * XT, t = v / (KC / 8u);
        if (i < XPL && v < XVECS && t < live_tokens) x_s[xb + t * SW + v % (KC / 8u)] = xv[i];
      }
    } else {
      for (uint p = xl; p < live_tokens * (KC / 2u); p += XT) {
        const uint t = p / (KC / 2u), cp = p % (KC / 2u), col = c0 + 2u * cp, j = tok_base + t;
        uint pair = 0u;
        if (col < pc.k) {
          const uint i = j * pc.k + col;
          pair = (x_words[pc.x_off + (i >> 1)] >> ((i & 1u) << 4)) & 0xffffu;
          if (col + 1u < pc.k) pair |= ((x_words[pc.x_off + ((i + 1u) >> 1)] >> (((i + 1u) & 1u) << 4)) & 0xffffu) << 16;
        }
        x_s[xb + t * SW + cp / 4u][cp % 4u] = pair;
      }
    }
    stage_barrier();
    // A new range of K: its sum so far joins the total.
    if (!SPLIT && s != s_lo && s % part_stages == 0u) {
      [[unroll]] for (uint i = 0u; i < MAX_ACC; ++i) {
        if (!tile_used(i)) continue;
        if (folded == 0u)
          total[i] = acc[i];
        else
          total[i] = total[i] + acc[i];
        acc[i] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);
      }
      ++folded;
    }
    [[unroll]] for (uint kk = 0u; kk < KC; kk += TK) {
      coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a[MAX_RT];
      [[unroll]] for (uint rt = 0u; rt < MAX_RT; ++rt)
        if (rt < RT) coopMatLoad(a[rt], w_s, wb + rt * TM * SW + kk / 8u, SW, gl_CooperativeMatrixLayoutRowMajor);
      [[unroll]] for (uint t = 0u; t < MAX_TT; ++t) {
        if (t >= TT) continue;
        // B[c][j] = x(token j, column c): x_s is B in column-major order.
        coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> b;
        coopMatLoad(b, x_s, xb + t * TN * SW + kk / 8u, SW, gl_CooperativeMatrixLayoutColumnMajor);
        [[unroll]] for (uint rt = 0u; rt < MAX_RT; ++rt)
          if (rt < RT) acc[rt * MAX_TT + t] = coopMatMulAdd(a[rt], b, acc[rt * MAX_TT + t]);
      }
    }
    // The next stage overwrites this one's operands.
    stage_barrier();
  }

  if (SPLIT) {
    // Store, one tile at a time: the ranges' tiles through shared memory, added in range order.
    [[unroll]] for (uint rt = 0u; rt < MAX_RT; ++rt)
      [[unroll]] for (uint t = 0u; t < MAX_TT; ++t) {
        if (rt >= RT || t >= TT) continue;
        coopMatStore(acc[rt * MAX_TT + t], acc_s, sg * TM * TN, TN, gl_CooperativeMatrixLayoutRowMajor);
        barrier();
        // Invocation i takes rows 2q, 2q + 1 of token column tok (consecutive invocations,
        // consecutive rows of y).
        for (uint i = lid; i < (TM / 2u) * TN; i += WG) {
          const uint q = i % (TM / 2u), tok = i / (TM / 2u);
          const uint j = tok_base + t * TN + tok;
          const uint r = 2u * q, row = row_base + rt * TM + r;
          if (j >= pc.m || row >= pc.rows) continue;
          float v0 = acc_s[r * TN + tok], v1 = acc_s[(r + 1u) * TN + tok];
          [[unroll]] for (uint p = 1u; p < PARTS; ++p) {
            precise float s0 = v0 + acc_s[p * TM * TN + r * TN + tok];
            precise float s1 = v1 + acc_s[p * TM * TN + (r + 1u) * TN + tok];
            v0 = s0;
            v1 = s1;
          }
          store_pair(row, j, v0, v1);
        }
        barrier();
      }
  } else {
    // The last non-empty range, then a zero accumulator for each empty one (as SPLIT adds them).
    const uint ranges = (chunks + per - 1u) / per;
    [[unroll]] for (uint i = 0u; i < MAX_ACC; ++i) {
      if (!tile_used(i)) continue;
      if (folded == 0u)
        total[i] = acc[i];
      else
        total[i] = total[i] + acc[i];
      for (uint p = ranges; p < PARTS; ++p)
        total[i] = total[i] + coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);
    }
    // Each subgroup stores its own tiles through its slice of acc_s.
    [[unroll]] for (uint rt = 0u; rt < MAX_RT; ++rt)
      [[unroll]] for (uint t = 0u; t < MAX_TT; ++t) {
        if (rt >= RT || t >= TT) continue;
        coopMatStore(total[rt * MAX_TT + t], acc_s, sg * TM * TN, TN, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        for (uint i = lane; i < (TM / 2u) * TN; i += SG) {
          const uint q = i % (TM / 2u), tok = i / (TM / 2u);
          const uint j = tok_base + t * TN + tok;
          const uint r = 2u * q, row = row_base + rt * TM + r;
          if (j >= pc.m || row >= pc.rows) continue;
          store_pair(row, j, acc_s[sg * TM * TN + r * TN + tok], acc_s[sg * TM * TN + (r + 1u) * TN + tok]);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
      }
  }
}
