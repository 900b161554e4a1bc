// SPDX-License-Identifier: MIT
// The product's fast contract (nf4.h NF4_GEMV_FAST, docs/GEMV.md section 6) on cooperative
// matrices (VK_KHR_cooperative_matrix): Y[m, n] = sum_k w16(n, k) * X[m, k], w16 the weight rounded
// to x's dtype exactly as dequantize.comp writes it, products summed in fp32 by the device's matrix
// unit. The CUDA mirror is backends/cuda/gemv_mma.cu.
//
// The order of the sum (what makes the result batch-invariant and repeatable):
//   - W's rows are the matrix A side (TM rows per subgroup tile), tokens the B side (TN per tile).
//   - Columns are taken in stages of KC (a multiple of TK), stage after stage, and inside a stage
//     in steps of TK, each step one coopMatMulAdd into the same fp32 accumulator. So an output's
//     additions are the K / TK steps in column order, each step a TK-term product of one row of A
//     with one column of B: the order depends on K, TK and KC (the device's shape, fixed per
//     device and dtype, never by m) only. A column of the accumulator depends on the same column
//     of B alone (tokens past m are zeros and never written), so a token's result is the same
//     alone or in any batch, whichever token block or tile holds it.
//   - Columns past k hold zero weights and zero activations: their products add +0.
// The same shader serves fp16 and bf16 x: it declares float16_t matrices, and the host retypes
// them to bfloat16 in the SPIR-V for bf16 x (SPV_KHR_bfloat16; vk_kernels.cpp, with_bfloat16),
// which glslang 13 cannot spell. Nothing else in the shader touches a 16-bit float: weights and x
// travel as 16-bit patterns in uint words.
//
// Memory shape: a workgroup of ROW_TILES subgroups owns ROW_TILES * TM rows of W and TT * TN
// tokens (one token block: gl_WorkGroupID.y). Per stage it decodes its rows' KC columns into
// shared memory (each invocation 32 weights from one 16-byte load of codes on the vector path)
// and copies the block's x columns, then each subgroup multiplies its row tile with every token
// tile. Every control-flow decision before a barrier is uniform over the workgroup.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

#include "format.glsl"

#if NF4_DTYPE_F16 != 0 || NF4_DTYPE_BF16 != 1 || NF4_DTYPE_F32 != 2
#error "gemv_coop.comp rounds weights to fp16 (0) or bf16 (1) and stores fp16, bf16 or fp32 (2)"
#endif

layout(constant_id = 0) const uint WG = 128;         // invocations: ROW_TILES subgroups (host: the device's subgroup size)
layout(constant_id = 1) const uint ROW_TILES = 4;    // subgroups, one row tile each
layout(constant_id = 2) const uint TM = 16;          // the device's matrix shape (a row of its property list)
layout(constant_id = 3) const uint TN = 16;
layout(constant_id = 4) const uint TK = 16;
layout(constant_id = 5) const uint TT = 1;           // token tiles per workgroup (at most 4: accumulators and shared memory)
layout(constant_id = 6) const uint KC = 128;         // columns per stage: a multiple of TK and of 32
layout(constant_id = 7) const bool VEC = false;      // k % 32 == 0 and 16-byte aligned codes (host-checked)
layout(constant_id = 8) const uint XD = 0;           // x dtype: the weights' rounding (0 fp16, 1 bf16)
layout(local_size_x_id = 0) in;

const uint ROWS = ROW_TILES * TM;       // rows of W per workgroup
const uint TOK = TT * TN;               // tokens per workgroup
const uint STRIDE = KC / 2u + 4u;       // uint words per shared row (16-bit pairs, padded against bank conflicts)

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
shared uint w_s[ROWS * STRIDE];          // w_s[r * STRIDE + c / 2]: weights (r, c), c even in the low half
shared uint x_s[TOK * STRIDE];           // x_s[t * STRIDE + c / 2]: x (token t, column c)
shared float acc_s[ROWS * TN];           // one accumulator tile per subgroup, for the store

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

// The weight as dequantize writes it in x's dtype: RNE(fl32(value * absmax)).
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
  const uint tile = gl_SubgroupID;  // the host sizes WG as ROW_TILES subgroups
  const uint row_base = gl_WorkGroupID.x * ROWS;
  const uint tok_base = gl_WorkGroupID.y * TOK;

  if (lid < 16u)
    value_s[lid] = uintBitsToFloat(stored_table() ? qmap_words[pc.qmap_off + lid] : NF4_BUILTIN_VALUE_BITS[(pc.flags >> 8) & 31u][lid]);
  if (nested()) {
    for (uint i = lid; i < NF4_NESTED_CODE_SIZE; i += WG) code_s[i] = uintBitsToFloat(code_words[pc.code_off + i]);
    g_offset = uintBitsToFloat(pc.offset_word == 0xffffffffu ? pc.offset_bits : offset_words[pc.offset_word]);
  }
  barrier();

  coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> acc[TT];
  [[unroll]] for (uint t = 0u; t < TT; ++t) acc[t] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);

  const uint stages = (pc.k + KC - 1u) / KC;
  for (uint s = 0u; s < stages; ++s) {
    const uint c0 = s * KC;
    // W: ROWS x KC weights as 16-bit pairs.
    if (VEC) {
      // Units of 32 weights of one row: one 16-byte load of codes, one quantization block.
      const uint per_row = KC / 32u;
      for (uint u = lid; u < ROWS * per_row; u += WG) {
        const uint r = u / per_row, cu = u % per_row, col = c0 + cu * 32u;
        uvec4 words = uvec4(0u);
        float am = 0.0;
        const bool live = row_base + r < pc.rows && col < pc.k;
        if (live) {
          const uint e = pc.elem_rem + (row_base + r) * pc.k + col;
          words = packed_vecs[(pc.packed_off >> 2) + (e >> 5)];
          am = block_absmax(e >> pc.log2_bs);
        }
        [[unroll]] for (uint w = 0u; w < 4u; ++w) {
          [[unroll]] for (uint t = 0u; t < 4u; ++t) {
            const uint byte_ = (words[w] >> (8u * t)) & 0xffu;
            const uint lo = live ? w16((byte_ >> NF4_EVEN_NIBBLE_SHIFT) & 15u, am) : 0u;
            const uint hi = live ? w16((byte_ >> NF4_ODD_NIBBLE_SHIFT) & 15u, am) : 0u;
            w_s[r * STRIDE + cu * 16u + w * 4u + t] = lo | (hi << 16);
          }
        }
      }
    } else {
      // Element by element: any k, blocks straddling rows.
      for (uint p = lid; p < ROWS * (KC / 2u); p += WG) {
        const uint r = p / (KC / 2u), col = c0 + 2u * (p % (KC / 2u));
        uint pair = 0u;
        if (row_base + r < pc.rows) {
          const uint e = pc.elem_rem + (row_base + r) * pc.k + col;
          if (col < pc.k) pair = w16(code_at(e), block_absmax(e >> pc.log2_bs));
          if (col + 1u < pc.k) pair |= w16(code_at(e + 1u), block_absmax((e + 1u) >> pc.log2_bs)) << 16;
        }
        w_s[r * STRIDE + (p % (KC / 2u))] = pair;
      }
    }
    // x: the block's TOK tokens x KC columns.
    for (uint p = lid; p < TOK * (KC / 2u); p += WG) {
      const uint t = p / (KC / 2u), col = c0 + 2u * (p % (KC / 2u)), j = tok_base + t;
      uint pair = 0u;
      if (j < pc.m && col < pc.k) {
        const uint i = j * pc.k + col;
        if ((i & 1u) == 0u && col + 1u < pc.k) {
          pair = x_words[pc.x_off + (i >> 1)];
        } else {
          pair = x_bits(j, col);
          if (col + 1u < pc.k) pair |= x_bits(j, col + 1u) << 16;
        }
      }
      x_s[t * STRIDE + (p % (KC / 2u))] = pair;
    }
    barrier();
    if (tile < ROW_TILES) {
      [[unroll]] for (uint kk = 0u; kk < KC; kk += TK) {
        coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a;
        coopMatLoad(a, w_s, tile * TM * STRIDE + kk / 2u, STRIDE, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint t = 0u; t < TT; ++t) {
          // B[c][j] = x(token j, column c): x_s is B in column-major order.
          coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> b;
          coopMatLoad(b, x_s, t * TN * STRIDE + kk / 2u, STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
          acc[t] = coopMatMulAdd(a, b, acc[t]);
        }
      }
    }
    barrier();
  }

  // Store: each subgroup's tile through shared memory, one token tile at a time.
  [[unroll]] for (uint t = 0u; t < TT; ++t) {
    if (tile < ROW_TILES) coopMatStore(acc[t], acc_s, tile * TM * TN, TN, gl_CooperativeMatrixLayoutRowMajor);
    barrier();
    // Invocation i takes rows 2q, 2q + 1 of token column tok (consecutive invocations, consecutive
    // rows of y).
    for (uint i = lid; i < (ROWS / 2u) * TN; i += WG) {
      const uint q = i % (ROWS / 2u), tok = i / (ROWS / 2u);
      const uint j = tok_base + t * TN + tok;
      const uint r = 2u * q;
      if (j >= pc.m || row_base + r >= pc.rows) continue;
      const bool second = row_base + r + 1u < pc.rows;
      const uint b0 = out_bits(acc_s[r * TN + tok]);
      const uint b1 = second ? out_bits(acc_s[(r + 1u) * TN + tok]) : 0u;
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
