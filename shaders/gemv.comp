// SPDX-License-Identifier: MIT
// The fused matrix-vector product Y[m, n] = sum_k X[m, k] * W[n, k] (nf4.h, docs/GEMV.md) for a
// range of rows of W, bit-identical to the CPU oracle and to the CUDA kernel (backends/cuda/gemv.cu),
// whose tree mapping it mirrors.
//
// The tree (the same for every specialization, so the bits never depend on them):
//   - A team of 32 invocations owns R rows of W at a time. Columns are cut into chunks of 1024; in
//     chunk c, lane L owns the leaves [1024c + 32L, +32) of each of its rows and computes their
//     subtree itself (8-leaf subtrees per 32-bit word of codes, then ((s0 + s1) + (s2 + s3))).
//   - The five levels above the lanes' subtrees: an xor butterfly (subgroupShuffleXor, offsets
//     1, 2, 4, ...) for the offsets below the subgroup size (SHUF_LEVELS levels; partners hold
//     sibling subtrees and fp32 addition is commutative, so both get the parent node), then the
//     remaining levels through shared memory. On NVIDIA (32) and AMD (64: offsets up to 16 stay
//     inside 32-lane halves) all five are shuffles and the chunk loop has no barrier; lavapipe
//     (8 or 16) exercises both mechanisms; a device without the shuffle operation takes shared
//     memory for all five (SHUF_LEVELS = 0).
//   - The chunks' nodes go through a binary counter (lane r * MM + j keeps the stack of row r,
//     activation row j, in shared memory of its own until the parts' roots are added, below),
//     padded with pad_bits to a power of two (core/gemv.h, gemv_pad_bits): the root equals the
//     contract's over bit_ceil(k) leaves.
//   - SPLIT consecutive teams share a row group (few rows and long k would otherwise leave most
//     of a GPU idle): part p takes chunks [p * span, (p + 1) * span) of the chunk tree padded to
//     P = bit_ceil(chunks), span = P / SPLIT, so its root is a node of the same tree (a part past
//     the last chunk gets the padding value), and after a barrier part 0 adds the SPLIT roots
//     pairwise, level by level: the tree's upper levels. The bits do not depend on SPLIT.
// Every product and sum is `precise` (one rounding, never fused into an FMA).
//
// Speed (the vector path, VEC: k % 32 == 0 and 16-byte aligned codes and x, host-checked):
//   - A lane's 32 codes of a row and chunk are one 16-byte load (the team reads 512 contiguous
//     bytes per row), and lie in one quantization block (blocksize >= 32): one absmax per lane,
//     row and chunk. The next chunk's codes and absmax (R rows) are loaded before the current
//     chunk is computed, so each lane has R * 16 bytes of W in flight while it computes.
//   - Each lane's x values (8 per word, one 16-byte load for 16-bit x) are converted once and used
//     for all R rows: per weight the x traffic and conversion cost is 1/R of one row's.
//   - Instructions per weight and activation row in the unrolled loop: the nibble extract (1-2,
//     shift and mask), the value lookup (1 shared load) and `* absmax` (1), shared by the MM rows
//     of X; then per activation row a multiply and an add (2; the contract forbids fusing them)
//     plus 1/R of the x conversion. The 16-entry value table sits in 16 distinct banks, so the
//     lookup is conflict-free for any codes; PAIR_REP > 0 selects a 256-entry table of value
//     pairs (one 8-byte lookup per byte of codes, PAIR_REP copies indexed by lane to spread the
//     banks), half the lookups for the same shared-memory bytes.
//   - The specialization constants (MM, R, XD, VEC) make every loop bound a constant: the
//     driver unrolls them and keeps the accumulators (2 * R * MM) in registers.
//   - 16-bit outputs: where a team's rows come in even-aligned pairs and n is even, one lane
//     writes both rows' halves as one word; otherwise an atomicAnd / atomicOr pair on the word
//     (whose other half another workgroup may own).
// Other shapes (VEC false: k % 32 != 0, blocks straddling rows at odd offsets, misaligned
// buffers) take a per-element path with the same tree (R = 1, MM = 8, x dtype from the flags).
// Every control-flow decision before a barrier is uniform over the workgroup (the loop's step
// count depends on k and SPLIT only; teams past the last row, and parts past the last chunk, still
// walk the chunk loop, without loads).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

#include "format.glsl"

// x and y are decoded and stored for exactly these dtypes (x_value, x_from_units, the y store):
// a row of core/types.h the product takes (product column) needs its case in each before this
// compiles; the product never sees the others.
#if NF4_PRODUCT_DTYPE_COUNT != 3 || NF4_DTYPE_F16 != 0 || NF4_DTYPE_BF16 != 1 || NF4_DTYPE_F32 != 2
#error "gemv.comp decodes fp16 (0), bf16 (1) and fp32 (2) only"
#endif

layout(constant_id = 0) const uint WG = 128;          // invocations: WG / 32 teams
layout(constant_id = 1) const uint MM = 8;            // rows of X held (pc.m <= MM; rows past m are zeros, not written)
layout(constant_id = 2) const uint R = 1;             // rows of W per team at a time (R * MM <= 32)
layout(constant_id = 3) const uint XD = NF4_DTYPE_COUNT;  // x dtype (nf4_dtype); no row's value: read from pc.flags
layout(constant_id = 4) const bool VEC = false;       // the vector path (see above)
layout(constant_id = 5) const uint SHUF_LEVELS = 0;   // levels above the lanes by shuffle: <= 5, <= log2(subgroup size)
layout(constant_id = 6) const uint PAIR_REP = 0;      // 0: 16-entry value table; else copies of the 256-entry pair table
layout(local_size_x_id = 0) in;

const uint TEAMS = WG / 32u;
const uint RM = R * MM;
const uint G = 32u >> SHUF_LEVELS;  // distinct nodes per team left after the shuffle levels
layout(constant_id = 7) const uint STACK_DEPTH = 22;  // chunk-stack levels: 8 up to 128 chunks; 22 for k < 2^31 (host-checked)
layout(constant_id = 8) const uint SPLIT = 1;         // teams sharing a row group's chunks: a power of two, <= TEAMS, <= bit_ceil(chunks) (host-checked)
layout(constant_id = 9) const uint XS_UNITS = 0;      // VEC: x staged in shared memory, m * chunks * XU * 32 16-byte units; 0: read from binding 6
layout(constant_id = 10) const bool ORDERED = true;   // VEC: the ordered prefetch (see main)
const uint GROUPS = TEAMS / SPLIT;  // row groups per workgroup
const uint XU = XD == 2u ? 8u : 4u;  // VEC: 16-byte units of x per lane and chunk (32 elements)

// Element indices are relative to the dispatch's base element EB (a multiple of the blocksize at
// or before the first row's first element); offsets are relative to each binding's descriptor.
layout(push_constant) uniform Params {
  uint k;            // columns (<= 2^31 - 2 * blocksize)
  uint rows;         // rows of W in this dispatch
  uint row0;         // global index of its first row (for y)
  uint n;            // rows of W in all (y's row stride)
  uint m;            // rows of X and Y, 1..8
  uint elem_rem;     // first row's first element - EB
  uint packed_off;   // word of packed byte EB / 2 (binding 0); a multiple of 4 on the vector path
  uint absmax_off;   // flat: word, nested: byte of absmax block EB / blocksize (binding 1)
  uint qmap_off;     // word of quant_map[0] (binding 2)
  uint nested_off;   // word of nested_absmax[(EB / blocksize) / nested_blocksize] (binding 3)
  uint code_off;     // word of nested_code[0] (binding 4)
  uint offset_word;  // word of the nested offset (binding 5), or 0xffffffff: offset_bits
  uint offset_bits;
  uint block_rem;    // (EB / blocksize) % nested_blocksize
  uint log2_bs;
  uint log2_nbs;
  uint x_off;        // word of X[0, 0] (binding 6); a multiple of 4 on the vector path
  uint y_off;        // word of Y[0, 0] (binding 7)
  uint pad_bits;     // gemv_pad_bits(k)
  uint flags;        // bit 0 nested, bits 2-3 x dtype, bits 4-5 y dtype (nf4_dtype), bits 8-12 quant type (nf4_quant_type)
  uint groups;       // workgroup slots of this dispatch (GROUPS row groups each); workgroup w takes w, w + count, ...
  uint zero;         // 0; the shader cannot prove it, which orders the chunk loop's loads (see main)
} pc;

// Bindings 0 and 6 are also read as 16-byte vectors (the same buffers, VEC only).
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
shared vec2 pair_s[256u * PAIR_REP + 1u];
shared float code_s[NF4_NESTED_CODE_SIZE];
shared float red_s[G == 1u ? 1u : 2u * TEAMS * RM * G];  // double-buffered by chunk parity
shared float stack_s[TEAMS * RM * STACK_DEPTH];
shared uint out_s[TEAMS * RM];
shared uvec4 xs_s[XS_UNITS > 0u ? XS_UNITS : 1u];  // xs_s[((j * chunks + c) * XU + u) * 32 + L]: unit u of lane L's x in chunk c

float g_offset;

bool nested() { return (pc.flags & 1u) != 0u; }
// Whether the codes decode through quant_map (binding 2), else through the format's built-in
// table: the quant type's row of core/types.h (kQuantTypes, stored_table) decides.
bool stored_table() { return ((NF4_STORED_TABLE_QUANT_TYPES >> ((pc.flags >> 8) & 31u)) & 1u) != 0u; }
uint x_dtype() { return XD < NF4_DTYPE_COUNT ? XD : (pc.flags >> 2) & 3u; }
uint y_dtype() { return (pc.flags >> 4) & 3u; }

// Exact fp16 -> fp32 with integer operations (no loop): normal and inf/NaN by rebiasing the
// exponent, subnormal as mantissa * 2^-24 (exact: a normal fp32 result).
float float_from_f16(uint h) {
  uint a = h & 0x7fffu;
  uint mag;
  if (a < 0x400u) {
    precise float s = float(a) * 5.9604644775390625e-8;  // 2^-24
    mag = floatBitsToUint(s);
  } else {
    mag = (a << 13) + (a >= 0x7c00u ? 0x70000000u : 0x38000000u);
  }
  return uintBitsToFloat(mag | ((h & 0x8000u) << 16));
}

// X[j, col] as its exact fp32 value.
float x_value(uint j, uint col) {
  uint i = j * pc.k + col;
  uint d = x_dtype();
  if (d == 2u) return uintBitsToFloat(x_words[pc.x_off + i]);
  uint h = (x_words[pc.x_off + (i >> 1)] >> ((i & 1u) << 4)) & 0xffffu;
  return d == 1u ? uintBitsToFloat(h << 16) : float_from_f16(h);
}

// The vector path (VEC, where XD is the x dtype) reads x as 16-byte units of 4 (fp32) or 8
// (16-bit) elements: x_vecs[x_unit(e)] is the unit starting at element e of X (a multiple of 4 or 8).
uint x_unit(uint e) { return (pc.x_off >> 2) + (XD == 2u ? e >> 2 : e >> 3); }

// 8 activations as fp32 from the units holding them: a (and b, fp32) in element order.
void x_from_units(uvec4 a, uvec4 b, out float xv[8]) {
  [[unroll]] for (uint e = 0u; e < 4u; ++e) {
    if (XD == 2u) {
      xv[e] = uintBitsToFloat(a[e]);
      xv[4u + e] = uintBitsToFloat(b[e]);
    } else if (XD == 1u) {
      xv[2u * e] = uintBitsToFloat(a[e] << 16);
      xv[2u * e + 1u] = uintBitsToFloat(a[e] & 0xffff0000u);
    } else {
      xv[2u * e] = float_from_f16(a[e] & 0xffffu);
      xv[2u * e + 1u] = float_from_f16(a[e] >> 16);
    }
  }
}

// The 8 activations X[j, col .. col + 8) (col a multiple of 8, VEC) as fp32.
void x_vector8(uint j, uint col, out float xv[8]) {
  const uint u = x_unit(j * pc.k + col);
  x_from_units(x_vecs[u], XD == 2u ? x_vecs[u + 1u] : uvec4(0u), xv);
}

// The same 8 activations from the staged copy (chunk c, the lane's word w).
void x_staged8(uint j, uint chunks, uint c, uint lane, uint w, out float xv[8]) {
  const uint base = ((j * chunks + c) * XU) * 32u + lane;
  if (XD == 2u) x_from_units(xs_s[base + 2u * w * 32u], xs_s[base + (2u * w + 1u) * 32u], xv);
  else x_from_units(xs_s[base + w * 32u], uvec4(0u), xv);
}

// The binary counter of a lane's chunk stack (stack_s from base): the node of the part's chunk
// `done`, merged while `done` has trailing one bits.
void push_node(uint base, uint done, float v) {
  uint level = 0u;
  for (uint cc = done; (cc & 1u) != 0u; cc >>= 1) {
    precise float s = stack_s[base + level] + v;
    v = s;
    ++level;
  }
  stack_s[base + level] = v;
}

// absmax of local block b from its raw parts: flat, the fp32 bits (q); nested, the code byte q and
// its nested scale s: fl32(fl32(code2[q] * s) + offset), two roundings, no FMA.
float absmax_from(uint q, float s) {
  if (nested()) {
    precise float scaled = code_s[q] * s;
    precise float a = scaled + g_offset;
    return a;
  }
  return uintBitsToFloat(q);
}

void absmax_raw(uint b, out uint q, out float s) {
  if (nested()) {
    uint byte_index = pc.absmax_off + b;
    q = (absmax_words[byte_index >> 2] >> ((byte_index & 3u) << 3)) & 0xffu;
    s = uintBitsToFloat(nested_words[pc.nested_off + ((pc.block_rem + b) >> pc.log2_nbs)]);
  } else {
    q = absmax_words[pc.absmax_off + b];
    s = 0.0;
  }
}

float block_absmax(uint b) {
  uint q;
  float s;
  absmax_raw(b, q, s);
  return absmax_from(q, s);
}

// The code of local element e.
uint code_at(uint e) {
  uint byte_ = e >> 1;
  uint b = (packed_words[pc.packed_off + (byte_ >> 2)] >> ((byte_ & 3u) << 3)) & 0xffu;
  return (e & 1u) != 0u ? (b >> NF4_ODD_NIBBLE_SHIFT) & 15u : (b >> NF4_EVEN_NIBBLE_SHIFT) & 15u;
}

// The 8 weights of one word of codes (element 2t is byte t's NF4_EVEN_NIBBLE_SHIFT nibble), times am.
void decode8(uint word, float am, uint rep, out float wt[8]) {
  if (PAIR_REP == 0u) {
    [[unroll]] for (uint e = 0u; e < 8u; ++e) {
      uint shift = 8u * (e >> 1) + ((e & 1u) != 0u ? NF4_ODD_NIBBLE_SHIFT : NF4_EVEN_NIBBLE_SHIFT);
      precise float v = value_s[(word >> shift) & 15u] * am;
      wt[e] = v;
    }
  } else {
    [[unroll]] for (uint t = 0u; t < 4u; ++t) {
      vec2 pv = pair_s[((word >> (8u * t)) & 0xffu) * PAIR_REP + rep];
      precise float v0 = pv.x * am;
      precise float v1 = pv.y * am;
      wt[2u * t] = v0;
      wt[2u * t + 1u] = v1;
    }
  }
}

float tree8(float p[8]) {
  precise float s01 = p[0] + p[1];
  precise float s23 = p[2] + p[3];
  precise float s45 = p[4] + p[5];
  precise float s67 = p[6] + p[7];
  precise float s03 = s01 + s23;
  precise float s47 = s45 + s67;
  precise float t = s03 + s47;
  return t;
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
  // With shuffles a team is 32 consecutive invocations of one subgroup (subgroup-major numbering,
  // whatever the driver's assignment of invocations to subgroups); without, any numbering.
  const uint lin = SHUF_LEVELS > 0u ? gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID : lid;
  const uint team = lin >> 5, lane = lin & 31u;
  const uint part = team % SPLIT;  // teams group * SPLIT .. + SPLIT - 1 share the row group
  const float pad = uintBitsToFloat(pc.pad_bits);
  const uint chunks = (pc.k + 1023u) >> 10;

  const bool stored = stored_table();
  if (lid < 16u)
    value_s[lid] = uintBitsToFloat(stored ? qmap_words[pc.qmap_off + lid] : NF4_BUILTIN_VALUE_BITS[(pc.flags >> 8) & 31u][lid]);
  if (nested()) {
    for (uint i = lid; i < NF4_NESTED_CODE_SIZE; i += WG) code_s[i] = uintBitsToFloat(code_words[pc.code_off + i]);
    g_offset = uintBitsToFloat(pc.offset_word == 0xffffffffu ? pc.offset_bits : offset_words[pc.offset_word]);
  }
  if (XS_UNITS > 0u) {
    // Lane L's units of chunk c in the order it reads them: a team's 16-byte reads are conflict-free
    // (through the buffer a lane's 64-byte stride spreads every read over four times the cache lines).
    const uint per_row = chunks * XU * 32u;
    for (uint i = lid; i < pc.m * per_row; i += WG) {
      const uint L = i & 31u, u = (i >> 5) % XU, c = (i >> 5) / XU % chunks, j = i / per_row;
      const uint col = c * 1024u + L * 32u + u * (XD == 2u ? 4u : 8u);
      const uint e = j * pc.k + col;  // x element; a multiple of 4 (fp32) or 8 (16-bit)
      xs_s[i] = col < pc.k ? x_vecs[x_unit(e)] : uvec4(0u);
    }
  }
  barrier();
  if (PAIR_REP > 0u) {
    // Pair b holds the values of byte b's two nibbles (element 2t first), PAIR_REP copies side by
    // side: lane L reads copy L % PAIR_REP, so a half-warp's 8-byte reads fall in distinct banks.
    for (uint i = lid; i < 256u * PAIR_REP; i += WG) {
      const uint b = i / PAIR_REP;
      pair_s[i] = vec2(value_s[(b >> NF4_EVEN_NIBBLE_SHIFT) & 15u], value_s[(b >> NF4_ODD_NIBBLE_SHIFT) & 15u]);
    }
    barrier();
  }

  const uint rep = PAIR_REP > 0u ? lane % PAIR_REP : 0u;
  // This part's chunks: [lo, lo + span) of the chunk tree padded to a power of two. span is a
  // power of two and lo a multiple of it, so the part's root is a node of the contract's tree.
  uint top = 0u;  // log2(span)
  while ((SPLIT << top) < chunks) ++top;
  const uint span = 1u << top, lo = part * span;
  // Every part walks min(span, chunks) steps of the loop below (part 0's real chunks; uniform
  // over the workgroup for its barrier and shuffles), steps past the last chunk loading nothing,
  // then pushes the rest of its span as padding.
  const uint steps = min(span, chunks);
  const uint stack_base = (team * RM + lane) * STACK_DEPTH;
  // The value index (r * MM + j) lane L ends a chunk with. With every level above the lanes by
  // shuffle, the transposed butterfly: each of the first log2(RM) levels halves the values a lane
  // carries (it keeps one half, its partner the other, and each adds the sibling subtree it
  // receives), RM - 1 + 5 - log2(RM) shuffles a chunk instead of 5 RM; the bits of L pick halves.
  uint my_v = lane;
  if (G == 1u) {
    my_v = 0u;
    uint lv = 0u;
    [[unroll]] for (uint cnt = RM; cnt > 1u; cnt >>= 1) {
      my_v += ((lane >> lv) & 1u) * (cnt >> 1);
      ++lv;
    }
  }
  const uint r_out = my_v / MM, j_out = my_v % MM;

  // Workgroup slots: a dispatch may hold fewer workgroups than slots, each then taking several in
  // turn (the shared tables and staged x are built once per workgroup).
  for (uint slot = gl_WorkGroupID.x; slot < pc.groups; slot += gl_NumWorkGroups.x) {
    const uint row_base = (slot * GROUPS + team / SPLIT) * R;  // the team's first local row
    bool row_live[R];
    uint row_first[R];  // local element of W[row, 0]
    [[unroll]] for (uint r = 0u; r < R; ++r) {
      row_live[r] = row_base + r < pc.rows;
      row_first[r] = pc.elem_rem + (row_base + r) * pc.k;
    }
    uint done = 0u;

    // Chunk c + 1's codes and absmax parts, loaded while chunk c is computed (VEC).
    uvec4 next_codes[R];
    uint next_q[R];
    float next_s[R];
    [[unroll]] for (uint r = 0u; r < R; ++r) {
      next_codes[r] = uvec4(0u);
      next_q[r] = 0u;
      next_s[r] = 0.0;
      if (VEC && row_live[r] && lo * 1024u + lane * 32u < pc.k) {
        uint e = row_first[r] + lo * 1024u + lane * 32u;
        next_codes[r] = packed_vecs[(pc.packed_off >> 2) + (e >> 5)];
        absmax_raw(e >> pc.log2_bs, next_q[r], next_s[r]);
      }
    }

    for (uint i = 0u; i < steps; ++i) {
      const uint c = lo + i;
      const uint col0 = c * 1024u + lane * 32u;
      float node[RM];
      [[unroll]] for (uint v = 0u; v < RM; ++v) node[v] = pad;

      if (VEC) {
        // Ordered prefetch: every value loaded for this chunk is used (the absmax decoded, and at
        // MM = 1 unstaged the lane's x loaded) before the next chunk's loads, whose indices depend
        // on them through pc.zero. A wait on a load result can otherwise also wait for loads
        // issued after it (NVIDIA's scoreboards), and the current chunk would wait on the next.
        uvec4 codes[R];
        float am[R];
        uint fold = 0u;
        [[unroll]] for (uint r = 0u; r < R; ++r) {
          codes[r] = next_codes[r];
          am[r] = absmax_from(next_q[r], next_s[r]);
          if (ORDERED) fold ^= codes[r].x ^ floatBitsToUint(am[r]);
        }
        const bool x_held = ORDERED && MM == 1u && XS_UNITS == 0u;
        uvec4 xq[x_held ? XU : 1u];
        [[unroll]] for (uint u = 0u; u < (x_held ? XU : 1u); ++u) {
          xq[u] = uvec4(0u);
          if (x_held && col0 < pc.k) {
            xq[u] = x_vecs[x_unit(col0) + u];
            fold ^= xq[u].x;
          }
        }
        const uint after = fold & pc.zero;
        const uint col1 = col0 + 1024u;
        [[unroll]] for (uint r = 0u; r < R; ++r) {
          if (row_live[r] && col1 < pc.k && i + 1u < span) {
            uint e = row_first[r] + col1 + after;
            next_codes[r] = packed_vecs[(pc.packed_off >> 2) + (e >> 5)];
            absmax_raw(e >> pc.log2_bs, next_q[r], next_s[r]);
          }
        }
        if (col0 < pc.k) {
          // tree((w0 + w1) + (w2 + w3)) built as the words come.
          float half_[RM], left[RM];
          [[unroll]] for (uint w = 0u; w < 4u; ++w) {
            float wt[R][8];
            [[unroll]] for (uint r = 0u; r < R; ++r) decode8(codes[r][w], am[r], rep, wt[r]);
            [[unroll]] for (uint j = 0u; j < MM; ++j) {
              float xv[8];
              if (j < pc.m) {
                if (x_held) x_from_units(xq[XD == 2u ? 2u * w : w], xq[XD == 2u ? 2u * w + 1u : 0u], xv);
                else if (XS_UNITS > 0u) x_staged8(j, chunks, c, lane, w, xv);
                else x_vector8(j, col0 + 8u * w, xv);
              } else {
                [[unroll]] for (uint e = 0u; e < 8u; ++e) xv[e] = 0.0;
              }
              [[unroll]] for (uint r = 0u; r < R; ++r) {
                float p[8];
                [[unroll]] for (uint e = 0u; e < 8u; ++e) {
                  precise float prod = wt[r][e] * xv[e];
                  p[e] = prod;
                }
                float t = tree8(p);
                const uint v = r * MM + j;
                if ((w & 1u) == 0u) {
                  half_[v] = t;
                } else if (w == 1u) {
                  precise float l = half_[v] + t;
                  left[v] = l;
                } else {
                  precise float h = half_[v] + t;
                  precise float s = left[v] + h;
                  node[v] = s;
                }
              }
            }
          }
        }
      } else {
        // Element by element: any k, any alignment, blocks straddling rows.
        [[unroll]] for (uint r = 0u; r < R; ++r) {
          if (!row_live[r] || col0 >= pc.k) continue;
          float half_[MM], left[MM];
          // A lane's 32 leaves touch at most two quantization blocks (blocksize >= 32).
          const uint e_first = row_first[r] + col0;
          const uint e_last = row_first[r] + min(col0 + 31u, pc.k - 1u);
          const uint b_first = e_first >> pc.log2_bs, b_last = e_last >> pc.log2_bs;
          const float am_first = block_absmax(b_first);
          const float am_last = b_last != b_first ? block_absmax(b_last) : am_first;
          for (uint w = 0u; w < 4u; ++w) {
            float wt[8];
            const uint e0 = e_first + 8u * w;
            const bool whole = (e0 & 7u) == 0u && col0 + 8u * w + 8u <= pc.k;
            // A whole, aligned group of 8 codes is one word (EB is a multiple of 8).
            const uint word = whole ? packed_words[pc.packed_off + (e0 >> 3)] : 0u;
            [[unroll]] for (uint e = 0u; e < 8u; ++e) {
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
            [[unroll]] for (uint j = 0u; j < MM; ++j) {
              if (j >= pc.m) continue;
              float p[8];
              [[unroll]] for (uint e = 0u; e < 8u; ++e) {
                uint col = col0 + 8u * w + e;
                if (col < pc.k) {
                  precise float prod = wt[e] * x_value(j, col);
                  p[e] = prod;
                } else {
                  p[e] = pad;
                }
              }
              float t = tree8(p);
              if ((w & 1u) == 0u) {
                half_[j] = t;
              } else if (w == 1u) {
                precise float l = half_[j] + t;
                left[j] = l;
              } else {
                precise float h = half_[j] + t;
                precise float s = left[j] + h;
                node[r * MM + j] = s;
              }
            }
          }
        }
      }

      // The levels above the lanes (uniform control flow here). Lane L ends with value my_v.
      float v = pad;
      if (G == 1u) {
        uint lv = 0u;
        [[unroll]] for (uint cnt = RM; cnt > 1u; cnt >>= 1) {
          const bool upper = ((lane >> lv) & 1u) != 0u;
          [[unroll]] for (uint q = 0u; q < cnt / 2u; ++q) {
            const float keep = upper ? node[q + cnt / 2u] : node[q];
            const float send = upper ? node[q] : node[q + cnt / 2u];
            precise float s = keep + subgroupShuffleXor(send, 1u << lv);
            node[q] = s;
          }
          ++lv;
        }
        for (; lv < 5u; ++lv) {
          precise float s = node[0] + subgroupShuffleXor(node[0], 1u << lv);
          node[0] = s;
        }
        v = node[0];
      } else {
        [[unroll]] for (uint lv = 0u; lv < SHUF_LEVELS; ++lv)
          [[unroll]] for (uint q = 0u; q < RM; ++q) {
            precise float s = node[q] + subgroupShuffleXor(node[q], 1u << lv);
            node[q] = s;
          }
        // The remaining log2(G) levels: the first lane of each group of 2^SHUF_LEVELS (which hold
        // the same node) stores it; lane q then reduces value q's G nodes in place, level by
        // level. Double-buffered by chunk parity: one barrier per chunk.
        const uint buf = (i & 1u) * TEAMS * RM * G;
        if ((lane & ((1u << SHUF_LEVELS) - 1u)) == 0u)
          [[unroll]] for (uint q = 0u; q < RM; ++q) red_s[buf + (team * RM + q) * G + (lane >> SHUF_LEVELS)] = node[q];
        barrier();
        if (lane < RM) {
          const uint base = buf + (team * RM + lane) * G;
          for (uint width = G >> 1; width >= 1u; width >>= 1)
            for (uint q = 0u; q < width; ++q) {
              precise float s = red_s[base + 2u * q] + red_s[base + 2u * q + 1u];
              red_s[base + q] = s;
            }
          v = red_s[base];
        }
      }
      if (c >= chunks) v = pad;  // a chunk of padding leaves only
      if (lane < RM) push_node(stack_base, done, v);
      ++done;
    }
    // The part's chunks past the last: nodes of pad leaves only, i.e. pad.
    if (lane < RM)
      for (; done < span; ++done) push_node(stack_base, done, pad);

    // The parts' roots, added by part 0 in tree order (pairs (0, 1), (2, 3), ..., then pairs of
    // those): the levels of the chunk tree above the parts. Lane L of every part holds the same
    // value index, so part 0's lane L reads the parts' lane L stacks.
    if (SPLIT > 1u) {
      barrier();
      if (part == 0u && lane < RM)
        [[unroll]] for (uint w = 1u; w < SPLIT; w <<= 1)
          [[unroll]] for (uint q = 0u; q < SPLIT; q += 2u * w) {
            precise float s = stack_s[stack_base + q * RM * STACK_DEPTH + top] + stack_s[stack_base + (q + w) * RM * STACK_DEPTH + top];
            stack_s[stack_base + q * RM * STACK_DEPTH + top] = s;
          }
    }

    // Lane L of part 0 holds Y[j_out, row r_out]'s bits (value my_v = r_out * MM + j_out).
    const bool mine = part == 0u && lane < RM && row_live[min(r_out, R - 1u)] && j_out < pc.m;
    uint bits = lane < RM ? out_bits(stack_s[stack_base + top]) : 0u;
    const uint row_global = pc.row0 + row_base + r_out;
    if (y_dtype() == 2u) {
      if (mine) y_words[pc.y_off + j_out * pc.n + row_global] = bits;
    } else if ((R & 1u) == 0u && (pc.n & 1u) == 0u && (pc.row0 & 1u) == 0u) {
      // Rows 2p and 2p + 1 (global rows 2q, 2q + 1: y indices j * n + 2q, + 1 share a word):
      // the even row's lane writes the word.
      if (lane < RM) out_s[team * RM + my_v] = bits;
      barrier();
      if (mine && (r_out & 1u) == 0u) {
        const bool pair_live = row_live[min(r_out + 1u, R - 1u)];
        const uint yi = j_out * pc.n + row_global;
        if (pair_live) {
          y_words[pc.y_off + (yi >> 1)] = bits | (out_s[team * RM + my_v + MM] << 16);
        } else {
          atomicAnd(y_words[pc.y_off + (yi >> 1)], 0xffff0000u);
          atomicOr(y_words[pc.y_off + (yi >> 1)], bits);
        }
      }
    } else if (mine) {
      uint yi = j_out * pc.n + row_global;
      uint word = pc.y_off + (yi >> 1);
      uint shift = (yi & 1u) << 4;
      atomicAnd(y_words[word], ~(0xffffu << shift));
      atomicOr(y_words[word], bits << shift);
    }
    // The next slot reuses the stacks, the reduction buffers and out_s.
    barrier();
  }
}
