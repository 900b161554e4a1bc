// SPDX-License-Identifier: MIT
// The output dtypes and the quant types, each described once as a list (an X-macro) from which
// everything that needs a case per row is expanded: the tables below (names, parsers, messages,
// sizes, the tests' loops, the Vulkan variant list), the dispatch helpers (a run-time value to a
// compile-time one, for the kernels), the element codecs' checks (core/dtype.h) and the GLSL
// generator (shaders/gen_format_glsl.cpp). A row's compile-time uses are checked where they are
// instantiated: a dtype without its codec does not build, a dispatch over a list that misses an
// enumerator of the C enum does not build (-Werror=switch). docs/DESIGN.md section 3.4 lists what
// else a new row needs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/format.h"
#include "nf4/nf4.h"

// X(value, name, torch_name, aliases, enum_name, safetensors_name, size, product): the output
// dtypes. A row and its codec (core/dtype.h, and nf4_encode_<enum_name> in shaders/format.glsl)
// are all a dtype needs.
//   name              the CLI's spelling ("fp16")
//   torch_name        PyTorch's, also accepted ("float16"; "torch.float16" too)
//   aliases           other spellings a checkpoint's quant state may use, space-separated
//   enum_name         the C enum's suffix (messages: "F16 (0)"; the shaders' NF4_DTYPE_<enum_name>)
//   safetensors_name  the dtype string of a safetensors header
//   size              bytes per element: every store, unit width and byte count derives from it
//   product           1: the fused product (nf4_gemv) takes x and y in it. Its kernels load x in
//                     16-byte units of 8 or 4 elements, so only rows of 2 or 4 bytes can say 1;
//                     nf4_gemv refuses x or y in a row that says 0 (NF4_ERR_DTYPE).
#define NF4_DTYPES(X)                                                         \
  X(NF4_DTYPE_F16, "fp16", "float16", "half f16", "F16", "F16", 2, 1)         \
  X(NF4_DTYPE_BF16, "bf16", "bfloat16", "", "BF16", "BF16", 2, 1)             \
  X(NF4_DTYPE_F32, "fp32", "float32", "float f32", "F32", "F32", 4, 1)

// X(value, name, enum_name, builtin_values): the quant types. A code q of every quant type decodes
// to values[q] times its block's absmax, where values is a 16-entry table: builtin_values (a
// table of core/format.h), or, where that is nullptr, the quant_map stored with the data (then
// required). That is all a kernel knows of a quant type; a type that needs more than a 16-entry
// table (none today) would need it written here and in every kernel.
//   name       bitsandbytes' spelling ("nf4"; the quant-state key suffix "bitsandbytes__nf4")
//   enum_name  the C enum's suffix (messages: "NF4 (0)")
#define NF4_QUANT_TYPES(X)                    \
  X(NF4_QUANT_NF4, "nf4", "NF4", nullptr)     \
  X(NF4_QUANT_FP4, "fp4", "FP4", nf4::format::kFp4Values.data())

namespace nf4 {

struct DtypeInfo {
  nf4_dtype dtype;
  std::string_view name;
  std::string_view torch_name;
  std::string_view aliases;
  std::string_view enum_name;
  std::string_view safetensors_name;
  std::size_t size;
  bool product;  // the fused product takes x and y in it
};

inline constexpr DtypeInfo kDtypes[] = {
#define NF4_X(value, name, torch_name, aliases, enum_name, st_name, size, product) \
  {value, name, torch_name, aliases, enum_name, st_name, size, product != 0},
    NF4_DTYPES(NF4_X)
#undef NF4_X
};

struct QuantTypeInfo {
  nf4_quant_type quant_type;
  std::string_view name;
  std::string_view enum_name;
  const float* builtin_values;  // 16 entries, or nullptr: the stored quant_map
  constexpr bool stored_table() const { return builtin_values == nullptr; }
};

inline constexpr QuantTypeInfo kQuantTypes[] = {
#define NF4_X(value, name, enum_name, builtin) {value, name, enum_name, builtin},
    NF4_QUANT_TYPES(NF4_X)
#undef NF4_X
};

// The rows' values are what C callers pass; tables indexed by a value (the tests' golden
// expectations, the Vulkan tuning's per-dtype strategies) rely on rows 0, 1, 2, ... in order.
constexpr bool rows_in_value_order() {
  for (std::size_t i = 0; i < std::size(kDtypes); ++i)
    if (static_cast<std::size_t>(kDtypes[i].dtype) != i) return false;
  for (std::size_t i = 0; i < std::size(kQuantTypes); ++i)
    if (static_cast<std::size_t>(kQuantTypes[i].quant_type) != i) return false;
  return true;
}
static_assert(rows_in_value_order(), "rows of NF4_DTYPES / NF4_QUANT_TYPES must be in the order of their enum values, from 0");

// ---- dispatch: a run-time value of a valid row to a compile-time one --------------------------

template <nf4_dtype D>
using DtypeTag = std::integral_constant<nf4_dtype, D>;
template <nf4_quant_type Q>
using QuantTypeTag = std::integral_constant<nf4_quant_type, Q>;

// Stops on a value no row has: the dispatch helpers are only given validated values (the C API
// checks every enum field as its integer, core/tensor.h's enum_bits), so this is a broken
// invariant, never a caller's mistake.
[[noreturn]] NF4_HD inline void unknown_row() {
#if defined(__CUDA_ARCH__)
  __trap();
  __builtin_unreachable();
#else
  __builtin_trap();
#endif
}

// f(DtypeTag<d>{}) for the row of d: the one place that turns a dtype into a template argument.
// The switch has a case per row and no default, so a row missing for an enumerator of nf4_dtype
// fails the build (-Werror=switch), and each row's case instantiates f for that dtype, so a kernel
// or store without that dtype's case fails to build too.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename F>
NF4_HD constexpr decltype(auto) dispatch_dtype(nf4_dtype d, F&& f) {
  switch (d) {
#define NF4_X(value, ...) \
  case value: return f(DtypeTag<value>{});
    NF4_DTYPES(NF4_X)
#undef NF4_X
  }
  unknown_row();
}

// f(DtypeTag<d>{}) for a row the fused product takes (product column 1; core/gemv.cpp refuses the
// others before any backend sees them): the product kernels are instantiated for those rows only.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename F>
NF4_HD constexpr decltype(auto) dispatch_product_dtype(nf4_dtype d, F&& f) {
  switch (d) {
#define NF4_X(value, name, torch_name, aliases, enum_name, st_name, size, product) \
  case value:                                                                     \
    if constexpr ((product) != 0) return f(DtypeTag<value>{});                    \
    break;
    NF4_DTYPES(NF4_X)
#undef NF4_X
  }
  unknown_row();
}

// f(QuantTypeTag<q>{}) for the row of q, as dispatch_dtype.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename F>
NF4_HD constexpr decltype(auto) dispatch_quant_type(nf4_quant_type q, F&& f) {
  switch (q) {
#define NF4_X(value, ...) \
  case value: return f(QuantTypeTag<value>{});
    NF4_QUANT_TYPES(NF4_X)
#undef NF4_X
  }
  unknown_row();
}

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

// The dtypes the fused product takes (product column), in table order.
constexpr std::size_t product_dtype_count() {
  std::size_t n = 0;
  for (const DtypeInfo& d : kDtypes) n += d.product;
  return n;
}
constexpr std::array<nf4_dtype, product_dtype_count()> product_dtypes() {
  std::array<nf4_dtype, product_dtype_count()> a{};
  std::size_t i = 0;
  for (const DtypeInfo& d : kDtypes)
    if (d.product) a[i++] = d.dtype;
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
// Whether `word` is one of the space-separated words of `list`.
constexpr bool among_words(std::string_view list, std::string_view word) {
  while (!list.empty()) {
    const std::size_t end = list.find(' ');
    if (list.substr(0, end) == word && !word.empty()) return true;
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return false;
}
// By name: a dtype's name or torch_name ("torch." prefix allowed), a quant type's name.
constexpr const DtypeInfo* find_dtype(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (const DtypeInfo& d : kDtypes)
    if (name == d.name || name == d.torch_name) return &d;
  return nullptr;
}
// As find_dtype(name), also accepting a row's aliases: the spellings of a checkpoint's quant state.
constexpr const DtypeInfo* find_dtype_or_alias(std::string_view name) {
  if (const DtypeInfo* d = find_dtype(name)) return d;
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (const DtypeInfo& d : kDtypes)
    if (among_words(d.aliases, name)) return &d;
  return nullptr;
}
// The dtype of a row by its safetensors_name ("BF16"), or nullptr.
constexpr const DtypeInfo* find_dtype_safetensors(std::string_view name) {
  for (const DtypeInfo& d : kDtypes)
    if (name == d.safetensors_name) return &d;
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
// Whether a (valid) quant type decodes through the stored quant_map (QuantTypeInfo::stored_table()).
constexpr bool uses_quant_map(nf4_quant_type q) {
  const QuantTypeInfo* i = find_quant_type(static_cast<std::int32_t>(q));
  return i && i->stored_table();
}
// The row of a valid dtype (validated before: core/tensor.h).
constexpr const DtypeInfo& dtype_info(nf4_dtype d) {
  const DtypeInfo* i = find_dtype(static_cast<std::int32_t>(d));
  if (!i) unknown_row();
  return *i;
}
constexpr std::size_t dtype_size(nf4_dtype d) { return dtype_info(d).size; }

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

// "NF4 (0) or FP4 (1)", "F16 (0), BF16 (1) or F32 (2)": a table's enum values for a message.
template <typename Table>
std::string enum_choices(const Table& table) {
  std::string s;
  const std::size_t n = std::size(table);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) s += i + 1 == n ? " or " : ", ";
    s += std::string(table[i].enum_name) + " (" + std::to_string(i) + ")";
  }
  return s;
}
inline std::string quant_type_choices() { return enum_choices(kQuantTypes); }
inline std::string dtype_choices() { return enum_choices(kDtypes); }
// The same for the rows the fused product takes ("F16 (0), BF16 (1) or F32 (2)").
inline std::string product_dtype_choices() {
  std::string s;
  std::size_t n = 0, i = 0;
  for (const DtypeInfo& d : kDtypes) n += d.product;
  for (const DtypeInfo& d : kDtypes) {
    if (!d.product) continue;
    if (i > 0) s += i + 1 == n ? " or " : ", ";
    s += std::string(d.enum_name) + " (" + std::to_string(static_cast<int>(d.dtype)) + ")";
    ++i;
  }
  return s;
}

}  // namespace nf4
