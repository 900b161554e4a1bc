// SPDX-License-Identifier: MIT
// The proof behind a hardware conversion to 16 bits: compares it with the integer rounding
// (core/half.h's) in the form the kernels use it (two run-time floats packed into one word).
//   - fp16 (dequantize.comp's and gemv_coop.comp's HWF16): packHalf2x16 against f16_from_bits;
//   - bf16 (built with -DBF16=1, gemv_coop.comp's HWBF16): the conversion to a 16-bit float vector
//     (OpFConvert) packed by packFloat2x16, in a module the host retypes to bfloat16 as it does
//     gemv_coop's (vk_kernels.cpp, with_bfloat16), against bf16_from_bits.
// The host runs it over all 2^32 fp32 bit patterns once per device and driver
// (Kernels::prepare_f16_check) and uses the hardware conversion only when no non-NaN input
// differs. NaN inputs are not compared: the kernels convert with it only units whose absmax and
// values are finite, whose products cannot be NaN.
#version 450
#extension GL_GOOGLE_include_directive : require
#if BF16
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

#include "format.glsl"

#define PER_INVOCATION 64u
layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint first_group;  // this dispatch's first workgroup; a workgroup covers 256 * 64 indices
  uint stride;       // input bits = index * stride: 1 = every pattern; odd > 1 = a sample (tests only)
} pc;

layout(std430, set = 0, binding = 0) buffer Result {
  uint mismatches;      // non-NaN inputs where the hardware conversion differs from the integer one
  uint first_mismatch;  // the smallest of them (the host sets 0xffffffff)
  uint groups_done;     // workgroups that ran to their end: the host checks every one did
  uint unused;
} r;

#if BF16
uint hardware_pair(float a, float b) { return packFloat2x16(f16vec2(a, b)); }
uint integer_rounding(uint bits) { return bf16_from_bits(bits); }
#else
uint hardware_pair(float a, float b) { return packHalf2x16(vec2(a, b)); }
uint integer_rounding(uint bits) { return f16_from_bits(bits); }
#endif

bool differs(uint bits, uint hw) { return (bits & 0x7fffffffu) <= 0x7f800000u && hw != integer_rounding(bits); }

void main() {
  const uint first = ((pc.first_group + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x) * PER_INVOCATION;
  uint bad = 0u, first_bad = 0xffffffffu;
  for (uint i = 0u; i < PER_INVOCATION; i += 2u) {
    const uint b0 = (first + i) * pc.stride, b1 = (first + i + 1u) * pc.stride;
    const uint hw = hardware_pair(uintBitsToFloat(b0), uintBitsToFloat(b1));
    if (differs(b0, hw & 0xffffu)) { ++bad; first_bad = min(first_bad, b0); }
    if (differs(b1, hw >> 16)) { ++bad; first_bad = min(first_bad, b1); }
  }
  if (bad != 0u) {
    atomicAdd(r.mismatches, bad);
    atomicMin(r.first_mismatch, first_bad);
  }
  barrier();  // every invocation of the workgroup got here
  if (gl_LocalInvocationID.x == 0u) atomicAdd(r.groups_done, 1u);
}
