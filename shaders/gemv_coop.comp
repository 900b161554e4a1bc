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
//     divides 128 and changes nothing in the sequence; nor does TT (token tiles per workgroup).
//   - So the operations for an output depend on K, TK (the device's shape for x's dtype) and PARTS
//     only, never on m; a column of the accumulator depends on the same column of B alone (tokens
//     past m are zeros and never written), so a token's result is the same alone or in any batch,
//     whichever schedule, token block or tile holds it.
// The same shader serves fp16 and bf16 x: it declares float16_t matrices, and the host retypes
// them to bfloat16 in the SPIR-V for bf16 x (SPV_KHR_bfloat16; vk_kernels.cpp, with_bfloat16),
// which glslang 13 cannot spell. Nothing else in the shader touches a 16-bit float: weights and x
// travel as 16-bit patterns in uint words.
//
// Memory shape: per stage (KC columns) each subgroup decodes its W tile (TM rows) into shared
// memory, 32 weights per invocation from one 16-byte load of codes (vector path), in the row-major
// layout coopMatLoad reads (rows SW uvec4 apart, SW odd so that 8 consecutive rows' 16 bytes fall in
// distinct banks: consecutive lanes take consecutive rows, for the stores and the matrix loads
// alike). x's tile (TT * TN tokens) is staged beside it in 16-byte vectors. The codes, absmax words
// and x of a stage are loaded into registers one or two stages (AHEAD) before they are used, and
// the barriers order shared memory only, so that nothing waits for those loads early. No arrays
// outside shared memory: the operands in flight and the accumulators are named variables (at most
// 2 units of W, 4 vectors of x and 4 token tiles per invocation), so that nothing depends on the
// driver unrolling a loop to keep them in registers.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

#include "format.glsl"

// The count too: y's dtype is read from two bits of the flags and stored by out_bits, which knows
// these three rows only (the rows the product takes; it never sees the others).
#if NF4_PRODUCT_DTYPE_COUNT != 3 || NF4_DTYPE_F16 != 0 || NF4_DTYPE_BF16 != 1 || NF4_DTYPE_F32 != 2
#error "gemv_coop.comp rounds weights to fp16 (0) or bf16 (1) and stores fp16, bf16 or fp32 (2)"
#endif

layout(constant_id = 0) const uint WG = 128;         // invocations: PARTS subgroups of SG
layout(constant_id = 1) const uint PARTS = 4;        // ranges of K (fixed: part of the K order), and subgroups
layout(constant_id = 2) const uint TM = 16;          // the device's matrix shape (a row of its property list)
layout(constant_id = 3) const uint TN = 16;
layout(constant_id = 4) const uint TK = 16;
layout(constant_id = 5) const uint TT = 1;           // token tiles per workgroup (1..4)
layout(constant_id = 6) const uint KC = 64;          // columns per stage: 32, 64 or 128 (host: UPL <= 2, XPL <= 4)
layout(constant_id = 7) const bool VEC = false;      // k % 32 == 0 and 16-byte aligned codes (host-checked)
layout(constant_id = 8) const uint XD = 0;           // x dtype: the weights' rounding (0 fp16, 1 bf16)
layout(constant_id = 9) const uint SG = 32;          // the subgroup size (host: the device's)
layout(constant_id = 10) const bool SPLIT = true;    // subgroups take ranges of K (else rows)
layout(constant_id = 11) const bool XVEC = false;    // k % 8 == 0 and x 16-byte aligned (host-checked)
layout(constant_id = 12) const bool HWF16 = false;   // packHalf2x16 proven exact on this device (fp16 x)
layout(constant_id = 13) const uint DIAG = 0;        // measurements only, wrong results: parts switched off (host)
layout(constant_id = 14) const uint AHEAD = 1;       // stages whose operands are loaded ahead (1 or 2)
layout(constant_id = 15) const bool PAIR_LUT = false;  // values looked up per code byte (a pair) instead of per code
layout(constant_id = 16) const bool HWBF16 = false;  // the hardware bf16 conversion proven exact on this device (bf16 x)
layout(local_size_x_id = 0) in;

const uint CHUNK = 128u;                // columns per chunk: the unit of the K cut
const uint TOK = TT * TN;               // tokens per workgroup
const uint SW = KC / 8u + 1u;           // uvec4 per shared row (8 16-bit values each), odd
const uint WROWS = SPLIT ? TM : PARTS * TM;  // rows of W per workgroup
const uint UNITS = TM * (KC / 32u);     // 32-weight units of W per stage and subgroup
const uint UPL = (UNITS + SG - 1u) / SG;
const uint XT = SPLIT ? SG : WG;        // invocations staging one x tile
const uint XVECS = TOK * (KC / 8u);     // 16-byte x vectors per tile and stage
const uint XPL = (XVECS + XT - 1u) / XT;
const uint XSETS = SPLIT ? PARTS : 1u;  // x tiles: one per subgroup, or one shared
const bool DIAG_NO_DECODE = (DIAG & 1u) != 0u, DIAG_NO_MMA = (DIAG & 2u) != 0u, DIAG_NO_X = (DIAG & 4u) != 0u,
           DIAG_NO_W_LOADS = (DIAG & 8u) != 0u;

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
shared vec2 pair_s[PAIR_LUT ? 256 : 1];  // pair_s[byte] = (value of the even column's code, the odd one's)
shared float code_s[NF4_NESTED_CODE_SIZE];
// w_s[(p * TM + r) * SW + c / 8] holds subgroup p's row r, stage columns c..c+7 (16-bit
// patterns, the even column in each word's low half); x_s[(q * TOK + t) * SW + c / 8] token t's
// columns (q: the subgroup in SPLIT, else 0); acc_s[p * TM * TN + ...] one accumulator tile of
// subgroup p on its way to y.
shared uvec4 w_s[PARTS * TM * SW];
shared uvec4 x_s[XSETS * TOK * SW];
shared float acc_s[PARTS * TM * TN];

float g_offset;

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

// Two weights' 16-bit patterns (a low) where neither product can be NaN (finite absmax and table),
// by the hardware conversion where the device proved it equal to the integer rounding on every
// non-NaN input (shaders/f16_check.comp): bf16 by the conversion to a 16-bit float vector (in the
// module retyped to bfloat16), else by integer rounding without the NaN case; fp16 by packHalf2x16,
// else f16_from_bits.
uint w16_pair(float a, float b) {
  if (XD == 1u) return HWBF16 ? packFloat2x16(f16vec2(a, b)) : bf16_pair_not_nan(floatBitsToUint(a), floatBitsToUint(b));
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

// Shared memory written before it is read after, among a subgroup's invocations. Shared memory
// only: subgroupBarrier() also orders buffer memory, which makes the driver wait for the loads in
// flight (the next stage's operands) at every stage.
void subgroup_shared_barrier() {
  controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
}

// The same among the invocations sharing a stage's operands: the subgroup in SPLIT, else the
// workgroup (barrier(): shared memory only as well).
void stage_barrier() {
  if (SPLIT)
    subgroup_shared_barrier();
  else
    barrier();
}

// Unit u of a subgroup's stage (vector path): row u % TM, columns (u / TM) * 32 .. + 31. Its
// codes, and its absmax as loaded (absmax_of computes it when the unit is decoded, so that nothing
// waits for these loads before then): the fp32 bits, or nested the word holding the code byte, the
// nested scale's bits and the byte's shift. Zeros past the rows or past k.
uvec4 load_codes(uint u, uint lc, uint row_base, out uvec3 am_raw) {
  const uint r = u % TM, col = lc + (u / TM) * 32u;
  am_raw = uvec3(0u);
  if (!VEC || u >= UNITS || row_base + r >= pc.rows || col >= pc.k) return uvec4(0u);
  if (DIAG_NO_W_LOADS) {
    am_raw = uvec3(floatBitsToUint(1.0), floatBitsToUint(1.0), 0u);
    return uvec4(0x12345678u + u);
  }
  const uint e = pc.elem_rem + (row_base + r) * pc.k + col, b = e >> pc.log2_bs;
  if (nested()) {
    const uint byte_index = pc.absmax_off + b;
    am_raw = uvec3(absmax_words[byte_index >> 2], nested_words[pc.nested_off + ((pc.block_rem + b) >> pc.log2_nbs)], (byte_index & 3u) << 3);
  } else {
    am_raw.x = absmax_words[pc.absmax_off + b];
  }
  return packed_vecs[(pc.packed_off >> 2) + (e >> 5)];
}

// block_absmax from load_codes' raw words.
float absmax_of(uvec3 am_raw) {
  if (nested()) {
    precise float scaled = code_s[(am_raw.x >> am_raw.z) & 0xffu] * uintBitsToFloat(am_raw.y);
    precise float a = scaled + g_offset;
    return a;
  }
  return uintBitsToFloat(am_raw.x);
}

// x vector v of a tile's stage (16-byte path): token v / (KC / 8), columns (v % (KC / 8)) * 8 .. + 7;
// zeros past m or past k.
uvec4 load_x(uint v, uint lc, uint tok_base, uint live_tokens) {
  const uint t = v / (KC / 8u), col = lc + (v % (KC / 8u)) * 8u;
  if (!XVEC || DIAG_NO_X || v >= XVECS || t >= live_tokens || col >= pc.k) return uvec4(0u);
  return x_vecs[(pc.x_off >> 2) + ((tok_base + t) * pc.k + col) / 8u];
}

// Two weights (one byte of codes).
uint decode_byte(uint b, float am) {
  const vec2 v = pair_s[b];
  return w16_pair(v.x * am, v.y * am);
}

// Eight weights (one word of codes: bytes in column order) as four words of 16-bit patterns.
uvec4 decode_word(uint cw, float am) {
  if (PAIR_LUT)
    return uvec4(decode_byte(cw & 0xffu, am), decode_byte((cw >> 8) & 0xffu, am), decode_byte((cw >> 16) & 0xffu, am), decode_byte(cw >> 24, am));
  const uint E = NF4_EVEN_NIBBLE_SHIFT, O = NF4_ODD_NIBBLE_SHIFT;
  return uvec4(w16_pair(value_s[(cw >> E) & 15u] * am, value_s[(cw >> O) & 15u] * am),
               w16_pair(value_s[(cw >> (8u + E)) & 15u] * am, value_s[(cw >> (8u + O)) & 15u] * am),
               w16_pair(value_s[(cw >> (16u + E)) & 15u] * am, value_s[(cw >> (16u + O)) & 15u] * am),
               w16_pair(value_s[(cw >> (24u + E)) & 15u] * am, value_s[(cw >> (24u + O)) & 15u] * am));
}

// The same for a unit whose products may be NaN (a NaN or infinite absmax or table entry).
uvec4 decode_word_any(uint cw, float am) {
  const uint E = NF4_EVEN_NIBBLE_SHIFT, O = NF4_ODD_NIBBLE_SHIFT;
  return uvec4(w16((cw >> E) & 15u, am) | (w16((cw >> O) & 15u, am) << 16),
               w16((cw >> (8u + E)) & 15u, am) | (w16((cw >> (8u + O)) & 15u, am) << 16),
               w16((cw >> (16u + E)) & 15u, am) | (w16((cw >> (16u + O)) & 15u, am) << 16),
               w16((cw >> (24u + E)) & 15u, am) | (w16((cw >> (24u + O)) & 15u, am) << 16));
}

// Writes unit u of the stage at c0 (codes c, absmax am) into the subgroup's W tile at wb.
void decode_unit(uint u, uint c0, uint row_base, uint wb, uvec4 c, uvec3 am_raw, bool table_finite) {
  if (u >= UNITS) return;
  const float am = absmax_of(am_raw);
  const uint r = u % TM, cu = u / TM, at = wb + r * SW + cu * 4u;
  // Units past the rows or past k have zero codes and absmax: value * 0 = 0 (or -0: the table's
  // negative entries), so they are written as zero bits explicitly.
  if (row_base + r >= pc.rows || c0 + cu * 32u >= pc.k) {
    w_s[at] = uvec4(0u);
    w_s[at + 1u] = uvec4(0u);
    w_s[at + 2u] = uvec4(0u);
    w_s[at + 3u] = uvec4(0u);
  } else if (DIAG_NO_DECODE) {
    w_s[at] = uvec4(c.x);
    w_s[at + 1u] = uvec4(c.y);
    w_s[at + 2u] = uvec4(c.z);
    w_s[at + 3u] = uvec4(c.w);
  } else if (table_finite && !isinf(am) && !isnan(am)) {
    w_s[at] = decode_word(c.x, am);
    w_s[at + 1u] = decode_word(c.y, am);
    w_s[at + 2u] = decode_word(c.z, am);
    w_s[at + 3u] = decode_word(c.w, am);
  } else {
    w_s[at] = decode_word_any(c.x, am);
    w_s[at + 1u] = decode_word_any(c.y, am);
    w_s[at + 2u] = decode_word_any(c.z, am);
    w_s[at + 3u] = decode_word_any(c.w, am);
  }
}

void store_x(uint v, uint xb, uint live_tokens, uvec4 xv) {
  const uint t = v / (KC / 8u);
  if (!DIAG_NO_X && v < XVECS && t < live_tokens) x_s[xb + t * SW + v % (KC / 8u)] = xv;
}

#define ACC coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>

// Writes tile t of a schedule's result: SPLIT, subgroup p's tile is range p's sum, added in range
// order through acc_s by the whole workgroup; else the subgroup's own total, through its slice.
void store_tile(ACC tile, uint t, uint sg, uint lane, uint lid, uint row_base, uint tok_base) {
  coopMatStore(tile, acc_s, sg * TM * TN, TN, gl_CooperativeMatrixLayoutRowMajor);
  if (SPLIT) {
    barrier();
    // Invocation i takes rows 2q, 2q + 1 of token column tok (consecutive invocations,
    // consecutive rows of y).
    for (uint i = lid; i < (TM / 2u) * TN; i += WG) {
      const uint q = i % (TM / 2u), tok = i / (TM / 2u);
      const uint j = tok_base + t * TN + tok;
      const uint r = 2u * q;
      if (j >= pc.m || row_base + r >= pc.rows) continue;
      float v0 = acc_s[r * TN + tok], v1 = acc_s[(r + 1u) * TN + tok];
      [[unroll]] for (uint p = 1u; p < PARTS; ++p) {
        precise float s0 = v0 + acc_s[p * TM * TN + r * TN + tok];
        precise float s1 = v1 + acc_s[p * TM * TN + (r + 1u) * TN + tok];
        v0 = s0;
        v1 = s1;
      }
      store_pair(row_base + r, j, v0, v1);
    }
    barrier();
  } else {
    subgroup_shared_barrier();
    for (uint i = lane; i < (TM / 2u) * TN; i += SG) {
      const uint q = i % (TM / 2u), tok = i / (TM / 2u);
      const uint j = tok_base + t * TN + tok;
      const uint r = 2u * q;
      if (j >= pc.m || row_base + r >= pc.rows) continue;
      store_pair(row_base + r, j, acc_s[sg * TM * TN + r * TN + tok], acc_s[sg * TM * TN + (r + 1u) * TN + tok]);
    }
    subgroup_shared_barrier();
  }
}

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;  // the host sizes WG as PARTS subgroups of SG
  const uint row_base = gl_WorkGroupID.x * WROWS + (SPLIT ? 0u : sg * TM);  // this subgroup's first row
  const uint tok_base = gl_WorkGroupID.y * TOK;
  const uint live_tokens = min(TOK, pc.m - tok_base);
  const uint wb = sg * TM * SW;                // this subgroup's W tile
  const uint xb = SPLIT ? sg * TOK * SW : 0u;  // the x tile it reads (and, in SPLIT, writes)
  const uint xl = SPLIT ? lane : lid;          // index among the invocations staging that tile

  if (lid < 16u)
    value_s[lid] = uintBitsToFloat(stored_table() ? qmap_words[pc.qmap_off + lid] : NF4_BUILTIN_VALUE_BITS[(pc.flags >> 8) & 31u][lid]);
  if (nested()) {
    for (uint i = lid; i < NF4_NESTED_CODE_SIZE; i += WG) code_s[i] = uintBitsToFloat(code_words[pc.code_off + i]);
    g_offset = uintBitsToFloat(pc.offset_word == 0xffffffffu ? pc.offset_bits : offset_words[pc.offset_word]);
  }
  barrier();
  if (PAIR_LUT)
    for (uint b = lid; b < 256u; b += WG) pair_s[b] = vec2(value_s[(b >> NF4_EVEN_NIBBLE_SHIFT) & 15u], value_s[(b >> NF4_ODD_NIBBLE_SHIFT) & 15u]);
  // The tokens past m hold zeros for the whole run.
  for (uint i = lid; i < XSETS * TOK * SW; i += WG)
    if ((i / SW) % TOK >= live_tokens) x_s[i] = uvec4(0u);
  barrier();
  bool table_finite = true;
  for (uint c = 0u; c < 16u; ++c) table_finite = table_finite && !isinf(value_s[c]) && !isnan(value_s[c]);

  // (One declaration each: glslang 13 loses the matrix use in a declarator list.)
  ACC acc0 = ACC(0.0);
  ACC acc1 = ACC(0.0);
  ACC acc2 = ACC(0.0);
  ACC acc3 = ACC(0.0);
  ACC tot0 = ACC(0.0);
  ACC tot1 = ACC(0.0);
  ACC tot2 = ACC(0.0);
  ACC tot3 = ACC(0.0);

  // The stages this subgroup walks: SPLIT, its range's; else all of K's, the ranges folded in turn
  // (fold: the range's accumulator into the total, the first one copied).
  const uint chunks = (pc.k + CHUNK - 1u) / CHUNK;
  const uint per = (chunks + PARTS - 1u) / PARTS;
  const uint lo = SPLIT ? min(sg * per, chunks) : 0u;
  const uint hi = SPLIT ? min(lo + per, chunks) : chunks;
  const uint s_lo = lo * (CHUNK / KC), s_hi = hi * (CHUNK / KC);
  const uint part_stages = per * (CHUNK / KC);
  uint folded = 0u;

  // Operands one stage ahead (n*) and, with AHEAD = 2, two (m*): units lane and lane + SG, x
  // vectors xl + i * XT.
  uvec3 nam0 = uvec3(0u), nam1 = uvec3(0u), mam0 = uvec3(0u), mam1 = uvec3(0u);
  uvec4 nc0 = uvec4(0u), nc1 = uvec4(0u), nx0 = uvec4(0u), nx1 = uvec4(0u), nx2 = uvec4(0u), nx3 = uvec4(0u);
  uvec4 mc0 = uvec4(0u), mc1 = uvec4(0u), mx0 = uvec4(0u), mx1 = uvec4(0u), mx2 = uvec4(0u), mx3 = uvec4(0u);
  if (s_lo < s_hi) {
    const uint lc = s_lo * KC;
    nc0 = load_codes(lane, lc, row_base, nam0);
    if (UPL > 1u) nc1 = load_codes(lane + SG, lc, row_base, nam1);
    nx0 = load_x(xl, lc, tok_base, live_tokens);
    if (XPL > 1u) nx1 = load_x(xl + XT, lc, tok_base, live_tokens);
    if (XPL > 2u) nx2 = load_x(xl + 2u * XT, lc, tok_base, live_tokens);
    if (XPL > 3u) nx3 = load_x(xl + 3u * XT, lc, tok_base, live_tokens);
  }
  if (AHEAD > 1u && s_lo + 1u < s_hi) {
    const uint lc = (s_lo + 1u) * KC;
    mc0 = load_codes(lane, lc, row_base, mam0);
    if (UPL > 1u) mc1 = load_codes(lane + SG, lc, row_base, mam1);
    mx0 = load_x(xl, lc, tok_base, live_tokens);
    if (XPL > 1u) mx1 = load_x(xl + XT, lc, tok_base, live_tokens);
    if (XPL > 2u) mx2 = load_x(xl + 2u * XT, lc, tok_base, live_tokens);
    if (XPL > 3u) mx3 = load_x(xl + 3u * XT, lc, tok_base, live_tokens);
  }

  for (uint s = s_lo; s < s_hi; ++s) {
    const uint c0 = s * KC;
    // x first (the live tokens' KC columns): its registers are free before the next stage's
    // loads land in them.
    if (XVEC) {
      store_x(xl, xb, live_tokens, nx0);
      if (XPL > 1u) store_x(xl + XT, xb, live_tokens, nx1);
      if (XPL > 2u) store_x(xl + 2u * XT, xb, live_tokens, nx2);
      if (XPL > 3u) store_x(xl + 3u * XT, xb, live_tokens, nx3);
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
    const uvec3 am0 = nam0, am1 = nam1;
    const uvec4 c0w = nc0, c1w = nc1;
    if (AHEAD > 1u) {
      nam0 = mam0;
      nam1 = mam1;
      nc0 = mc0;
      nc1 = mc1;
      nx0 = mx0;
      nx1 = mx1;
      nx2 = mx2;
      nx3 = mx3;
      if (s + 2u < s_hi) {
        const uint lc = c0 + 2u * KC;
        mc0 = load_codes(lane, lc, row_base, mam0);
        if (UPL > 1u) mc1 = load_codes(lane + SG, lc, row_base, mam1);
        mx0 = load_x(xl, lc, tok_base, live_tokens);
        if (XPL > 1u) mx1 = load_x(xl + XT, lc, tok_base, live_tokens);
        if (XPL > 2u) mx2 = load_x(xl + 2u * XT, lc, tok_base, live_tokens);
        if (XPL > 3u) mx3 = load_x(xl + 3u * XT, lc, tok_base, live_tokens);
      }
    } else if (s + 1u < s_hi) {
      const uint lc = c0 + KC;
      nc0 = load_codes(lane, lc, row_base, nam0);
      if (UPL > 1u) nc1 = load_codes(lane + SG, lc, row_base, nam1);
      nx0 = load_x(xl, lc, tok_base, live_tokens);
      if (XPL > 1u) nx1 = load_x(xl + XT, lc, tok_base, live_tokens);
      if (XPL > 2u) nx2 = load_x(xl + 2u * XT, lc, tok_base, live_tokens);
      if (XPL > 3u) nx3 = load_x(xl + 3u * XT, lc, tok_base, live_tokens);
    }

    if (VEC) {
      decode_unit(lane, c0, row_base, wb, c0w, am0, table_finite);
      if (UPL > 1u) decode_unit(lane + SG, c0, row_base, wb, c1w, am1, table_finite);
    } else {
      // Element by element: any k, blocks straddling rows.
      for (uint p = lane; p < TM * (KC / 2u); p += SG) {
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
    stage_barrier();
    // A new range of K: its sum so far joins the total.
    if (!SPLIT && s != s_lo && s % part_stages == 0u) {
      if (folded == 0u) {
        tot0 = acc0;
        tot1 = acc1;
        tot2 = acc2;
        tot3 = acc3;
      } else {
        tot0 = tot0 + acc0;
        if (TT > 1u) tot1 = tot1 + acc1;
        if (TT > 2u) tot2 = tot2 + acc2;
        if (TT > 3u) tot3 = tot3 + acc3;
      }
      acc0 = ACC(0.0);
      acc1 = ACC(0.0);
      acc2 = ACC(0.0);
      acc3 = ACC(0.0);
      ++folded;
    }
    if (!DIAG_NO_MMA) {
      [[unroll]] for (uint kk = 0u; kk < KC; kk += TK) {
        coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a;
        coopMatLoad(a, w_s, wb + kk / 8u, SW, gl_CooperativeMatrixLayoutRowMajor);
        // B[c][j] = x(token j, column c): x_s is B in column-major order.
        coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> b;
        coopMatLoad(b, x_s, xb + kk / 8u, SW, gl_CooperativeMatrixLayoutColumnMajor);
        acc0 = coopMatMulAdd(a, b, acc0);
        if (TT > 1u) {
          coopMatLoad(b, x_s, xb + TN * SW + kk / 8u, SW, gl_CooperativeMatrixLayoutColumnMajor);
          acc1 = coopMatMulAdd(a, b, acc1);
        }
        if (TT > 2u) {
          coopMatLoad(b, x_s, xb + 2u * TN * SW + kk / 8u, SW, gl_CooperativeMatrixLayoutColumnMajor);
          acc2 = coopMatMulAdd(a, b, acc2);
        }
        if (TT > 3u) {
          coopMatLoad(b, x_s, xb + 3u * TN * SW + kk / 8u, SW, gl_CooperativeMatrixLayoutColumnMajor);
          acc3 = coopMatMulAdd(a, b, acc3);
        }
      }
    }
    // The next stage overwrites this one's operands.
    stage_barrier();
  }

  if (!SPLIT) {
    // The last non-empty range, then a zero accumulator for each empty one (as SPLIT adds them).
    if (folded == 0u) {
      tot0 = acc0;
      tot1 = acc1;
      tot2 = acc2;
      tot3 = acc3;
    } else {
      tot0 = tot0 + acc0;
      if (TT > 1u) tot1 = tot1 + acc1;
      if (TT > 2u) tot2 = tot2 + acc2;
      if (TT > 3u) tot3 = tot3 + acc3;
    }
    for (uint p = (chunks + per - 1u) / per; p < PARTS; ++p) {
      tot0 = tot0 + ACC(0.0);
      if (TT > 1u) tot1 = tot1 + ACC(0.0);
      if (TT > 2u) tot2 = tot2 + ACC(0.0);
      if (TT > 3u) tot3 = tot3 + ACC(0.0);
    }
    acc0 = tot0;
    acc1 = tot1;
    acc2 = tot2;
    acc3 = tot3;
  }
  store_tile(acc0, 0u, sg, lane, lid, row_base, tok_base);
  if (TT > 1u) store_tile(acc1, 1u, sg, lane, lid, row_base, tok_base);
  if (TT > 2u) store_tile(acc2, 2u, sg, lane, lid, row_base, tok_base);
  if (TT > 3u) store_tile(acc3, 3u, sg, lane, lid, row_base, tok_base);
}
