#version 460 core
// SPDX-License-Identifier: MIT
// The NF4 product on VK_NV_cooperative_matrix2 (lab probe, not part of the build): workgroup-scope
// cooperative matrices, Y[n][m] = dequant(W)[n][k] x X[m][k]^T, W's tile loaded by
// coopMatLoadTensorNV through a decode function (NF4 codes in blocks of 64, high nibble first, the
// absmax per block, each weight rounded to bf16 to nearest even as nf4_dequantize writes it), x
// through a transposing tensor view. -DDENSE: W as dense bf16 instead (the same loop without the
// decode); -DPIPE: the next step's tiles loaded before this step's MulAdd. Tile BM x BN x BK and
// WG invocations by -D; see probe.cpp for the commands.
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable
#extension GL_EXT_shader_explicit_arithmetic_types : enable
#extension GL_EXT_bfloat16 : enable
#extension GL_EXT_buffer_reference : enable
layout(local_size_x = WG) in;
#ifdef DENSE
layout(std430, binding = 0) readonly buffer Weights { bfloat16_t wd[]; };
#else
struct Block64 { uint8_t q[32]; };
layout(std430, binding = 0) readonly buffer Codes { Block64 blocks[]; };
#endif
layout(std430, binding = 1) readonly buffer Absmax { float absmax[]; };
layout(std430, binding = 2) readonly buffer X { bfloat16_t x[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n, k, m; } p;
const float kNF4[16] = float[16](-1.0,-0.6961928009986877,-0.5250730514526367,-0.39491748809814453,-0.28444138169288635,-0.18477343022823334,-0.09105003625154495,0.0,0.07958029955625534,0.16093020141124725,0.24611230194568634,0.33791524171829224,0.44070982933044434,0.5626170039176941,0.7229568362236023,1.0);
#ifndef DENSE
layout(buffer_reference, std430, buffer_reference_align = 1) buffer BlockRef { Block64 b; };
bfloat16_t decode(const in BlockRef r, const in uint32_t blockCoords[2], const in uint32_t coordInBlock[2]) {
  const uint byte = uint(r.b.q[coordInBlock[1] >> 1]);
  const uint q = (coordInBlock[1] & 1u) == 0u ? (byte >> 4) : (byte & 15u);
  const float v = kNF4[q] * absmax[blockCoords[0] * (p.k / 64u) + blockCoords[1]];
  uint u = floatBitsToUint(v);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  return uintBitsToBFloat16EXT(uint16_t(u >> 16));
}
#endif
void main() {
  const uint row0 = gl_WorkGroupID.x * BM, tok0 = gl_WorkGroupID.y * BN;
  coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> C = coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
  tensorLayoutNV<2> tw = createTensorLayoutNV(2);
#ifndef DENSE
  tw = setTensorLayoutBlockSizeNV(tw, 1, 64);
#endif
  tw = setTensorLayoutDimensionNV(tw, p.n, p.k);
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tx = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  tx = setTensorLayoutDimensionNV(tx, p.m, p.k);
  tensorViewNV<2, false, 1, 0> xt = createTensorViewNV(2, false, 1, 0);
#ifdef DENSE
#define LOAD_A(A, k0) coopMatLoadTensorNV(A, wd, 0, sliceTensorLayoutNV(tw, row0, BM, k0, BK))
#else
#define LOAD_A(A, k0) coopMatLoadTensorNV(A, blocks, 0, sliceTensorLayoutNV(tw, row0, BM, k0, BK), decode)
#endif
#define LOAD_B(B, k0) coopMatLoadTensorNV(B, x, 0, sliceTensorLayoutNV(tx, tok0, BN, k0, BK), xt)
  coopmat<bfloat16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> A;
  coopmat<bfloat16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> B;
#ifdef PIPE
  // The next step's tiles loaded before this step's MulAdd (software pipelining).
  LOAD_A(A, 0);
  LOAD_B(B, 0);
  for (uint k0 = BK; k0 < p.k; k0 += BK) {
    coopmat<bfloat16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> A1;
    coopmat<bfloat16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> B1;
    LOAD_A(A1, k0);
    LOAD_B(B1, k0);
    C = coopMatMulAdd(A, B, C);
    A = A1;
    B = B1;
  }
  C = coopMatMulAdd(A, B, C);
#else
  for (uint k0 = 0; k0 < p.k; k0 += BK) {
    LOAD_A(A, k0);
    LOAD_B(B, k0);
    C = coopMatMulAdd(A, B, C);
  }
#endif
  tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> ty = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
  ty = setTensorLayoutDimensionNV(ty, p.n, p.m);
  coopMatStoreTensorNV(C, y, 0, sliceTensorLayoutNV(ty, row0, BM, tok0, BN));
}
