// SPDX-License-Identifier: MIT
// Faults (docs/RELIABILITY.md): what the library and `nf4 convert` do when the world goes wrong.
// Each case checks a clear error (status / exit code and a message naming the cause), that
// nothing partial is left behind, and that nothing crashes.
//
// Here: C API descriptions that the fuzzers once broke (tests/fuzz/regressions/*, also replayed
// as files by ctest) - enum fields outside their range, an output overlapping the tables.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "nf4/nf4.hpp"
#include "tests/support/common.h"

using namespace nf4;
using nf4::test::contains;

// ---- regressions from fuzzing (tests/fuzz/regressions/*: also replayed as files by ctest) ------

TEST_CASE("faults: enum fields outside their range are rejected (fuzz_capi: enum-out-of-range)") {
  const auto w = test::random_weight(100, NF4_QUANT_NF4, 64, true, 1);
  std::vector<std::uint16_t> out(100, 0x1234);
  // The first value past each list's rows, then values past any list.
  const auto first_bad_dtype = static_cast<std::int32_t>(std::size(kDtypes));
  const auto first_bad_quant_type = static_cast<std::int32_t>(std::size(kQuantTypes));
  for (std::int32_t bad : {first_bad_dtype, first_bad_quant_type, 1000, -1, 16318463, INT32_MIN}) {
    CAPTURE(bad);
    nf4_tensor t = w.describe(NF4_DTYPE_F16, out.data(), 200);
    if (bad >= first_bad_quant_type || bad < 0) {
      std::memcpy(&t.quant_type, &bad, sizeof bad);  // what a C caller can store there
      CHECK(nf4_validate(&t) == NF4_ERR_QUANT_TYPE);
      CHECK(contains(nf4_last_error(nullptr), "quant_type"));
      CHECK(contains(nf4_last_error(nullptr), std::to_string(bad)));
    }
    if (bad >= first_bad_dtype || bad < 0) {
      t = w.describe(NF4_DTYPE_F16, out.data(), 200);
      std::memcpy(&t.out_dtype, &bad, sizeof bad);
      CHECK(nf4_validate(&t) == NF4_ERR_DTYPE);
      CHECK(contains(nf4_last_error(nullptr), "out_dtype"));
      CHECK(contains(nf4_last_error(nullptr), std::to_string(bad)));
    }
  }
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint16_t v) { return v == 0x1234; }));
}

TEST_CASE("faults: an output overlapping quant_map, nested_code or the offset is rejected (fuzz_capi: out-overlaps-nested-code)") {
  const auto w = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 2);
  // One arena holding the tables, with the output placed over each in turn.
  std::vector<float> arena(16 + 256 + 1 + 4000, 0.0f);
  std::memcpy(arena.data(), w.quant_map.data(), 16 * 4);
  std::memcpy(arena.data() + 16, w.nested_code.data(), 256 * 4);
  arena[272] = w.nested_offset;
  Context ctx(NF4_BACKEND_CPU);
  for (std::size_t at : {std::size_t{0}, std::size_t{16}, std::size_t{200}, std::size_t{272}}) {
    CAPTURE(at);
    nf4_tensor t = w.describe(NF4_DTYPE_F32, arena.data() + at, 4000);
    t.quant_map = arena.data();
    t.nested_code = arena.data() + 16;
    t.nested_offset_ptr = arena.data() + 272;
    const std::vector<float> before = arena;
    CHECK(nf4_validate(&t) == NF4_ERR_ALIASING);
    CHECK(contains(nf4_last_error(nullptr), "overlaps"));
    CHECK(nf4_dequantize_host(ctx.get(), &t) == NF4_ERR_ALIASING);
    CHECK(std::memcmp(before.data(), arena.data(), arena.size() * 4) == 0);
  }
  // Placed after all of them, the same description is fine.
  nf4_tensor t = w.describe(NF4_DTYPE_F32, arena.data() + 273, 4000);
  t.quant_map = arena.data();
  t.nested_code = arena.data() + 16;
  t.nested_offset_ptr = arena.data() + 272;
  CHECK(nf4_dequantize_host(ctx.get(), &t) == NF4_OK);
}
