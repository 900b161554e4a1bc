// SPDX-License-Identifier: MIT
// Dequantize one chunk of a bitsandbytes 4-bit tensor (docs/DESIGN.md section 2), bit-identical to the
// CPU oracle. Variants by -D: OUT_DTYPE (0 fp16, 1 bf16, 2 fp32, = nf4_dtype), NESTED (0|1),
// QUANT_TYPE (= nf4_quant_type: its values from quant_map or its built-in table, core/types.h),
// TABLE (0|1, see below),
// HWF16 (TABLE=0 and fp16 only: packHalf2x16 instead of integer rounding; the host selects it only
// on a device where the exhaustive check of shaders/f16_check.comp proved packHalf2x16 equal to
// f16_from_bits for every non-NaN input).
// Specialization constants: 0 = workgroup size, 1 = UNITS per invocation (<= MAX_UNITS).
//
// Memory shape (the CUDA kernel's, backends/cuda/kernel.cuh): a "unit" is 8 elements = one packed
// uint in, one uvec4 out (two for fp32). Invocation i of a workgroup handles units
// tile + i + k * WG (k < UNITS), so each subgroup reads contiguous 4-byte words (128 bytes per
// 32 lanes) and writes contiguous 16-byte vectors (512 bytes); all packed loads are issued before
// anything else. Everything is read and written through uint (no 8/16-bit storage).
//
// TABLE=0 (direct, like CUDA): each unit loads its block's absmax inputs together with its codes
// (8 neighbouring lanes read the same words: one broadcast load) and computes the absmax itself,
// looks up its values in shared memory (a 256-entry table of pairs or the 16 values, PAIR_LUT),
// multiplies, and converts. Units whose absmax and
// quant_map values are all finite cannot produce a NaN, so they take a conversion without the NaN
// case (bf16: 3 integer operations per element; fp16: packHalf2x16 where proven); other units
// take the full integer conversion.
// TABLE=1: the workgroup first computes each absmax of its tile once, then, per block, the 16
// possible outputs (rounded once per block and code instead of once per element) into shared
// memory; each element is then one shared-memory lookup. Both compute exactly
// fl32(value * absmax) and round it the same way.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

#include "format.glsl"

#ifndef OUT_DTYPE
#error "define OUT_DTYPE"
#endif
#ifndef HWF16
#define HWF16 0
#endif
#if HWF16 && (OUT_DTYPE != NF4_DTYPE_F16 || TABLE)
#error "HWF16 is a variant of the TABLE=0 fp16 kernel only"
#endif
#define MAX_UNITS 8

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint UNITS = 4u;
// TABLE=0: 1 = values from a 256-entry table of pairs (one 8-byte lookup and one byte extraction
// per two elements, but bank conflicts), 0 = from a 16-entry table (conflict-free, a nibble
// extraction per element).
layout(constant_id = 2) const uint PAIR_LUT = 1u;

// Offsets are relative to each binding's descriptor offset (the host aligns descriptor offsets
// down to minStorageBufferOffsetAlignment and passes the remainder here).
layout(push_constant) uniform Params {
  uint n;            // elements in this chunk (the chunk starts at a multiple of the blocksize)
  uint packed_off;   // word of the chunk's first packed byte (binding 0)
  uint absmax_off;   // flat: word, nested: byte of the chunk's first absmax (binding 1)
  uint qmap_off;     // word of quant_map[0] (binding 2)
  uint nested_off;   // word of nested_absmax[first_block / nested_blocksize] (binding 3)
  uint code_off;     // word of nested_code[0] (binding 4)
  uint offset_word;  // word of the nested offset in binding 5, or 0xffffffff: use offset_bits
  uint offset_bits;  // the nested offset as float bits
  uint block_rem;    // first_block % nested_blocksize
  uint out_off;      // 16-byte vector of the chunk's first output (binding 6)
  uint log2_bs;      // log2(blocksize)
  uint log2_nbs;     // log2(nested_blocksize)
} pc;

layout(std430, set = 0, binding = 0) readonly restrict buffer PackedBuf { uint packed_words[]; };
layout(std430, set = 0, binding = 1) readonly restrict buffer AbsmaxBuf { uint absmax_words[]; };
#if NF4_STORED_TABLE
layout(std430, set = 0, binding = 2) readonly restrict buffer QuantMapBuf { uint qmap_words[]; };
#endif
#if NESTED
layout(std430, set = 0, binding = 3) readonly restrict buffer NestedAbsmaxBuf { uint nested_words[]; };
layout(std430, set = 0, binding = 4) readonly restrict buffer NestedCodeBuf { uint code_words[]; };
layout(std430, set = 0, binding = 5) readonly restrict buffer OffsetBuf { uint offset_words[]; };
#endif
// Two views of the output: whole vectors for full units, words (atomics for a half word) for the
// tensor's last partial unit, so nothing past the last element is ever written.
layout(std430, set = 0, binding = 6) writeonly buffer OutVec { uvec4 out_vec[]; };
layout(std430, set = 0, binding = 6) buffer OutWord { uint out_word[]; };

float code_value(uint q) {
#if !NF4_STORED_TABLE
  return uintBitsToFloat(NF4_BUILTIN_VALUE_BITS[QUANT_TYPE][q]);
#else
  return uintBitsToFloat(qmap_words[pc.qmap_off + q]);
#endif
}

#if NESTED
float g_offset;
#if !TABLE
shared float code_s[NF4_NESTED_CODE_SIZE];  // the nested code table, loaded once per workgroup
float nested_code(uint q) { return code_s[q]; }
#else
float nested_code(uint q) { return uintBitsToFloat(code_words[pc.code_off + q]); }
#endif
#endif

// absmax of local block b: fl32(fl32(code2[q] * absmax2[..]) + offset), two roundings, no FMA.
float block_absmax(uint b) {
#if NESTED
  uint byte_index = pc.absmax_off + b;
  uint q = (absmax_words[byte_index >> 2] >> ((byte_index & 3u) << 3)) & 0xffu;
  float c = nested_code(q);
  float s = uintBitsToFloat(nested_words[pc.nested_off + ((pc.block_rem + b) >> pc.log2_nbs)]);
  precise float scaled = c * s;
  precise float a = scaled + g_offset;
  return a;
#else
  return uintBitsToFloat(absmax_words[pc.absmax_off + b]);
#endif
}

// The output bits of one element (narrower results in the low bits): the row's codec.
uint out_bits(float v) { return NF4_ENCODE_OUT(floatBitsToUint(v)); }

// A unit is the 8 elements of 4 packed bytes: 16 bytes of 2-byte output (lo), 32 of 4-byte (lo,
// then hi), 8 of 1-byte (lo.x, lo.y).
#if NF4_OUT_SIZE != 1 && NF4_OUT_SIZE != 2 && NF4_OUT_SIZE != 4
#error "a unit holds elements of 1, 2 or 4 bytes"
#endif

uint even_code(uint byte_) { return (byte_ >> NF4_EVEN_NIBBLE_SHIFT) & 15u; }
uint odd_code(uint byte_) { return (byte_ >> NF4_ODD_NIBBLE_SHIFT) & 15u; }

// Writes the first r (1..7) elements of unit u: lo holds elements 0..3 (4-byte), 0..7 (2-byte)
// or 0..7 in lo.x and lo.y (1-byte), hi elements 4..7 (4-byte only).
void store_tail(uint u, uvec4 lo, uvec4 hi, uint r) {
#if NF4_OUT_SIZE == 4
  uint w0 = pc.out_off * 4u + u * 8u;
  for (uint m = 0u; m < r; ++m) out_word[w0 + m] = m < 4u ? lo[m] : hi[m - 4u];
#elif NF4_OUT_SIZE == 1
  uint w0 = pc.out_off * 4u + u * 2u;
  if (r >= 4u) out_word[w0] = lo.x;
  if ((r & 3u) != 0u) {
    // The rest of this word is not ours: change only its first r % 4 bytes.
    uint mask = (1u << (8u * (r & 3u))) - 1u;
    atomicAnd(out_word[w0 + (r >> 2)], ~mask);
    atomicOr(out_word[w0 + (r >> 2)], (r >= 4u ? lo.y : lo.x) & mask);
  }
#else
  uint w0 = pc.out_off * 4u + u * 4u;
  for (uint m = 0u; m < (r >> 1); ++m) out_word[w0 + m] = lo[m];
  if ((r & 1u) != 0u) {
    // The other half of this word is not ours: change only the low 16 bits.
    atomicAnd(out_word[w0 + (r >> 1)], 0xffff0000u);
    atomicOr(out_word[w0 + (r >> 1)], lo[r >> 1] & 0xffffu);
  }
#endif
}

void store_unit(uint u, uint full_units, uvec4 lo, uvec4 hi) {
  if (u < full_units) {
#if NF4_OUT_SIZE == 4
    out_vec[pc.out_off + 2u * u] = lo;
    out_vec[pc.out_off + 2u * u + 1u] = hi;
#elif NF4_OUT_SIZE == 1
    out_word[pc.out_off * 4u + 2u * u] = lo.x;
    out_word[pc.out_off * 4u + 2u * u + 1u] = lo.y;
#else
    out_vec[pc.out_off + u] = lo;
#endif
  } else {
    store_tail(u, lo, hi, pc.n & 7u);
  }
}

#if TABLE
// Per block of the tile, its 16 outputs: narrower results repeated across the word (16-bit:
// h * 0x10001, 8-bit: b * 0x01010101), so packing elements into a word is one mask-merge each.
shared uint table_[gl_WorkGroupSize.x * UNITS * 4u + 16u];  // tile / 32 blocks, +1 when unaligned
shared float amax_s[gl_WorkGroupSize.x * UNITS / 4u + 1u];
#else
// Byte b of the packed codes -> the value bits of its even element (.x, lower address) and of its
// odd element (.y): one 8-byte lookup per two elements (PAIR_LUT), or the 16 values.
shared uvec2 pair_lut[256];
shared uint value_lut[16];
#if NF4_STORED_TABLE
shared uint lut_bad;  // nonzero: a quant_map value is inf or NaN
#endif
#endif

bool finite_bits(uint u) { return (u & 0x7f800000u) != 0x7f800000u; }

void main() {
  const uint wg = gl_WorkGroupSize.x;
  const uint lid = gl_LocalInvocationID.x;
  const uint tile_unit = gl_WorkGroupID.x * (wg * UNITS);
  const uint n_units = (pc.n + 7u) >> 3;
  const uint full_units = pc.n >> 3;

  uint w[MAX_UNITS];
  [[unroll]] for (uint k = 0u; k < MAX_UNITS; ++k) {
    w[k] = 0u;
    uint u = tile_unit + k * wg + lid;
    if (k < UNITS && u < n_units) w[k] = packed_words[pc.packed_off + u];
  }
#if !TABLE
  // The absmax inputs of each unit, loaded with the codes (as the CUDA kernel does) so that their
  // latency overlaps the codes' and the shared tables' barriers; used raw, after them.
  uint a_word[MAX_UNITS];   // nested: the word holding the absmax code byte; flat: the absmax bits
#if NESTED
  float a_scale[MAX_UNITS];  // nested_absmax of the unit's block
#endif
  [[unroll]] for (uint k = 0u; k < MAX_UNITS; ++k) {
    a_word[k] = 0u;
#if NESTED
    a_scale[k] = 0.0;
#endif
    uint u = tile_unit + k * wg + lid;
    if (k < UNITS && u < n_units) {
      uint b = (u << 3) >> pc.log2_bs;
#if NESTED
      a_word[k] = absmax_words[(pc.absmax_off + b) >> 2];
      a_scale[k] = uintBitsToFloat(nested_words[pc.nested_off + ((pc.block_rem + b) >> pc.log2_nbs)]);
#else
      a_word[k] = absmax_words[pc.absmax_off + b];
#endif
    }
  }
#endif

#if NESTED
  g_offset = uintBitsToFloat(pc.offset_word == 0xffffffffu ? pc.offset_bits : offset_words[pc.offset_word]);
#endif

#if TABLE
  // Blocks this tile touches (a tile need not be a multiple of the blocksize, nor inside one).
  const uint tile_elem = tile_unit << 3;
  const uint first_block = tile_elem >> pc.log2_bs;
  const uint last_elem = min(tile_elem + wg * UNITS * 8u, pc.n) - 1u;
  const uint blocks = (last_elem >> pc.log2_bs) - first_block + 1u;
  // Entry e of the table is code e % 16 of block e / 16; the workgroup size is a multiple of 16,
  // so this invocation's entries all have code lid % 16.
  const float value = code_value(lid & 15u);
  // 1. One absmax per block (the only dependent global loads, once per block, in parallel).
  for (uint b = lid; b < blocks; b += wg) amax_s[b] = block_absmax(first_block + b);
  barrier();
  // 2. The table, from shared memory only.
  for (uint e = lid; e < blocks * 16u; e += wg) {
    precise float v = value * amax_s[e >> 4];
#if NF4_OUT_SIZE == 4
    table_[e] = floatBitsToUint(v);
#elif NF4_OUT_SIZE == 1
    table_[e] = out_bits(v) * 0x01010101u;
#else
    table_[e] = out_bits(v) * 0x10001u;
#endif
  }
  barrier();

  [[unroll]] for (uint k = 0u; k < MAX_UNITS; ++k) {
    uint u = tile_unit + k * wg + lid;
    if (k >= UNITS || u >= n_units) break;
    uint t = ((((tile_unit + k * wg + lid) << 3) >> pc.log2_bs) - first_block) << 4;  // this unit's block in the table
    uvec4 lo, hi;
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      uint b = (w[k] >> (8u * j)) & 0xffu;
      uint e0 = table_[t + even_code(b)];
      uint e1 = table_[t + odd_code(b)];
#if NF4_OUT_SIZE == 4
      if (j < 2u) { lo[2u * j] = e0; lo[2u * j + 1u] = e1; }
      else { hi[2u * j - 4u] = e0; hi[2u * j - 3u] = e1; }
#elif NF4_OUT_SIZE == 1
      // Elements 2j and 2j + 1 are bytes 2(j % 2) and 2(j % 2) + 1 of word j / 2.
      uint shift = 16u * (j & 1u);
      uint pair = (e0 & (0xffu << shift)) | (e1 & (0xff00u << shift));
      if ((j & 1u) == 0u) lo[j >> 1] = pair;
      else lo[j >> 1] |= pair;
#else
      lo[j] = (e0 & 0xffffu) | (e1 & 0xffff0000u);
#endif
    }
    store_unit(u, full_units, lo, hi);
  }
#else
  // Shared tables: the pair table (and the nested code table), and whether every quant_map value is
  // finite. Their global loads overlap the packed loads already in flight.
#if NF4_STORED_TABLE
  if (lid == 0u) lut_bad = 0u;
#endif
  bool bad = false;
  if (PAIR_LUT != 0u) {
    for (uint e = lid; e < 256u; e += wg) {
      uint ve = floatBitsToUint(code_value(even_code(e)));
      uint vo = floatBitsToUint(code_value(odd_code(e)));
      pair_lut[e] = uvec2(ve, vo);
      bad = bad || !finite_bits(ve) || !finite_bits(vo);
    }
  } else if (lid < 16u) {  // the workgroup size is >= 16
    uint v = floatBitsToUint(code_value(lid));
    value_lut[lid] = v;
    bad = !finite_bits(v);
  }
#if NESTED
  for (uint i = lid; i < NF4_NESTED_CODE_SIZE; i += wg) code_s[i] = uintBitsToFloat(code_words[pc.code_off + i]);
#endif
  barrier();
#if !NF4_STORED_TABLE
  const bool lut_clean = true;  // built-in values are finite (checked by the generator)
#else
  if (bad) atomicOr(lut_bad, 1u);
  barrier();
  const bool lut_clean = lut_bad == 0u;
#endif

  [[unroll]] for (uint k = 0u; k < MAX_UNITS; ++k) {
    uint u = tile_unit + k * wg + lid;
    if (k >= UNITS || u >= n_units) break;
#if NESTED
    // fl32(fl32(code2[q] * absmax2) + offset), as block_absmax computes it, from the loaded words.
    uint byte_index = pc.absmax_off + ((u << 3) >> pc.log2_bs);
    precise float scaled = code_s[(a_word[k] >> ((byte_index & 3u) << 3)) & 0xffu] * a_scale[k];
    precise float a = scaled + g_offset;
#else
    float a = uintBitsToFloat(a_word[k]);
#endif
    float v[8];
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      uint byte_ = (w[k] >> (8u * j)) & 0xffu;
      uvec2 p = PAIR_LUT != 0u ? pair_lut[byte_] : uvec2(value_lut[even_code(byte_)], value_lut[odd_code(byte_)]);
      precise float v0 = uintBitsToFloat(p.x) * a;
      precise float v1 = uintBitsToFloat(p.y) * a;
      v[2u * j] = v0;
      v[2u * j + 1u] = v1;
    }
    uvec4 lo, hi;
#if NF4_OUT_SIZE == 4
    lo = floatBitsToUint(vec4(v[0], v[1], v[2], v[3]));
    hi = floatBitsToUint(vec4(v[4], v[5], v[6], v[7]));
#elif NF4_OUT_SIZE == 1
    [[unroll]] for (uint j = 0u; j < 2u; ++j)
      lo[j] = out_bits(v[4u * j]) | (out_bits(v[4u * j + 1u]) << 8) | (out_bits(v[4u * j + 2u]) << 16) | (out_bits(v[4u * j + 3u]) << 24);
#elif OUT_DTYPE == NF4_DTYPE_BF16 || HWF16
    // finite value * finite absmax is never NaN: the NaN-free conversion is exact there.
    const bool clean = lut_clean && finite_bits(floatBitsToUint(a));
    [[dont_flatten]] if (clean) {
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
#if HWF16
        lo[j] = packHalf2x16(vec2(v[2u * j], v[2u * j + 1u]));
#else
        lo[j] = bf16_pair_not_nan(floatBitsToUint(v[2u * j]), floatBitsToUint(v[2u * j + 1u]));
#endif
      }
    } else {
      [[unroll]] for (uint j = 0u; j < 4u; ++j) lo[j] = out_bits(v[2u * j]) | (out_bits(v[2u * j + 1u]) << 16);
    }
#else
    [[unroll]] for (uint j = 0u; j < 4u; ++j) lo[j] = out_bits(v[2u * j]) | (out_bits(v[2u * j + 1u]) << 16);
#endif
    store_unit(u, full_units, lo, hi);
  }
#endif
}
