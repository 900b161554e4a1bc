// SPDX-License-Identifier: MIT
// Build-time generator of shaders' format include (nf4_format_tables.glsl) from core/format.h and
// core/types.h, so the GLSL tables are never a hand-typed copy: floats are emitted as exact bit
// patterns, the nibble order is derived from format::code_of (checked at compile time below), and
// which quant types read the stored quant_map comes from kQuantTypes.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/format.h"
#include "core/types.h"

namespace {

static_assert(nf4::format::code_of(0xAB, false) == 0xA && nf4::format::code_of(0xAB, true) == 0xB,
              "the shaders assume element 2j is the high nibble of byte j");

// Bit q set: quant type q (its nf4_quant_type value) decodes through the stored quant_map.
constexpr unsigned stored_table_quant_types() {
  unsigned mask = 0;
  for (const nf4::QuantTypeInfo& q : nf4::kQuantTypes) {
    if (static_cast<int>(q.quant_type) < 0 || static_cast<int>(q.quant_type) >= 32) throw "a quant type's value must fit a 32-bit mask";
    if (q.stored_table()) mask |= 1u << static_cast<int>(q.quant_type);
  }
  return mask;
}

unsigned bits(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.glsl\n", argv[0]);
    return 2;
  }
  std::FILE* f = std::fopen(argv[1], "w");
  if (!f) {
    std::perror(argv[1]);
    return 1;
  }
  namespace fmt = nf4::format;
  std::fprintf(f, "// Generated from core/format.h by shaders/gen_format_glsl.cpp. Do not edit.\n");
  std::fprintf(f, "#ifndef NF4_FORMAT_GLSL\n#define NF4_FORMAT_GLSL\n\n");
  std::fprintf(f, "const uint NF4_MIN_BLOCKSIZE = %du;\nconst uint NF4_MAX_BLOCKSIZE = %du;\n", fmt::kMinBlocksize,
               fmt::kMaxBlocksize);
  std::fprintf(f, "const uint NF4_QUANT_MAP_SIZE = %du;\nconst uint NF4_NESTED_CODE_SIZE = %du;\n", fmt::kQuantMapSize,
               fmt::kNestedCodeSize);
  // Shift of element e's nibble inside its byte (e even: high nibble).
  std::fprintf(f, "const uint NF4_EVEN_NIBBLE_SHIFT = %uu;\nconst uint NF4_ODD_NIBBLE_SHIFT = %uu;\n\n",
               fmt::code_of(0xF0, false) == 0xF ? 4u : 0u, fmt::code_of(0xF0, true) == 0xF ? 4u : 0u);
  // core/types.h, NF4_QUANT_TYPES: by quant type, whether it reads the stored quant_map
  // (QuantTypeInfo::stored_table()), else its built-in table, as core's value_table does; for a
  // shader compiled for one quant type (QUANT_TYPE) that choice as NF4_STORED_TABLE.
  constexpr std::size_t kQuantTypeCount = std::size(nf4::kQuantTypes);
  std::fprintf(f, "const uint NF4_BUILTIN_VALUE_BITS[%zu][16] = uint[%zu][16](", kQuantTypeCount, kQuantTypeCount);
  for (std::size_t i = 0; i < kQuantTypeCount; ++i) {
    const float* values = nf4::kQuantTypes[i].builtin_values;
    std::fprintf(f, "%suint[16](", i ? ", " : "");
    for (unsigned q = 0; q < 16; ++q) {
      // The shaders take a built-in table's values as finite (no check for inf or NaN per call).
      if (values && !std::isfinite(values[q])) {
        std::fprintf(stderr, "%s: quant type %.*s has a non-finite built-in value\n", argv[0],
                     static_cast<int>(nf4::kQuantTypes[i].name.size()), nf4::kQuantTypes[i].name.data());
        return 1;
      }
      std::fprintf(f, "%s0x%08xu", q ? ", " : "", values ? bits(values[q]) : 0u);
    }
    std::fprintf(f, ")");
  }
  std::fprintf(f, ");  // [quant type][code]; zeros where the quant type reads quant_map\n");
  std::fprintf(f, "#ifdef QUANT_TYPE\n");
  for (std::size_t i = 0; i < kQuantTypeCount; ++i)
    std::fprintf(f, "#%s QUANT_TYPE == %d\n#define NF4_STORED_TABLE %d\n", i == 0 ? "if" : "elif",
                 static_cast<int>(nf4::kQuantTypes[i].quant_type), nf4::kQuantTypes[i].stored_table() ? 1 : 0);
  std::fprintf(f, "#else\n#error \"QUANT_TYPE is no row of NF4_QUANT_TYPES (core/types.h)\"\n#endif\n#endif\n");
  const unsigned stored = stored_table_quant_types();  // at run time: ASan builds cannot compare a global's address in a constant expression
  std::fprintf(f, "const uint NF4_STORED_TABLE_QUANT_TYPES = 0x%xu;  // bit q: quant type q reads quant_map\n", stored);
  // core/types.h, NF4_DTYPES: each row's value (NF4_DTYPE_<enum name>), how many rows the fused
  // product takes (NF4_PRODUCT_DTYPE_COUNT) and, for a shader compiled for one output dtype
  // (OUT_DTYPE), that row's size in bytes (NF4_OUT_SIZE) and its conversion from fp32 bits
  // (NF4_ENCODE_OUT: nf4_encode_<enum name>, the row's codec in shaders/format.glsl, so a row
  // without one stops the shader's compilation); a value that is no row stops it too.
  std::size_t product_rows = 0;
  for (const nf4::DtypeInfo& d : nf4::kDtypes) {
    std::fprintf(f, "#define NF4_DTYPE_%.*s %d\n", static_cast<int>(d.enum_name.size()), d.enum_name.data(), static_cast<int>(d.dtype));
    product_rows += d.product;
  }
  std::fprintf(f, "#define NF4_DTYPE_COUNT %zu\n", std::size(nf4::kDtypes));
  std::fprintf(f, "#define NF4_PRODUCT_DTYPE_COUNT %zu\n", product_rows);
  std::fprintf(f, "#ifdef OUT_DTYPE\n");
  for (std::size_t i = 0; i < std::size(nf4::kDtypes); ++i) {
    const nf4::DtypeInfo& d = nf4::kDtypes[i];
    std::fprintf(f, "#%s OUT_DTYPE == %d\n#define NF4_OUT_SIZE %zu\n#define NF4_ENCODE_OUT(u) nf4_encode_%.*s(u)\n", i == 0 ? "if" : "elif",
                 static_cast<int>(d.dtype), d.size, static_cast<int>(d.enum_name.size()), d.enum_name.data());
  }
  std::fprintf(f, "#else\n#error \"OUT_DTYPE is no row of NF4_DTYPES (core/types.h)\"\n#endif\n#endif\n");
  std::fprintf(f, "\n#endif\n");
  return std::fclose(f) == 0 ? 0 : 1;
}
