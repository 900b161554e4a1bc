// SPDX-License-Identifier: MIT
// A CPU quantizer that produces bitsandbytes-compatible 4-bit data (NF4 / FP4, flat or nested
// absmax) from fp32 / fp16 / bf16 input, so tests and benchmarks can make realistic weights of any
// size. "Compatible": bitsandbytes dequantizes the result correctly (same layout, tables and
// statistics). It follows bitsandbytes' algorithm (absmax per block, nearest code; nested: mean
// offset, 8-bit dynamic code over blocks of absmax) but is not guaranteed to pick the same code
// as bitsandbytes' quantizer at exact ties between two codes.
#pragma once

#include <cstdint>
#include <vector>

#include "nf4/nf4.h"

namespace nf4::cpu {

struct QuantizeOptions {
  nf4_quant_type quant_type = NF4_QUANT_NF4;
  int blocksize = 64;
  bool nested = true;
  int nested_blocksize = 256;
};

struct QuantizedWeight {
  nf4_quant_type quant_type = NF4_QUANT_NF4;
  std::int64_t numel = 0;
  int blocksize = 64;
  bool nested = false;
  int nested_blocksize = 256;
  std::vector<std::uint8_t> packed;
  std::vector<float> absmax_f32;        // flat
  std::vector<std::uint8_t> absmax_u8;  // nested
  std::vector<float> quant_map;         // 16 entries (the saved table; FP4's has +0 for code 8)
  std::vector<float> nested_absmax;
  std::vector<float> nested_code;       // 256 entries
  float nested_offset = 0.0f;

  // A description pointing at this weight's host buffers (valid while it lives).
  nf4_tensor describe(nf4_dtype out_dtype, void* out = nullptr, std::int64_t out_bytes = 0) const;
};

QuantizedWeight quantize(const float* x, std::int64_t n, const QuantizeOptions& options);
// fp16 / bf16 input as raw 16-bit patterns.
QuantizedWeight quantize_f16(const std::uint16_t* x, std::int64_t n, const QuantizeOptions& options);
QuantizedWeight quantize_bf16(const std::uint16_t* x, std::int64_t n, const QuantizeOptions& options);

// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)), used for nested absmax.
std::vector<float> dynamic_code_map();
// The quant_map bitsandbytes saves for the type.
std::vector<float> saved_quant_map(nf4_quant_type type);

// Deterministic pseudo-random normal samples (tests, benchmarks).
std::vector<float> random_normal(std::int64_t n, std::uint64_t seed, float scale = 1.0f);

}  // namespace nf4::cpu
