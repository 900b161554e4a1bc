// SPDX-License-Identifier: MIT
// The fused matrix-vector product Y[m, n] = sum_k X[m, k] * W[n, k] (nf4.h, docs/GEMV.md) for a
// range of rows of W, bit-identical to the CPU oracle and to the CUDA kernel (backends/cuda/gemv.cu),
// whose tree mapping it mirrors:
//   - a team of 32 invocations owns one row; in chunk c of 1024 columns, invocation L owns the
//     32 leaves [1024c + 32L, 1024c + 32L + 32) and computes their subtree (8-leaf subtrees, then
//     ((s0 + s1) + (s2 + s3)));
//   - the five levels above the 32 subtrees are evaluated through shared memory, level by level
//     with a barrier between levels (node t = node 2t + node 2t + 1): no subgroup operation, so
//     the result is the same for any subgroup size (8 and 16 on lavapipe, 32, 64);
//   - the chunks' nodes go through a binary counter (invocation j keeps row j's stack), padded with
//     pad_bits up to a power of two (core/gemv.h, gemv_pad_bits), so the root equals the
//     contract's root over bit_ceil(k) leaves.
// Every product and sum is `precise` (one rounding, never fused). Y is written with the integer
// conversions of format.glsl (any NaN as the positive quiet NaN); 16-bit outputs with a pair of
// atomics on their word, whose other half another workgroup may be writing.
// The workgroup holds two teams (two rows); every control-flow decision before a barrier is
// uniform over the workgroup (the chunk count depends on k only).
#version 450
#extension GL_GOOGLE_include_directive : require

#include "format.glsl"

#define MAX_M 8
#define TEAMS 2
#define STACK_DEPTH 32  // chunk-tree levels: k < 2^31 (checked on the host), so <= 2^21 chunks

layout(local_size_x = 64) in;

// Element indices are relative to the dispatch's base element EB (a multiple of the blocksize at
// or before the first row's first element); offsets are relative to each binding's descriptor.
layout(push_constant) uniform Params {
  uint k;            // columns (<= 2^31 - 2 * blocksize)
  uint rows;         // rows of W in this dispatch
  uint row0;         // global index of its first row (for y)
  uint n;            // rows of W in all (y's row stride)
  uint m;            // rows of X and Y, 1..8
  uint elem_rem;     // first row's first element - EB
  uint packed_off;   // word of packed byte EB / 2 (binding 0)
  uint absmax_off;   // flat: word, nested: byte of absmax block EB / blocksize (binding 1)
  uint qmap_off;     // word of quant_map[0] (binding 2)
  uint nested_off;   // word of nested_absmax[(EB / blocksize) / nested_blocksize] (binding 3)
  uint code_off;     // word of nested_code[0] (binding 4)
  uint offset_word;  // word of the nested offset (binding 5), or 0xffffffff: offset_bits
  uint offset_bits;
  uint block_rem;    // (EB / blocksize) % nested_blocksize
  uint log2_bs;
  uint log2_nbs;
  uint x_off;        // word of X[0, 0] (binding 6)
  uint y_off;        // word of Y[0, 0] (binding 7)
  uint pad_bits;     // gemv_pad_bits(k)
  uint flags;        // bit 0 nested, bit 1 FP4, bits 2-3 x dtype, bits 4-5 y dtype (nf4_dtype)
} pc;

layout(std430, set = 0, binding = 0) readonly restrict buffer PackedBuf { uint packed_words[]; };
layout(std430, set = 0, binding = 1) readonly restrict buffer AbsmaxBuf { uint absmax_words[]; };
layout(std430, set = 0, binding = 2) readonly restrict buffer QuantMapBuf { uint qmap_words[]; };
layout(std430, set = 0, binding = 3) readonly restrict buffer NestedAbsmaxBuf { uint nested_words[]; };
layout(std430, set = 0, binding = 4) readonly restrict buffer NestedCodeBuf { uint code_words[]; };
layout(std430, set = 0, binding = 5) readonly restrict buffer OffsetBuf { uint offset_words[]; };
layout(std430, set = 0, binding = 6) readonly restrict buffer XBuf { uint x_words[]; };
layout(std430, set = 0, binding = 7) buffer YBuf { uint y_words[]; };

shared float value_s[16];
shared float code_s[NF4_NESTED_CODE_SIZE];
shared float red[2][TEAMS][MAX_M][32];  // ping-pong buffers of the five levels above the lanes

float g_offset;

bool nested() { return (pc.flags & 1u) != 0u; }
uint x_dtype() { return (pc.flags >> 2) & 3u; }
uint y_dtype() { return (pc.flags >> 4) & 3u; }

// Exact fp16 -> fp32 (integer operations; core/half.h float_from_f16).
float float_from_f16(uint h) {
  uint sign = (h & 0x8000u) << 16;
  uint e = (h >> 10) & 0x1fu;
  uint mant = h & 0x3ffu;
  if (e == 0x1fu) return uintBitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (e == 0u) {
    if (mant == 0u) return uintBitsToFloat(sign);
    e = 1u;
    while ((mant & 0x400u) == 0u) {
      mant <<= 1;
      e -= 1u;
    }
    mant &= 0x3ffu;
  }
  return uintBitsToFloat(sign | ((e + 112u) << 23) | (mant << 13));
}

// X[j, col] as its exact fp32 value.
float x_value(uint j, uint col) {
  uint i = j * pc.k + col;
  uint d = x_dtype();
  if (d == 2u) return uintBitsToFloat(x_words[pc.x_off + i]);
  uint h = (x_words[pc.x_off + (i >> 1)] >> ((i & 1u) << 4)) & 0xffffu;
  return d == 1u ? uintBitsToFloat(h << 16) : float_from_f16(h);
}

// absmax of local block b: fl32(fl32(code2[q] * absmax2) + offset), two roundings, no FMA.
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

// The code of local element e.
uint code_at(uint e) {
  uint byte_ = e >> 1;
  uint b = (packed_words[pc.packed_off + (byte_ >> 2)] >> ((byte_ & 3u) << 3)) & 0xffu;
  return (e & 1u) != 0u ? (b >> NF4_ODD_NIBBLE_SHIFT) & 15u : (b >> NF4_EVEN_NIBBLE_SHIFT) & 15u;
}

uint out_bits(float v) {
  uint u = floatBitsToUint(v);
  bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint d = y_dtype();
  if (d == 0u) return nan ? 0x7e00u : f16_from_bits(u);
  if (d == 1u) return nan ? 0x7fc0u : bf16_from_bits(u);
  return nan ? 0x7fc00000u : u;
}

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint team = lid >> 5, lane = lid & 31u;
  const uint row_local = gl_WorkGroupID.x * TEAMS + team;
  const bool live = row_local < pc.rows;
  const float pad = uintBitsToFloat(pc.pad_bits);

  if (lid < 16u)
    value_s[lid] = (pc.flags & 2u) != 0u ? uintBitsToFloat(NF4_FP4_VALUE_BITS[lid]) : uintBitsToFloat(qmap_words[pc.qmap_off + lid]);
  if (nested()) {
    for (uint i = lid; i < NF4_NESTED_CODE_SIZE; i += gl_WorkGroupSize.x) code_s[i] = uintBitsToFloat(code_words[pc.code_off + i]);
    g_offset = uintBitsToFloat(pc.offset_word == 0xffffffffu ? pc.offset_bits : offset_words[pc.offset_word]);
  }
  barrier();

  const uint row_first = pc.elem_rem + row_local * pc.k;  // local element of W[row, 0]
  const uint chunks = (pc.k + 1023u) >> 10;
  float stack_[STACK_DEPTH];
  uint done = 0u;
  uint total = 1u;
  while (total < chunks) total <<= 1;  // chunks padded to a power of two

  for (uint c = 0u; c < total; ++c) {
    // This invocation's 32-leaf subtree, for every row j of X.
    float node[MAX_M];
    for (uint j = 0u; j < MAX_M; ++j) node[j] = pad;
    const uint col0 = c * 1024u + lane * 32u;
    if (live && c < chunks && col0 < pc.k) {
      float half_[MAX_M], left[MAX_M];
      // A lane's 32 leaves touch at most two quantization blocks (blocksize >= 32): their absmax
      // values, once.
      const uint e_first = row_first + col0;
      const uint e_last = row_first + min(col0 + 31u, pc.k - 1u);
      const uint b_first = e_first >> pc.log2_bs, b_last = e_last >> pc.log2_bs;
      const float am_first = block_absmax(b_first);
      const float am_last = b_last != b_first ? block_absmax(b_last) : am_first;
      for (uint w = 0u; w < 4u; ++w) {
        float wt[8];
        const uint e0 = e_first + 8u * w;
        const bool whole = (e0 & 7u) == 0u && col0 + 8u * w + 8u <= pc.k;
        // A whole, aligned group of 8 codes is one word (EB is a multiple of 8).
        const uint word = whole ? packed_words[pc.packed_off + (e0 >> 3)] : 0u;
        for (uint e = 0u; e < 8u; ++e) {
          uint col = col0 + 8u * w + e;
          wt[e] = 0.0;
          if (col < pc.k) {
            uint q;
            if (whole) {
              uint b = (word >> (8u * (e >> 1))) & 0xffu;
              q = (e & 1u) != 0u ? (b >> NF4_ODD_NIBBLE_SHIFT) & 15u : (b >> NF4_EVEN_NIBBLE_SHIFT) & 15u;
            } else {
              q = code_at(e0 + e);
            }
            precise float v = value_s[q] * (((e0 + e) >> pc.log2_bs) == b_first ? am_first : am_last);
            wt[e] = v;
          }
        }
        for (uint j = 0u; j < pc.m; ++j) {
          float p[8];
          for (uint e = 0u; e < 8u; ++e) {
            uint col = col0 + 8u * w + e;
            if (col < pc.k) {
              precise float prod = wt[e] * x_value(j, col);
              p[e] = prod;
            } else {
              p[e] = pad;
            }
          }
          precise float s01 = p[0] + p[1];
          precise float s23 = p[2] + p[3];
          precise float s45 = p[4] + p[5];
          precise float s67 = p[6] + p[7];
          precise float s03 = s01 + s23;
          precise float s47 = s45 + s67;
          precise float t = s03 + s47;
          if ((w & 1u) == 0u) {
            half_[j] = t;
          } else if (w == 1u) {
            precise float l = half_[j] + t;
            left[j] = l;
          } else {
            precise float r = half_[j] + t;
            precise float s = left[j] + r;
            node[j] = s;
          }
        }
      }
    }
    // The five levels above the lanes: 32 -> 16 -> 8 -> 4 -> 2 -> 1, ping-pong in shared memory.
    for (uint j = 0u; j < pc.m; ++j) red[0][team][j][lane] = node[j];
    barrier();
    uint src = 0u;
    for (uint width = 16u; width >= 1u; width >>= 1) {
      if (lane < width)
        for (uint j = 0u; j < pc.m; ++j) {
          precise float s = red[src][team][j][2u * lane] + red[src][team][j][2u * lane + 1u];
          red[1u - src][team][j][lane] = s;
        }
      barrier();
      src = 1u - src;
    }
    // Invocation j merges row j's chunk node into its stack (the binary counter).
    if (lane < pc.m) {
      float v = red[src][team][lane][0];
      uint level = 0u;
      for (uint cc = done; (cc & 1u) != 0u; cc >>= 1) {
        precise float s = stack_[level] + v;
        v = s;
        ++level;
      }
      stack_[level] = v;
    }
    ++done;
    barrier();  // red[src] is read above before the next chunk overwrites buffer 0 and 1
  }

  if (live && lane < pc.m) {
    uint top = 0u;
    while ((1u << top) < total) ++top;
    uint bits = out_bits(stack_[top]);
    uint yi = lane * pc.n + pc.row0 + row_local;
    if (y_dtype() == 2u) {
      y_words[pc.y_off + yi] = bits;
    } else {
      uint word = pc.y_off + (yi >> 1);
      uint shift = (yi & 1u) << 4;
      atomicAnd(y_words[word], ~(0xffffu << shift));
      atomicOr(y_words[word], bits << shift);
    }
  }
}
