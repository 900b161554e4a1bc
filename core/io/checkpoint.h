// SPDX-License-Identifier: MIT
// bitsandbytes 4-bit parameters inside a transformers checkpoint (DESIGN.md section 1): each
// quantized parameter `p` is found by its `p.quant_state.bitsandbytes__nf4|fp4` key; its JSON
// quant state and companion tensors (`p.absmax`, `p.quant_map`, `p.nested_absmax`,
// `p.nested_quant_map`) are checked against each other before anything is dequantized.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/io/safetensors.h"
#include "nf4/nf4.h"

namespace nf4::io {

struct QuantState {
  nf4_quant_type quant_type = NF4_QUANT_NF4;
  int blocksize = 64;
  std::string dtype;                 // the original dtype, e.g. "bfloat16"
  std::vector<std::int64_t> shape;   // the original shape
  bool nested = false;
  int nested_blocksize = 0;
  float nested_offset = 0.0f;        // JSON number parsed as double, rounded to float
};

// Parses a quant-state JSON text; throws nf4::Error(NF4_ERR_FORMAT) naming the bad field.
QuantState parse_quant_state(std::string_view json_text);

// Maps "bfloat16" / "float16" / "float32" (and torch.* spellings) to an output dtype.
bool parse_torch_dtype(std::string_view name, nf4_dtype* out);

struct QuantizedParam {
  std::string name;  // the parameter, e.g. "model.layers.0.mlp.up_proj.weight"
  QuantState state;
  std::int64_t numel = 0;
  const TensorInfo* weight = nullptr;
  const TensorInfo* absmax = nullptr;
  const TensorInfo* quant_map = nullptr;
  const TensorInfo* nested_absmax = nullptr;     // nested only
  const TensorInfo* nested_quant_map = nullptr;  // nested only
  const TensorInfo* quant_state = nullptr;
  // Every tensor name that belongs to this parameter (dropped from a dense copy).
  std::vector<std::string> companion_names() const;
};

// All quantized parameters of a file, in file order, each fully validated (dtypes, sizes and the
// quant state agree). Throws nf4::Error(NF4_ERR_FORMAT) naming the parameter otherwise.
std::vector<QuantizedParam> find_quantized_params(const SafetensorsFile& file);

// The nf4_tensor for a parameter: host pointers into the file's mapping.
nf4_tensor describe(const SafetensorsFile& file, const QuantizedParam& p, nf4_dtype out_dtype, void* out,
                    std::int64_t out_bytes);

}  // namespace nf4::io
