// SPDX-License-Identifier: MIT
// The CPU oracle: docs/DESIGN.md section 2 to the letter. Every other backend must match it bit for
// bit. Compiled with -ffp-contract=off and never with fast-math, so each fl32() below is exactly
// one correctly rounded IEEE single-precision operation.
//
// Subnormals: computed per IEEE (no flush to zero), on every backend. bitsandbytes is built with
// fast math and flushes fp32 subnormals; this only differs for absmax values below ~1.2e-38.
#pragma once

#include <cstdint>

#include "nf4/nf4.h"

namespace nf4::cpu {

// absmax value of block b (host pointers; tensor already validated).
float oracle_absmax(const nf4_tensor& t, std::int64_t block);

// Element i of the tensor in fp32 (fl32(value * absmax), what out_dtype F32 holds); `values` from
// value_table(t) (host pointers; tensor already validated).
float oracle_weight(const nf4_tensor& t, const float values[16], std::int64_t i);
// Writes out[i] for i in [first, first + count) (host pointers; tensor already validated).
void oracle_dequantize_range(const nf4_tensor& t, std::int64_t first, std::int64_t count);

// Validates, then dequantizes the whole tensor. Throws nf4::Error on bad input.
void oracle_dequantize(const nf4_tensor& t);

}  // namespace nf4::cpu
