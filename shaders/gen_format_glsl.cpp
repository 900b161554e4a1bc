// SPDX-License-Identifier: MIT
// Build-time generator of shaders' format include (nf4_format_tables.glsl) from core/format.h, so the
// GLSL tables are never a hand-typed copy: floats are emitted as exact bit patterns, and the
// nibble order is derived from format::code_of (checked at compile time below).
#include <cstdio>
#include <cstring>

#include "core/format.h"

namespace {

static_assert(nf4::format::code_of(0xAB, false) == 0xA && nf4::format::code_of(0xAB, true) == 0xB,
              "the shaders assume element 2j is the high nibble of byte j");

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
  // bitsandbytes' device FP4 table, codes 0..15, as format::fp4_value computes it (code 8 is -0).
  std::fprintf(f, "const uint NF4_FP4_VALUE_BITS[16] = uint[16](");
  for (unsigned q = 0; q < 16; ++q) std::fprintf(f, "%s0x%08xu", q ? ", " : "", bits(fmt::fp4_value(q)));
  std::fprintf(f, ");\n");
  std::fprintf(f, "const uint NF4_NF4_TABLE_BITS[16] = uint[16](");
  for (unsigned q = 0; q < 16; ++q) std::fprintf(f, "%s0x%08xu", q ? ", " : "", bits(fmt::kNf4Table[q]));
  std::fprintf(f, ");\n\n#endif\n");
  return std::fclose(f) == 0 ? 0 : 1;
}
