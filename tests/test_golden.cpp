// SPDX-License-Identifier: MIT
// The oracle against bitsandbytes' own output: every golden case, every output dtype, bit for bit.
#include <doctest/doctest.h>

#include <vector>

#include "backends/cpu/oracle.h"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"

using namespace nf4;

TEST_CASE("golden file holds the 116 bitsandbytes cases with expected outputs") {
  const auto& cases = test::golden_cases();
  CHECK(cases.size() == 116);
  for (const auto& c : cases)
    for (int d = 0; d < 3; ++d) CHECK_MESSAGE(c.expected[d] != nullptr, c.case_name);
}

TEST_CASE("oracle reproduces bitsandbytes bit for bit on every golden case") {
  const auto& f = test::golden_file();
  std::int64_t compared = 0;
  for (const auto& c : test::golden_cases()) {
    for (nf4_dtype d : test::kDTypes) {
      const io::TensorInfo* exp = c.expected[d];
      REQUIRE(exp != nullptr);
      std::vector<std::uint8_t> out(exp->bytes(), 0xAB);  // poisoned
      cpu::oracle_dequantize(io::describe(f, c.param, d, out.data(), static_cast<std::int64_t>(out.size())));
      const auto diff = test::differing_elements(out.data(), f.data(*exp), c.param.numel, d);
      CHECK_MESSAGE(diff == 0, c.case_name << " " << test::dtype_label(d) << ": " << diff << " elements differ");
      compared += c.param.numel;
    }
  }
  CHECK(compared > 0);
}

TEST_CASE("golden nested code table matches the quantizer's dynamic map") {
  const auto& f = test::golden_file();
  const auto map = cpu::dynamic_code_map();
  REQUIRE(map.size() == 256);
  for (const auto& c : test::golden_cases()) {
    if (!c.param.state.nested) continue;
    const auto* stored = reinterpret_cast<const float*>(f.data(*c.param.nested_quant_map));
    int exact = 0;
    for (int i = 0; i < 256; ++i) {
      CHECK(stored[i] == doctest::Approx(map[i]).epsilon(1e-6));
      exact += stored[i] == map[i];
    }
    MESSAGE("dynamic map entries equal to bitsandbytes' bit for bit: " << exact << "/256");
    break;
  }
}

TEST_CASE("golden quant_map matches the built-in tables") {
  const auto& f = test::golden_file();
  for (const auto& c : test::golden_cases()) {
    const auto* stored = reinterpret_cast<const float*>(f.data(*c.param.quant_map));
    const auto table = cpu::saved_quant_map(c.param.state.quant_type);
    for (int q = 0; q < 16; ++q) CHECK_MESSAGE(stored[q] == table[q], c.case_name << " code " << q);
  }
}
