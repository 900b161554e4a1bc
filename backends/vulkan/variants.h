// SPDX-License-Identifier: MIT
// The variants of shaders/dequantize.comp, each compiled to its own SPIR-V module
// (backends/vulkan/CMakeLists.txt): one per output dtype of kDtypes, quant type of kQuantTypes
// (core/types.h), nested or flat absmax and kernel (per-block output table or per-element
// rounding), and for fp16 output the per-element kernel with the hardware conversion. A module's
// name comes from here alone: the pipelines look modules up by it (vk_kernels.cpp), and the
// embedding step (embed_spirv.cpp) fails the build where a variant of the tables has no module or
// a dequantize module is no variant of the tables. Plain C++, no Vulkan: the build-time tool
// includes it too.
#pragma once

#include <string>
#include <vector>

#include "core/types.h"

namespace nf4::vk {

struct DequantizeVariant {
  nf4_dtype dtype = NF4_DTYPE_F16;            // OUT_DTYPE
  nf4_quant_type quant_type = NF4_QUANT_NF4;  // QUANT_TYPE
  bool nested = false;                        // NESTED
  bool table = false;                         // TABLE: the per-block output table, else per element
  bool hw_f16 = false;                        // HWF16: packHalf2x16 (per-element kernel, fp16 only)
};

// "dequantize_t<table>_o<nf4_dtype>_n<nested>_f<nf4_quant_type>", "_h1" appended for hw_f16.
inline std::string module_name(const DequantizeVariant& v) {
  return "dequantize_t" + std::to_string(v.table ? 1 : 0) + "_o" + std::to_string(static_cast<int>(v.dtype)) + "_n" +
         std::to_string(v.nested ? 1 : 0) + "_f" + std::to_string(static_cast<int>(v.quant_type)) + (v.hw_f16 ? "_h1" : "");
}

// Every variant of the tables: what the build must embed.
inline std::vector<DequantizeVariant> dequantize_variants() {
  std::vector<DequantizeVariant> all;
  for (const DtypeInfo& d : kDtypes)
    for (const QuantTypeInfo& q : kQuantTypes)
      for (const bool nested : {false, true}) {
        for (const bool table : {false, true}) all.push_back({d.dtype, q.quant_type, nested, table, false});
        if (d.dtype == NF4_DTYPE_F16) all.push_back({d.dtype, q.quant_type, nested, false, true});
      }
  return all;
}

}  // namespace nf4::vk
