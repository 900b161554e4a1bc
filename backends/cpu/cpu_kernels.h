// SPDX-License-Identifier: MIT
// The cpu backend's kernels: the oracle's arithmetic (docs/DESIGN.md section 2, one IEEE single
// operation per fl32, never an FMA) on vectors. fp16 is rounded by F16C's vcvtps2ph with an
// explicit round-to-nearest-even immediate, bf16 by the integer rounding of core/half.h on vector
// lanes; tests/test_cpu_backend.cpp proves both equal to core/half.h on all 2^32 fp32 inputs,
// NaNs included, and each path equal to the oracle on whole tensors.
//
// The instruction set is chosen at run time (__builtin_cpu_supports; per-function target
// attributes), so one binary runs on any x86-64 and on other architectures (scalar path).
#pragma once

#include <cstddef>
#include <cstdint>

#include "nf4/nf4.h"

namespace nf4::cpu {

enum class Isa {
  scalar,  // core/half.h per element
  avx2,    // AVX2 + F16C, 8 lanes
  avx512,  // AVX-512 F + BW + VL, 16 lanes
};

const char* isa_name(Isa isa);
// Whether this CPU (and its OS) runs `isa`'s path.
bool isa_supported(Isa isa);
// The widest supported path.
Isa best_isa();

// out[i] = the fp16 / bf16 bits of in[i], round to nearest even, exactly as f16_from_float /
// bf16_from_float. `isa` must be supported.
void convert_f16(Isa isa, const float* in, std::uint16_t* out, std::size_t n);
void convert_bf16(Isa isa, const float* in, std::uint16_t* out, std::size_t n);

// Writes out[i] for i in [first, first + count) exactly as oracle_dequantize_range does (host
// pointers; tensor already validated). `isa` must be supported. On x86 the SSE control register
// is set to IEEE defaults (round to nearest, no flush-to-zero, no denormals-are-zero) for the
// call and restored afterwards, so a caller built with fast math still gets the contract's bits.
void dequantize_range(Isa isa, const nf4_tensor& t, std::int64_t first, std::int64_t count);

}  // namespace nf4::cpu
