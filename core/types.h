// SPDX-License-Identifier: MIT
// The output dtypes and the quant types, each described once. The C API (nf4_dtype_size), the
// CLI's parsers and help texts, and the tests loop over these tables instead of spelling the sets
// out. Adding a dtype or a quant type takes a row here and more: docs/DESIGN.md section 3.4 lists
// every file to touch (README.md lists the same; the backends' own dtype switches fail on a dtype
// they do not know).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "nf4/nf4.h"

namespace nf4 {

struct DtypeInfo {
  nf4_dtype dtype;
  std::string_view name;        // the CLI's spelling: "fp16"
  std::string_view torch_name;  // PyTorch's, also accepted: "float16"
  std::size_t size;             // bytes per element
};

inline constexpr DtypeInfo kDtypes[] = {
    {NF4_DTYPE_F16, "fp16", "float16", 2},
    {NF4_DTYPE_BF16, "bf16", "bfloat16", 2},
    {NF4_DTYPE_F32, "fp32", "float32", 4},
};

struct QuantTypeInfo {
  nf4_quant_type quant_type;
  std::string_view name;      // bitsandbytes' spelling: "nf4"
  std::string_view enum_name;  // the C enum's: "NF4" (messages)
  // Codes decode through the checkpoint's stored 16-entry table (quant_map, required); otherwise
  // through a table built into the format (core/format.h), and quant_map is not read.
  bool stored_table;
};

inline constexpr QuantTypeInfo kQuantTypes[] = {
    {NF4_QUANT_NF4, "nf4", "NF4", true},
    {NF4_QUANT_FP4, "fp4", "FP4", false},
};

// Every dtype / quant type of the tables, in table order (defaults and loops over all of them).
constexpr std::array<nf4_dtype, std::size(kDtypes)> all_dtypes() {
  std::array<nf4_dtype, std::size(kDtypes)> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = kDtypes[i].dtype;
  return a;
}
constexpr std::array<nf4_quant_type, std::size(kQuantTypes)> all_quant_types() {
  std::array<nf4_quant_type, std::size(kQuantTypes)> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = kQuantTypes[i].quant_type;
  return a;
}

// The row of a dtype / quant type given as its integer representation (a C caller may pass any
// int, see enum_bits in core/tensor.h), or nullptr.
constexpr const DtypeInfo* find_dtype(std::int32_t bits) {
  for (const DtypeInfo& d : kDtypes)
    if (static_cast<std::int32_t>(d.dtype) == bits) return &d;
  return nullptr;
}
constexpr const QuantTypeInfo* find_quant_type(std::int32_t bits) {
  for (const QuantTypeInfo& q : kQuantTypes)
    if (static_cast<std::int32_t>(q.quant_type) == bits) return &q;
  return nullptr;
}
// By name: a dtype's name or torch_name ("torch." prefix allowed), a quant type's name.
constexpr const DtypeInfo* find_dtype(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (const DtypeInfo& d : kDtypes)
    if (name == d.name || name == d.torch_name) return &d;
  return nullptr;
}
constexpr const QuantTypeInfo* find_quant_type(std::string_view name) {
  for (const QuantTypeInfo& q : kQuantTypes)
    if (name == q.name) return &q;
  return nullptr;
}

// "fp16" for a known dtype, "?" otherwise.
constexpr std::string_view dtype_name(nf4_dtype d) {
  const DtypeInfo* i = find_dtype(static_cast<std::int32_t>(d));
  return i ? i->name : "?";
}
constexpr std::string_view quant_type_name(nf4_quant_type q) {
  const QuantTypeInfo* i = find_quant_type(static_cast<std::int32_t>(q));
  return i ? i->name : "?";
}
// Whether a (valid) quant type decodes through the stored quant_map (QuantTypeInfo::stored_table).
constexpr bool uses_quant_map(nf4_quant_type q) {
  const QuantTypeInfo* i = find_quant_type(static_cast<std::int32_t>(q));
  return i && i->stored_table;
}

// The names of a table joined for a message or a help text: ("fp16", "bf16", "fp32") with
// separator ", " and last separator " or " gives "fp16, bf16 or fp32".
template <typename Table>
std::string joined_names(const Table& table, std::string_view sep = ", ", std::string_view last = ", ") {
  std::string s;
  std::size_t i = 0;
  const std::size_t n = std::size(table);
  for (const auto& row : table) {
    if (i > 0) s += i + 1 == n ? last : sep;
    s += row.name;
    ++i;
  }
  return s;
}

// "NF4 (0) or FP4 (1)": the quant types for a message.
inline std::string quant_type_choices() {
  std::string s;
  for (std::size_t i = 0; i < std::size(kQuantTypes); ++i) {
    if (i > 0) s += i + 1 == std::size(kQuantTypes) ? " or " : ", ";
    s += std::string(kQuantTypes[i].enum_name) + " (" + std::to_string(static_cast<int>(kQuantTypes[i].quant_type)) + ")";
  }
  return s;
}

}  // namespace nf4
