// SPDX-License-Identifier: MIT
// The CPU oracle of the fused matrix-vector product: docs/GEMV.md (and nf4.h, nf4_gemv_desc) to the
// letter. Every backend must match it bit for bit. Compiled with -ffp-contract=off and never with
// fast-math, so every product and every addition below is one correctly rounded fp32 operation.
#pragma once

#include <cstdint>

#include "nf4/nf4.h"

namespace nf4::cpu {

// Writes Y[j, r] for every j < m and r in [first_row, first_row + rows) (host pointers, already
// validated), under the contract g.mode names (nf4.h: exact, or the fast contract's sequential sum).
void oracle_gemv_rows(const nf4_gemv_desc& g, std::int64_t first_row, std::int64_t rows);

// Validates, then computes all of Y. Throws nf4::Error on bad input.
void oracle_gemv(const nf4_gemv_desc& g);

// Activation element idx of x (any dtype) as its exact fp32 value.
float gemv_x_value(const void* x, nf4_dtype d, std::int64_t idx);

}  // namespace nf4::cpu
