// SPDX-License-Identifier: MIT
// Device-to-device copy in the dequantize kernel's memory shape (UNITS 16-byte vectors per
// invocation at a workgroup stride): the bench's copy ceiling for Vulkan.
#version 450
#extension GL_EXT_control_flow_attributes : require
#define MAX_UNITS 8

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint UNITS = 4u;

layout(push_constant) uniform Params {
  uint n;        // vectors to copy
  uint src_off;  // first vector in binding 0
  uint dst_off;  // first vector in binding 1
} pc;

layout(std430, set = 0, binding = 0) readonly restrict buffer Src { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly restrict buffer Dst { uvec4 dst[]; };

void main() {
  const uint wg = gl_WorkGroupSize.x;
  const uint base = gl_WorkGroupID.x * (wg * UNITS) + gl_LocalInvocationID.x;
  uvec4 v[MAX_UNITS];
  [[unroll]] for (uint k = 0u; k < MAX_UNITS; ++k)
    if (k < UNITS && base + k * wg < pc.n) v[k] = src[pc.src_off + base + k * wg];
  [[unroll]] for (uint k = 0u; k < MAX_UNITS; ++k)
    if (k < UNITS && base + k * wg < pc.n) dst[pc.dst_off + base + k * wg] = v[k];
}
