// SPDX-License-Identifier: MIT
// The proof behind the hardware fp16 conversion (dequantize.comp's HWF16 variant): compares
// packHalf2x16 with the integer f16_from_bits (core/half.h's rounding) in the form the kernel uses
// it (two run-time floats packed into one word). The host runs it over all 2^32 fp32 bit patterns
// once per device and driver (Kernels::prepare_f16_check) and uses packHalf2x16 only when no
// non-NaN input differs. NaN inputs are not compared: the kernel converts with packHalf2x16 only
// units whose absmax and values are finite, whose products cannot be NaN.
#version 450
#extension GL_GOOGLE_include_directive : require

#include "format.glsl"

#define PER_INVOCATION 64u
layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint first_group;  // this dispatch's first workgroup; a workgroup covers 256 * 64 indices
  uint stride;       // input bits = index * stride: 1 = every pattern; odd > 1 = a sample (tests only)
} pc;

layout(std430, set = 0, binding = 0) buffer Result {
  uint mismatches;      // non-NaN inputs where packHalf2x16 differs from f16_from_bits
  uint first_mismatch;  // the smallest of them (the host sets 0xffffffff)
  uint groups_done;     // workgroups that ran to their end: the host checks every one did
  uint unused;
} r;

bool differs(uint bits, uint hw) { return (bits & 0x7fffffffu) <= 0x7f800000u && hw != f16_from_bits(bits); }

void main() {
  const uint first = ((pc.first_group + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x) * PER_INVOCATION;
  uint bad = 0u, first_bad = 0xffffffffu;
  for (uint i = 0u; i < PER_INVOCATION; i += 2u) {
    const uint b0 = (first + i) * pc.stride, b1 = (first + i + 1u) * pc.stride;
    const uint hw = packHalf2x16(vec2(uintBitsToFloat(b0), uintBitsToFloat(b1)));
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
