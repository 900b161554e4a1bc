// SPDX-License-Identifier: MIT
// The product's fast contract (nf4.h NF4_GEMV_FAST, docs/GEMV.md section 6) on cooperative
// matrices (VK_KHR_cooperative_matrix): Y[m, n] = sum_k w16(n, k) * X[m, k], w16 the weight rounded
// to x's dtype exactly as dequantize.comp writes it, products summed in fp32 by the device's matrix
// unit. The CUDA mirror is backends/cuda/gemv_mma.cu.
//
// The order of the sum (what makes the result batch-invariant and repeatable):
//   - W's rows are the matrix A side (TM rows per workgroup), tokens the B side (TN per tile).
//   - K is cut into chunks of 128 columns and the chunks into PARTS consecutive ranges of
//     ceil(chunks / PARTS) chunks (PARTS a constant, so the cut depends on K alone). Subgroup p
//     walks range p in column order, one coopMatMulAdd per TK columns into its own fp32
//     accumulator, then the parts are added in order: ((p0 + p1) + p2) + p3. KC, the columns a
//     subgroup stages at a time, divides 128 and changes nothing in that sequence (the host trades
//     it for token tiles). Every range is walked to its chunks' end: columns past K are zero
//     weights times zero x, the same steps whatever KC is.
//   - So the sequence of operations for an output depends on K, TK (the device's shape for x's
//     dtype) and PARTS only, never on m; a column of the accumulator depends on the same column of
//     B alone (tokens past m are zeros and never written), so a token's result is the same alone
//     or in any batch, whichever token block or tile holds it.
// The same shader serves fp16 and bf16 x: it declares float16_t matrices, and the host retypes
// them to bfloat16 in the SPIR-V for bf16 x (SPV_KHR_bfloat16; vk_kernels.cpp, with_bfloat16),
// which glslang 13 cannot spell. Nothing else in the shader touches a 16-bit float: weights and x
// travel as 16-bit patterns in uint words.
//
// Memory shape: a workgroup of PARTS subgroups owns TM rows of W and TT * TN tokens (one token
// block: gl_WorkGroupID.y). Each subgroup has shared memory of its own: per stage it decodes its
// KC columns of the TM rows (32 weights per invocation from one 16-byte load of codes on the
// vector path, the next stage's codes and absmax loaded before this stage's are decoded) and copies
// the live tokens' x beside them (the other tokens' rows were zeroed once), then multiplies.
// Only subgroup barriers inside the loop; one workgroup barrier per token tile to add the parts.
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
layout(constant_id = 1) const uint PARTS = 4;        // subgroups, one range of K each (fixed: part of the K order)
layout(constant_id = 2) const uint TM = 16;          // the device's matrix shape (a row of its property list)
layout(constant_id = 3) const uint TN = 16;
layout(constant_id = 4) const uint TK = 16;
layout(constant_id = 5) const uint TT = 1;           // token tiles per workgroup (at most 4: accumulators and shared memory)
layout(constant_id = 6) const uint KC = 128;         // columns per stage: divides 128, a multiple of TK and of 32
layout(constant_id = 7) const bool VEC = false;      // k % 32 == 0 and 16-byte aligned codes (host-checked)
layout(constant_id = 8) const uint XD = 0;           // x dtype: the weights' rounding (0 fp16, 1 bf16)
layout(constant_id = 9) const uint SG = 32;          // the subgroup size (host: the device's)
layout(local_size_x_id = 0) in;

const uint CHUNK = 128u;                // columns per chunk: the unit of the K cut
const uint TOK = TT * TN;               // tokens per workgroup
const uint STRIDE = KC / 2u + 4u;       // uint words per shared row (16-bit pairs, padded against bank conflicts)
const uint UNITS = TM * (KC / 32u);     // 32-weight units of W per stage and subgroup
const uint UPL = (UNITS + SG - 1u) / SG;  // units per invocation

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
layout(std430, set = 0, binding = 7) buffer YBuf { uint y_words[]; };

shared float value_s[16];
shared float code_s[NF4_NESTED_CODE_SIZE];
// Per subgroup p: w_s[(p * TM + r) * STRIDE + c / 2] weights (row r, stage column c; c even in the
// low half), x_s[(p * TOK + t) * STRIDE + c / 2] x (token t, column c), acc_s[p * TM * TN + ...] its
// accumulator tile when the parts are added.
shared uint w_s[PARTS * TM * STRIDE];
shared uint x_s[PARTS * TOK * STRIDE];
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

// The weight as dequantize writes it in x's dtype: RNE(fl32(value * absmax)), by integer rounding.
// (The hardware conversion, f16vec2(vec2) under the RoundingModeRTE and DenormPreserve 16-bit
// execution modes, was 1.2x-3x faster on the H100 but broke the fast contract's bound there:
// docs/PERFORMANCE_LOG.md, "The Vulkan fast product".)
uint w16(uint code, float am) {
  precise float v = value_s[code] * am;
  uint u = floatBitsToUint(v);
  return XD == 1u ? bf16_from_bits(u) : f16_from_bits(u);
}

// The 16-bit pattern of X[j, col] (j < m, col < k).
uint x_bits(uint j, uint col) {
  uint i = j * pc.k + col;
  return (x_words[pc.x_off + (i >> 1)] >> ((i & 1u) << 4)) & 0xffffu;
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

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint part = gl_SubgroupID, lane = gl_SubgroupInvocationID;  // the host sizes WG as PARTS subgroups of SG
  const uint row_base = gl_WorkGroupID.x * TM;
  const uint tok_base = gl_WorkGroupID.y * TOK;
  const uint live_tokens = min(TOK, pc.m - tok_base);
  const uint wb = part * TM * STRIDE, xb = part * TOK * STRIDE;

  if (lid < 16u)
    value_s[lid] = uintBitsToFloat(stored_table() ? qmap_words[pc.qmap_off + lid] : NF4_BUILTIN_VALUE_BITS[(pc.flags >> 8) & 31u][lid]);
  if (nested()) {
    for (uint i = lid; i < NF4_NESTED_CODE_SIZE; i += WG) code_s[i] = uintBitsToFloat(code_words[pc.code_off + i]);
    g_offset = uintBitsToFloat(pc.offset_word == 0xffffffffu ? pc.offset_bits : offset_words[pc.offset_word]);
  }
  // The tokens past m hold zeros for the whole run.
  for (uint i = lid; i < PARTS * TOK * STRIDE; i += WG)
    if ((i / STRIDE) % TOK >= live_tokens) x_s[i] = 0u;
  barrier();

  coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> acc[TT];
  [[unroll]] for (uint t = 0u; t < TT; ++t) acc[t] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);

  // This part's columns: chunks [lo, hi) of the K cut, walked KC columns at a time.
  const uint chunks = (pc.k + CHUNK - 1u) / CHUNK;
  const uint per = (chunks + PARTS - 1u) / PARTS;
  const uint lo = min(part * per, chunks), hi = min(lo + per, chunks);
  const uint stages = (hi - lo) * (CHUNK / KC);
  const uint col_lo = lo * CHUNK;

  // Vector path: unit i of the lane (u = lane + i * SG) is row u / (KC / 32), 32 columns at
  // (u % (KC / 32)) * 32 of the stage. Loaded one stage ahead.
  uvec4 next_codes[UPL];
  float next_am[UPL];
  [[unroll]] for (uint i = 0u; i < UPL; ++i) {
    next_codes[i] = uvec4(0u);
    next_am[i] = 0.0;
  }
  if (VEC && stages > 0u) {
    [[unroll]] for (uint i = 0u; i < UPL; ++i) {
      const uint u = lane + i * SG, r = u / (KC / 32u), col = col_lo + (u % (KC / 32u)) * 32u;
      if (u < UNITS && row_base + r < pc.rows && col < pc.k) {
        const uint e = pc.elem_rem + (row_base + r) * pc.k + col;
        next_codes[i] = packed_vecs[(pc.packed_off >> 2) + (e >> 5)];
        next_am[i] = block_absmax(e >> pc.log2_bs);
      }
    }
  }

  for (uint s = 0u; s < stages; ++s) {
    const uint c0 = col_lo + s * KC;
    if (VEC) {
      uvec4 codes[UPL];
      float am[UPL];
      [[unroll]] for (uint i = 0u; i < UPL; ++i) {
        codes[i] = next_codes[i];
        am[i] = next_am[i];
      }
      if (s + 1u < stages) {
        [[unroll]] for (uint i = 0u; i < UPL; ++i) {
          const uint u = lane + i * SG, r = u / (KC / 32u), col = c0 + KC + (u % (KC / 32u)) * 32u;
          next_codes[i] = uvec4(0u);
          next_am[i] = 0.0;
          if (u < UNITS && row_base + r < pc.rows && col < pc.k) {
            const uint e = pc.elem_rem + (row_base + r) * pc.k + col;
            next_codes[i] = packed_vecs[(pc.packed_off >> 2) + (e >> 5)];
            next_am[i] = block_absmax(e >> pc.log2_bs);
          }
        }
      }
      [[unroll]] for (uint i = 0u; i < UPL; ++i) {
        const uint u = lane + i * SG, r = u / (KC / 32u), cu = u % (KC / 32u);
        if (u >= UNITS) continue;
        // Units past the rows or past k have zero codes and absmax: value * 0 = 0 (or -0:
        // the table's negative entries), so they are written as zero bits explicitly.
        const bool live = row_base + r < pc.rows && c0 + cu * 32u < pc.k;
        [[unroll]] for (uint w = 0u; w < 4u; ++w) {
          [[unroll]] for (uint t = 0u; t < 4u; ++t) {
            const uint byte_ = (codes[i][w] >> (8u * t)) & 0xffu;
            const uint lo16 = live ? w16((byte_ >> NF4_EVEN_NIBBLE_SHIFT) & 15u, am[i]) : 0u;
            const uint hi16 = live ? w16((byte_ >> NF4_ODD_NIBBLE_SHIFT) & 15u, am[i]) : 0u;
            w_s[wb + r * STRIDE + cu * 16u + w * 4u + t] = lo16 | (hi16 << 16);
          }
        }
      }
    } else {
      // Element by element: any k, blocks straddling rows.
      for (uint p = lane; p < TM * (KC / 2u); p += SG) {
        const uint r = p / (KC / 2u), col = c0 + 2u * (p % (KC / 2u));
        uint pair = 0u;
        if (row_base + r < pc.rows) {
          const uint e = pc.elem_rem + (row_base + r) * pc.k + col;
          if (col < pc.k) pair = w16(code_at(e), block_absmax(e >> pc.log2_bs));
          if (col + 1u < pc.k) pair |= w16(code_at(e + 1u), block_absmax((e + 1u) >> pc.log2_bs)) << 16;
        }
        w_s[wb + r * STRIDE + (p % (KC / 2u))] = pair;
      }
    }
    // x: the live tokens' KC columns.
    for (uint p = lane; p < live_tokens * (KC / 2u); p += SG) {
      const uint t = p / (KC / 2u), col = c0 + 2u * (p % (KC / 2u)), j = tok_base + t;
      uint pair = 0u;
      if (col < pc.k) {
        const uint i = j * pc.k + col;
        if ((i & 1u) == 0u && col + 1u < pc.k) {
          pair = x_words[pc.x_off + (i >> 1)];
        } else {
          pair = x_bits(j, col);
          if (col + 1u < pc.k) pair |= x_bits(j, col + 1u) << 16;
        }
      }
      x_s[xb + t * STRIDE + (p % (KC / 2u))] = pair;
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint kk = 0u; kk < KC; kk += TK) {
      coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a;
      coopMatLoad(a, w_s, wb + kk / 2u, STRIDE, gl_CooperativeMatrixLayoutRowMajor);
      [[unroll]] for (uint t = 0u; t < TT; ++t) {
        // B[c][j] = x(token j, column c): x_s is B in column-major order.
        coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> b;
        coopMatLoad(b, x_s, xb + t * TN * STRIDE + kk / 2u, STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
        acc[t] = coopMatMulAdd(a, b, acc[t]);
      }
    }
    // The next stage overwrites this one's operands.
    subgroupMemoryBarrierShared();
    subgroupBarrier();
  }

  // Store, one token tile at a time: the parts' tiles through shared memory, added in part order.
  [[unroll]] for (uint t = 0u; t < TT; ++t) {
    coopMatStore(acc[t], acc_s, part * TM * TN, TN, gl_CooperativeMatrixLayoutRowMajor);
    barrier();
    // Invocation i takes rows 2q, 2q + 1 of token column tok (consecutive invocations, consecutive
    // rows of y).
    for (uint i = lid; i < (TM / 2u) * TN; i += WG) {
      const uint q = i % (TM / 2u), tok = i / (TM / 2u);
      const uint j = tok_base + t * TN + tok;
      const uint r = 2u * q;
      if (j >= pc.m || row_base + r >= pc.rows) continue;
      const bool second = row_base + r + 1u < pc.rows;
      float v0 = acc_s[r * TN + tok], v1 = acc_s[(r + 1u) * TN + tok];
      [[unroll]] for (uint p = 1u; p < PARTS; ++p) {
        precise float s0 = v0 + acc_s[p * TM * TN + r * TN + tok];
        precise float s1 = v1 + acc_s[p * TM * TN + (r + 1u) * TN + tok];
        v0 = s0;
        v1 = s1;
      }
      const uint b0 = out_bits(v0);
      const uint b1 = second ? out_bits(v1) : 0u;
      const uint yi = j * pc.n + pc.row0 + row_base + r;
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
    barrier();
  }
}
