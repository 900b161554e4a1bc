// SPDX-License-Identifier: MIT
// The format lists of core/types.h against what is built from them: every row's codec, names and
// dispatch, and every store of every path writing exactly the row's size per element (an output
// or a product's y), so a store that assumes another width is caught on the dtypes there are.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/gemv_oracle.h"
#include "backends/cpu/oracle.h"
#include "core/dtype.h"
#include "core/gemv.h"
#include "core/tensor.h"
#include "core/types.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/gemv.h"

using namespace nf4;

namespace {

// Which bytes of a buffer of `bytes` (plus a 64-byte tail) `run(out)` writes: run twice, into a
// buffer of zeros and one of 0xff; a byte is written when it differs from the fill in either run
// (no byte equals both fills, so a written zero counts too). Returns the written range as
// [first, end), or {-1, -1} when the written bytes are not one contiguous range.
template <typename Run>
std::pair<std::int64_t, std::int64_t> written_range(std::int64_t bytes, Run&& run) {
  std::vector<std::uint8_t> zeros(static_cast<std::size_t>(bytes) + 64, 0x00), ones(static_cast<std::size_t>(bytes) + 64, 0xff);
  run(zeros.data());
  run(ones.data());
  std::int64_t first = -1, end = -1;
  for (std::int64_t i = 0; i < bytes + 64; ++i) {
    const bool written = zeros[static_cast<std::size_t>(i)] != 0x00 || ones[static_cast<std::size_t>(i)] != 0xff;
    if (!written) continue;
    if (first < 0) first = i;
    else if (end != i) return {-1, -1};
    end = i + 1;
  }
  return {first, end};
}

}  // namespace

TEST_CASE("formats: each dtype row's codec, names and size agree, and the dispatch gives the row's own value") {
  for (const DtypeInfo& d : kDtypes) {
    CAPTURE(std::string(d.name));
    CHECK(nf4_dtype_size(d.dtype) == d.size);
    CHECK(dtype_size(d.dtype) == d.size);
    CHECK(find_dtype(d.name) == &d);
    CHECK(find_dtype(d.torch_name) == &d);
    CHECK(find_dtype(std::string("torch.") + std::string(d.torch_name)) == &d);
    CHECK(find_dtype_safetensors(d.safetensors_name) == &d);
    CHECK(find_dtype_or_alias(d.name) == &d);
    const nf4_dtype back = dispatch_dtype(d.dtype, [](auto tag) { return decltype(tag)::value; });
    CHECK(back == d.dtype);
    const std::size_t storage = dispatch_dtype(d.dtype, [](auto tag) { return sizeof(typename DtypeCodec<decltype(tag)::value>::Storage); });
    CHECK(storage == d.size);
    // 1.0 survives every dtype's rounding; a result of NaN becomes the dtype's canonical NaN.
    const float one = dispatch_dtype(d.dtype, [](auto tag) { return round_to<decltype(tag)::value>(1.0f); });
    CHECK(one == 1.0f);
  }
  CHECK(find_dtype_or_alias("half") == find_dtype("fp16"));
  CHECK(find_dtype_or_alias("float") == find_dtype("fp32"));
  CHECK(find_dtype_or_alias("f") == nullptr);
  CHECK(find_dtype_or_alias("") == nullptr);
  CHECK(dtype_choices() == "F16 (0), BF16 (1) or F32 (2)");
}

TEST_CASE("formats: each quant type row decodes through its built-in table or the stored quant_map") {
  for (const QuantTypeInfo& q : kQuantTypes) {
    CAPTURE(std::string(q.name));
    CHECK(find_quant_type(q.name) == &q);
    CHECK(dispatch_quant_type(q.quant_type, [](auto tag) { return decltype(tag)::value; }) == q.quant_type);
    CHECK(uses_quant_map(q.quant_type) == (q.builtin_values == nullptr));
    const cpu::QuantizedWeight w = test::synthetic_weight(64, q.quant_type, 64, false, 5);
    nf4_tensor t = w.describe(NF4_DTYPE_F32, nullptr, 0);
    float stored[16];
    for (int i = 0; i < 16; ++i) stored[i] = 100.0f + static_cast<float>(i);  // no table of any row
    t.quant_map = stored;
    float values[16];
    value_table(t, values);
    for (int i = 0; i < 16; ++i) CHECK(values[i] == (q.builtin_values ? q.builtin_values[i] : stored[i]));
  }
}

TEST_CASE("formats: every dequantization store writes numel * the row's size bytes, no more, no fewer") {
  std::vector<cpu::Isa> isas;
  for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512})
    if (cpu::isa_supported(isa)) isas.push_back(isa);
  const std::vector<nf4_backend_kind> backends = test::available_backends();
  for (const DtypeInfo& d : kDtypes)
    for (std::int64_t n : {1, 2, 3, 31, 33, 64, 65, 100, 257, 4099}) {
      const cpu::QuantizedWeight w = test::synthetic_weight(n, NF4_QUANT_NF4, 64, true, static_cast<std::uint64_t>(n));
      const std::int64_t bytes = n * static_cast<std::int64_t>(d.size);
      const auto expect_exact = [&](const std::string& path, auto&& run) {
        const std::pair<std::int64_t, std::int64_t> range = written_range(bytes, run);
        CHECK_MESSAGE(range.first == 0, path << " " << d.name << " n=" << n);
        CHECK_MESSAGE(range.second == bytes, path << " " << d.name << " n=" << n);
      };
      expect_exact("oracle", [&](void* out) { cpu::oracle_dequantize(w.describe(d.dtype, out, bytes)); });
      for (cpu::Isa isa : isas)
        expect_exact(cpu::isa_name(isa), [&](void* out) { cpu::dequantize_range(isa, w.describe(d.dtype, out, bytes), 0, n); });
      for (nf4_backend_kind kind : backends) {
        Context ctx(kind);
        expect_exact(backend_name(kind), [&](void* out) { ctx.dequantize_host(w.describe(d.dtype, out, bytes)); });
      }
    }
}

TEST_CASE("formats: every product store writes m * n * y's size bytes, in either mode") {
  const std::vector<nf4_backend_kind> backends = test::available_backends();
  for (const DtypeInfo& y : kDtypes)
    for (const DtypeInfo& x : kDtypes)
      for (nf4_gemv_mode mode : {NF4_GEMV_EXACT, NF4_GEMV_FAST}) {
        if (!x.product || !y.product) continue;  // refused (test_gemv.cpp)
        test::GemvCase c;
        test::make_gemv_case(c, 33, 64, 3, NF4_QUANT_NF4, 64, false, x.dtype, y.dtype, 7);
        const std::int64_t bytes = c.y_bytes();
        const auto expect_exact = [&](const std::string& path, auto&& run) {
          const std::pair<std::int64_t, std::int64_t> range = written_range(bytes, run);
          CHECK_MESSAGE(range.first == 0, path << " x=" << x.name << " y=" << y.name << " mode=" << mode);
          CHECK_MESSAGE(range.second == bytes, path << " x=" << x.name << " y=" << y.name << " mode=" << mode);
        };
        expect_exact("oracle", [&](void* out) {
          nf4_gemv_desc g = c.describe(out, bytes);
          g.mode = mode;
          cpu::oracle_gemv(g);
        });
        for (nf4_backend_kind kind : backends) {
          Context ctx(kind);
          expect_exact(backend_name(kind), [&](void* out) {
            nf4_gemv_desc g = c.describe(out, bytes);
            g.mode = mode;
            ctx.gemv_host(g);
          });
        }
      }
}
