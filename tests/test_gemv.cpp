// SPDX-License-Identifier: MIT
// The fused matrix-vector product (nf4.h, nf4_gemv_desc; docs/GEMV.md): validation, the oracle
// against an independent evaluation of the contract and against float64, and every available
// backend against the oracle, bit for bit, through nf4_gemv_host (the registry is iterated, so a
// backend without a device is reported and skipped).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/gemv_oracle.h"
#include "backends/cpu/oracle.h"
#include "core/error.h"
#include "core/gemv.h"
#include "core/half.h"
#include "nf4/nf4.hpp"
#include "tests/support/env.h"
#include "tests/support/gemv.h"

using namespace nf4;

namespace {



// The contract evaluated recursively (a different shape of code from the oracle's level loop).
float tree(const std::vector<float>& leaves, std::size_t first, std::size_t count) {
  if (count == 1) return leaves[first];
  const float a = tree(leaves, first, count / 2), b = tree(leaves, first + count / 2, count / 2);
  volatile float s = a + b;  // one rounding, kept apart from any neighbouring multiply
  return s;
}

std::uint32_t y_bits(const std::vector<std::uint8_t>& y, nf4_dtype d, std::int64_t i) {
  std::uint32_t v = 0;
  std::memcpy(&v, &y[static_cast<std::size_t>(i) * nf4_dtype_size(d)], nf4_dtype_size(d));
  return v;
}

float y_float(const std::vector<std::uint8_t>& y, nf4_dtype d, std::int64_t i) {
  const std::uint32_t b = y_bits(y, d, i);
  if (d == NF4_DTYPE_F32) return bits_float(b);
  return d == NF4_DTYPE_BF16 ? float_from_bf16(static_cast<std::uint16_t>(b)) : float_from_f16(static_cast<std::uint16_t>(b));
}

// Runs c on ctx (host pointers) and returns the number of differing elements against the oracle
// (-1: wrote past y).
std::int64_t compare(Context& ctx, const test::GemvCase& c) {
  const auto expected = c.oracle();
  std::vector<std::uint8_t> got(static_cast<std::size_t>(c.y_bytes()) + 64, 0xA5);
  const nf4_gemv_desc g = c.describe(got.data(), c.y_bytes());
  const nf4_status s = nf4_gemv_host(ctx.get(), &g);
  REQUIRE_MESSAGE(s == NF4_OK, std::string(nf4_last_error(ctx.get())));
  for (std::size_t i = static_cast<std::size_t>(c.y_bytes()); i < got.size(); ++i)
    if (got[i] != 0xA5) return -1;
  return test::differing_elements(expected.data(), got.data(), c.m * c.n, c.y_dtype);
}

}  // namespace

// Weight arrays smaller than this test's y (absmax: 10 bytes, nested_absmax: 4) are copied into a
// buffer of their own, larger than y, before y is placed on them: y then overlaps that array alone,
// wherever the allocator put the others (a y running past a 4-byte array into its neighbour was
// reported as overlapping the neighbour, which the checks consider first).
namespace {
std::vector<std::uint8_t> g_roomy_absmax(4096), g_roomy_nested_absmax(4096);
void* roomy(std::vector<std::uint8_t>& buffer, const void* array, std::size_t bytes) {
  REQUIRE(bytes <= buffer.size());
  std::memcpy(buffer.data(), array, bytes);
  return buffer.data();
}
std::size_t absmax_bytes(const nf4_tensor& w) { return static_cast<std::size_t>(w.absmax_count) * (w.nested ? 1 : 4); }
std::size_t nested_absmax_bytes(const nf4_tensor& w) { return static_cast<std::size_t>(w.nested_absmax_count) * 4; }
}  // namespace

TEST_CASE("gemv: x or y past 2^56 elements (m times k or n) is refused as a shape, never computed in overflowing bytes") {
  // A weight of 2^56 elements as [2^56, 1] or [1, 2^56]: valid alone, but 2 rows of x or y past the limit.
  const Geometry weight{NF4_QUANT_NF4, NF4_DTYPE_F32, NF4_MAX_ELEMENTS, 64, 0, 0};
  for (const bool tall : {true, false}) {
    CAPTURE(tall);
    GemvGeometry g{weight, tall ? NF4_MAX_ELEMENTS : 1, tall ? 1 : NF4_MAX_ELEMENTS, 1, NF4_DTYPE_BF16, NF4_DTYPE_F32};
    CHECK(validate_gemv_geometry(g).y_bytes == (tall ? NF4_MAX_ELEMENTS * 4 : 4));
    for (const std::int32_t m : {2, NF4_GEMV_MAX_M}) {
      g.m = m;
      try {
        validate_gemv_geometry(g);
        FAIL("accepted m = " << m);
      } catch (const Error& e) {
        CHECK(e.status() == NF4_ERR_SHAPE);
        CHECK(std::string(e.what()).find("at most 2^56 elements") != std::string::npos);
      }
    }
  }
}

namespace {
// A workspace apart from every case's buffers (validation never writes it).
alignas(16) unsigned char g_workspace_bytes[256];
void* const g_workspace = g_workspace_bytes;
}  // namespace

TEST_CASE("gemv: each invalid description returns its status, names the field, and writes nothing") {
  test::GemvCase c;
  test::make_gemv_case(c, 6, 100, 3, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F16, 1);
  struct Bad {
    const char* name;
    nf4_status status;
    const char* contains;
    std::function<void(nf4_gemv_desc&, nf4_tensor&)> mutate;
  };
  std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()), 0xEE);
  const std::vector<Bad> cases = {
      {"null weight", NF4_ERR_NULL_POINTER, "weight", [](nf4_gemv_desc& g, nf4_tensor&) { g.weight = nullptr; }},
      {"null x", NF4_ERR_NULL_POINTER, "x", [](nf4_gemv_desc& g, nf4_tensor&) { g.x = nullptr; }},
      {"null y", NF4_ERR_NULL_POINTER, "y", [](nf4_gemv_desc& g, nf4_tensor&) { g.y = nullptr; }},
      {"bad weight (packed bytes)", NF4_ERR_PACKED_SIZE, "packed_bytes", [](nf4_gemv_desc&, nf4_tensor& w) { w.packed_bytes -= 1; }},
      {"null packed", NF4_ERR_NULL_POINTER, "packed", [](nf4_gemv_desc&, nf4_tensor& w) { w.packed = nullptr; }},
      {"k * n > numel", NF4_ERR_SHAPE, "n * k", [](nf4_gemv_desc& g, nf4_tensor&) { g.n += 1; }},
      {"k * n < numel", NF4_ERR_SHAPE, "n * k", [](nf4_gemv_desc& g, nf4_tensor&) { g.k -= 1; }},
      {"n * k overflows", NF4_ERR_SHAPE, "n * k", [](nf4_gemv_desc& g, nf4_tensor&) { g.n = INT64_MAX / 2; g.k = 6; }},
      {"n zero", NF4_ERR_SHAPE, "n and k", [](nf4_gemv_desc& g, nf4_tensor&) { g.n = 0; }},
      {"k negative", NF4_ERR_SHAPE, "n and k", [](nf4_gemv_desc& g, nf4_tensor&) { g.k = -100; }},
      {"m zero", NF4_ERR_SHAPE, "m must be", [](nf4_gemv_desc& g, nf4_tensor&) { g.m = 0; }},
      {"m past the maximum", NF4_ERR_SHAPE, "m must be", [](nf4_gemv_desc& g, nf4_tensor&) { g.m = NF4_GEMV_MAX_M + 1; }},
      {"mode unknown", NF4_ERR_INVALID_ARGUMENT, "mode must be", [](nf4_gemv_desc& g, nf4_tensor&) { g.mode = static_cast<nf4_gemv_mode>(2); }},
      {"x dtype", NF4_ERR_DTYPE, "x_dtype", [](nf4_gemv_desc& g, nf4_tensor&) { g.x_dtype = static_cast<nf4_dtype>(3); }},
      {"y dtype", NF4_ERR_DTYPE, "y_dtype", [](nf4_gemv_desc& g, nf4_tensor&) { g.y_dtype = static_cast<nf4_dtype>(-1); }},
      {"y too small", NF4_ERR_OUTPUT_TOO_SMALL, "y_bytes", [](nf4_gemv_desc& g, nf4_tensor&) { g.y_bytes -= 1; }},
      {"y overlaps x", NF4_ERR_ALIASING, "y overlaps x",
       [](nf4_gemv_desc& g, nf4_tensor&) { g.y = const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(g.x) + 10); }},
      {"y overlaps packed", NF4_ERR_ALIASING, "packed", [](nf4_gemv_desc& g, nf4_tensor& w) { g.y = const_cast<std::uint8_t*>(w.packed) + 1; }},
      {"y overlaps absmax", NF4_ERR_ALIASING, "absmax",
       [](nf4_gemv_desc& g, nf4_tensor& w) {
         g.y = roomy(g_roomy_absmax, w.absmax, absmax_bytes(w));
         w.absmax = g.y;
       }},
      {"y overlaps quant_map", NF4_ERR_ALIASING, "quant_map",
       [](nf4_gemv_desc& g, nf4_tensor& w) { g.y = const_cast<float*>(w.quant_map) + 3; }},
      {"y overlaps nested_absmax", NF4_ERR_ALIASING, "nested_absmax",
       [](nf4_gemv_desc& g, nf4_tensor& w) {
         g.y = roomy(g_roomy_nested_absmax, w.nested_absmax, nested_absmax_bytes(w));
         w.nested_absmax = static_cast<const float*>(g.y);
       }},
      {"y overlaps nested_code", NF4_ERR_ALIASING, "nested_code",
       [](nf4_gemv_desc& g, nf4_tensor& w) { g.y = const_cast<float*>(w.nested_code) + 200; }},
      {"workspace_bytes negative", NF4_ERR_INVALID_ARGUMENT, "workspace_bytes",
       [](nf4_gemv_desc& g, nf4_tensor&) {
         g.workspace = g_workspace;
         g.workspace_bytes = -1;
       }},
      {"workspace_bytes without a workspace", NF4_ERR_NULL_POINTER, "workspace is NULL",
       [](nf4_gemv_desc& g, nf4_tensor&) { g.workspace_bytes = 64; }},
      {"workspace overlaps x", NF4_ERR_ALIASING, "workspace overlaps x",
       [](nf4_gemv_desc& g, nf4_tensor&) {
         g.workspace = const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(g.x) + 4);
         g.workspace_bytes = 64;
       }},
      {"workspace overlaps y", NF4_ERR_ALIASING, "workspace overlaps y",
       [](nf4_gemv_desc& g, nf4_tensor&) {
         g.workspace = static_cast<std::uint8_t*>(g.y) + 2;
         g.workspace_bytes = 1;
       }},
      {"workspace overlaps packed", NF4_ERR_ALIASING, "workspace overlaps the weight's packed",
       [](nf4_gemv_desc& g, nf4_tensor& w) {
         g.workspace = const_cast<std::uint8_t*>(w.packed) + 7;
         g.workspace_bytes = 8;
       }},
  };
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    for (const auto& bad : cases) {
      const std::string name = bad.name;
      CAPTURE(name);
      CAPTURE(ctx.device_name());
      // Copies of the weight's arrays, so that aliasing cases cannot damage the case's own data.
      const cpu::QuantizedWeight w = c.w;
      nf4_tensor wt = w.describe(NF4_DTYPE_F32, nullptr, 0);
      // x in an allocation of its own 1 MiB (mapped apart from the heap that holds the weight's
      // copies), so that a y placed on a weight array never also reaches x and the message names
      // the array the case means.
      std::vector<std::uint8_t> x(std::max<std::size_t>(c.x.size(), std::size_t{1} << 20));
      std::copy(c.x.begin(), c.x.end(), x.begin());
      nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
      g.weight = &wt;
      g.x = x.data();
      bad.mutate(g, wt);
      const std::vector<std::uint8_t> x_before = x;
      const std::vector<std::uint8_t> packed_before = w.packed;
      CHECK(nf4_gemv_validate(&g) == bad.status);
      CHECK(std::string(nf4_last_error(nullptr)).find(bad.contains) != std::string::npos);
      CHECK(nf4_gemv_host(ctx.get(), &g) == bad.status);
      const std::string msg = nf4_last_error(ctx.get());
      CHECK_MESSAGE(msg.find(bad.contains) != std::string::npos, msg);
      CHECK(std::all_of(y.begin(), y.end(), [](std::uint8_t b) { return b == 0xEE; }));
      CHECK(x == x_before);
      CHECK(w.packed == packed_before);
    }
    nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
    // The workspace size: validated like the product; none on the cpu and vulkan backends, nor
    // for the exact contract anywhere.
    std::size_t bytes = 7;
    CHECK(nf4_gemv_workspace_size(ctx.get(), &g, &bytes) == NF4_OK);
    CHECK(bytes == 0);
    CHECK(nf4_gemv_workspace_size(ctx.get(), &g, nullptr) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_gemv_workspace_size(ctx.get(), nullptr, &bytes) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_gemv_workspace_size(nullptr, &g, &bytes) == NF4_ERR_NULL_POINTER);
    nf4_gemv_desc bad = g;
    bad.m = 0;
    CHECK(nf4_gemv_workspace_size(ctx.get(), &bad, &bytes) == NF4_ERR_SHAPE);
    // A workspace the product does not need is accepted and changes nothing.
    nf4_gemv_desc with = g;
    with.workspace = g_workspace;
    with.workspace_bytes = sizeof g_workspace_bytes;
    CHECK(nf4_gemv_host(ctx.get(), &with) == NF4_OK);
    std::fill(y.begin(), y.end(), std::uint8_t{0xEE});
    CHECK(nf4_gemv_host(ctx.get(), nullptr) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_gemv_host(nullptr, &g) == NF4_ERR_NULL_POINTER);
    if (!context_backend(ctx.get()).capabilities().device_pointers) CHECK(nf4_gemv(ctx.get(), &g) == NF4_ERR_UNSUPPORTED);
  }
  CHECK(std::string(nf4_status_string(NF4_ERR_SHAPE)) == "shape mismatch");
}

TEST_CASE("gemv: the split model (both GPU backends) takes a split only where it cuts the cost by a quarter") {
  // The H100's resident warps of the CUDA kernel at m = 1: two CTAs of 8 warps on 132 SMs; row
  // groups of 4 rows; chunks of 1024 columns (docs/PERFORMANCE_LOG.md, "Splitting a row group over warps").
  const std::int64_t h100 = 2 * 8 * 132;
  CHECK(nf4::gemv_split(1024, 4, 8, h100, 0, 8) == 2);   // 4096 x 4096: half the chunks per warp
  CHECK(nf4::gemv_split(1024, 14, 8, h100, 0, 8) == 2);  // 4096 x 14336
  CHECK(nf4::gemv_split(3584, 4, 8, h100, 0, 8) == 1);   // 14336 x 4096: 7 waves-chunks against 8 is no quarter
  CHECK(nf4::gemv_split(7168, 8, 8, h100, 0, 8) == 1);   // 28672 x 8192
  CHECK(nf4::gemv_split(2048, 28, 8, h100, 0, 8) == 1);  // 8192 x 28672: one wave already
  CHECK(nf4::gemv_split(16, 1000, 8, h100, 0, 8) == 8);  // few rows, long k: as far as the CTA goes
  CHECK(nf4::gemv_split(16, 1000, 6, h100, 0, 8) == 2);  // a split divides the CTA's warps
  CHECK(nf4::gemv_split(16, 3, 8, h100, 0, 8) == 4);     // at most the padded chunk count
  CHECK(nf4::gemv_split(16, 1000, 8, 0, 0, 8) == 1);     // resident workers unknown: none
  CHECK(nf4::gemv_split(16, 1000, 8, 0, 4, 8) == 4);     // forced
  CHECK(nf4::gemv_split(16, 2, 8, h100, 64, 8) == 2);    // forced, capped by max_split and the chunks
}

TEST_CASE("gemv: the oracle equals a recursive evaluation of the contract, padding and signed zeros included") {
  std::uint64_t seed = 10;
  for (std::int64_t k : {1, 2, 3, 5, 8, 31, 64, 100, 1024, 1500})
    for (nf4_dtype yd : {NF4_DTYPE_F32, NF4_DTYPE_BF16}) {
      test::GemvCase c;
      test::make_gemv_case(c, 3, k, 2, NF4_QUANT_NF4, 32, true, NF4_DTYPE_F32, yd, seed++);
      const auto w = test::dense_weight(c);
      const auto y = c.oracle();
      const std::size_t leaves = std::bit_ceil(static_cast<std::size_t>(k));
      for (std::int32_t j = 0; j < c.m; ++j)
        for (std::int64_t r = 0; r < c.n; ++r) {
          std::vector<float> p(leaves, 0.0f);
          for (std::int64_t col = 0; col < k; ++col) {
            volatile float prod = w[static_cast<std::size_t>(r * k + col)] * cpu::gemv_x_value(c.x.data(), c.x_dtype, j * k + col);
            p[static_cast<std::size_t>(col)] = prod;
          }
          const std::uint32_t want = gemv_out_bits(tree(p, 0, leaves), yd);
          CHECK_MESSAGE(y_bits(y, yd, j * c.n + r) == want, c.label() << " j=" << j << " r=" << r);
        }
    }
}

TEST_CASE("gemv: error against a float64 sum stays within the pairwise bound") {
  // |Y - Y64| <= ((1 + u)^(d + 1) - 1) * sum |w x|, u = 2^-24, d = log2(P): one rounding for the
  // product and one per tree level. Plus, for 16-bit outputs, half a unit in the last place.
  double worst_f32 = 0, worst_bf16 = 0, worst_bound_use = 0;
  std::uint64_t seed = 100;
  for (std::int64_t k : {64, 1000, 4096, 14336})
    for (nf4_quant_type qt : test::kQuantTypes) {
      test::GemvCase c;
      test::make_gemv_case(c, 64, k, 4, qt, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F32, seed++);
      const auto w = test::dense_weight(c);
      const auto y32 = c.oracle();
      c.y_dtype = NF4_DTYPE_BF16;
      const auto y16 = c.oracle();
      const int depth = std::bit_width(std::bit_ceil(static_cast<std::uint64_t>(k))) - 1;
      const double gamma = std::pow(1.0 + std::ldexp(1.0, -24), depth + 1) - 1.0;
      double max_ref = 0, max_err32 = 0, max_err16 = 0;
      for (std::int32_t j = 0; j < c.m; ++j)
        for (std::int64_t r = 0; r < c.n; ++r) {
          double sum = 0, abs_sum = 0;
          for (std::int64_t col = 0; col < k; ++col) {
            const double p = static_cast<double>(w[static_cast<std::size_t>(r * k + col)]) *
                             static_cast<double>(cpu::gemv_x_value(c.x.data(), c.x_dtype, j * k + col));
            sum += p;
            abs_sum += std::fabs(p);
          }
          const double e32 = std::fabs(static_cast<double>(y_float(y32, NF4_DTYPE_F32, j * c.n + r)) - sum);
          const double e16 = std::fabs(static_cast<double>(y_float(y16, NF4_DTYPE_BF16, j * c.n + r)) - sum);
          CHECK(e32 <= gamma * abs_sum * 1.0001 + 1e-30);
          CHECK(e16 <= gamma * abs_sum * 1.0001 + std::ldexp(std::fabs(sum) + gamma * abs_sum, -8) + 1e-30);
          if (abs_sum > 0) worst_bound_use = std::max(worst_bound_use, e32 / (gamma * abs_sum));
          max_ref = std::max(max_ref, std::fabs(sum));
          max_err32 = std::max(max_err32, e32);
          max_err16 = std::max(max_err16, e16);
        }
      worst_f32 = std::max(worst_f32, max_err32 / max_ref);
      worst_bf16 = std::max(worst_bf16, max_err16 / max_ref);
    }
  // Relative max error = max |Y - Y64| / max |Y64| over a matrix, as the peers were measured.
  MESSAGE("gemv relative max error vs float64: fp32 output " << worst_f32 << ", bf16 output " << worst_bf16
                                                             << "; largest fraction of the bound used " << worst_bound_use);
  CHECK(worst_f32 < 1e-6);
  // bf16 keeps 8 significant bits: rounding the result costs up to 2^-8 of it, which dominates.
  CHECK(worst_bf16 <= std::ldexp(1.0, -8) + worst_f32);
}

TEST_CASE("gemv: every available backend matches the oracle on many shapes, dtypes and formats") {
  const std::int64_t ks[] = {1, 2, 3, 5, 7, 8, 16, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 255, 256, 257,
                             511, 512, 513, 1000, 1023, 1024, 1025, 1056, 2048, 2080, 3000, 4096, 4160, 5000};
  const std::int64_t ns[] = {1, 2, 3, 5, 17};
  const int blocksizes[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    CAPTURE(ctx.device_name());
    std::uint64_t seed = 1000;
    int cases = 0;
    for (std::int64_t k : ks)
      for (std::int64_t n : ns) {
        const std::uint64_t s = seed++;
        test::GemvCase c;
        // Formats and dtypes cycle with the seed, so every combination appears across the sweep.
        test::make_gemv_case(c, n, k, static_cast<std::int32_t>(1 + s % 8), (s / 8) % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4,
                             blocksizes[(s / 3) % 8], (s / 2) % 2 == 0, test::kProductDTypes[s % test::kProductDTypes.size()], test::kProductDTypes[(s / 3) % test::kProductDTypes.size()], s);
        const std::int64_t diff = compare(ctx, c);
        CHECK_MESSAGE(diff == 0, c.label() << (diff < 0 ? ": wrote past y" : ": elements differ: " + std::to_string(diff)));
        ++cases;
      }
    // Every x dtype x y dtype x format on two shapes (one with blocks straddling rows).
    for (std::int64_t k : {96, 4096 + 32})
      for (nf4_dtype xd : test::kProductDTypes)
        for (nf4_dtype yd : test::kProductDTypes)
          for (nf4_quant_type qt : test::kQuantTypes)
            for (bool nested : {true, false}) {
              test::GemvCase c;
              test::make_gemv_case(c, 9, k, 5, qt, 64, nested, xd, yd, seed++);
              const std::int64_t diff = compare(ctx, c);
              CHECK_MESSAGE(diff == 0, c.label() << ": " << diff);
              ++cases;
            }
    MESSAGE("gemv: " << cases << " cases on " << ctx.device_name());
  }
}

TEST_CASE("gemv: a row's bits do not depend on m or on the other rows (batch invariance)") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    std::uint64_t seed = 5000;
    for (std::int64_t k : {40, 1024, 4096, 4100})
      for (nf4_dtype yd : {NF4_DTYPE_BF16, NF4_DTYPE_F32}) {
        test::GemvCase c;
        test::make_gemv_case(c, 33, k, 8, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, yd, seed++);
        std::vector<std::uint8_t> all(static_cast<std::size_t>(c.y_bytes()));
        nf4_gemv_desc g = c.describe(all.data(), c.y_bytes());
        REQUIRE(nf4_gemv_host(ctx.get(), &g) == NF4_OK);
        const std::size_t es = nf4_dtype_size(yd), row_bytes = static_cast<std::size_t>(c.n) * es;
        for (std::int32_t j = 0; j < 8; ++j) {
          for (std::int32_t m : {1, 3}) {
            if (j + m > 8) continue;
            std::vector<std::uint8_t> part(row_bytes * static_cast<std::size_t>(m));
            nf4_gemv_desc h = g;
            h.m = m;
            h.x = c.x.data() + static_cast<std::size_t>(j * k) * nf4_dtype_size(c.x_dtype);
            h.y = part.data();
            h.y_bytes = static_cast<std::int64_t>(part.size());
            REQUIRE(nf4_gemv_host(ctx.get(), &h) == NF4_OK);
            CHECK_MESSAGE(std::memcmp(part.data(), all.data() + row_bytes * static_cast<std::size_t>(j), row_bytes) == 0,
                          c.label() << " row " << j << " alone (m=" << m << ") differs from the batch of 8");
          }
        }
      }
  }
}

TEST_CASE("gemv: signed zeros, infinities and NaN give the same bits on every backend") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    std::uint64_t seed = 7000;
    for (std::int64_t k : {1, 3, 64, 100, 1024, 2048, 3000, 4096})
      for (nf4_dtype yd : test::kProductDTypes) {
        test::GemvCase c;
        test::make_gemv_case(c, 4, k, 4, NF4_QUANT_NF4, 64, false, NF4_DTYPE_F32, yd, seed++);
        // Row 0 of W all code 0 (value -1: negative weights); row 1 code 7 (value 0).
        for (std::int64_t i = 0; i < 2 * k; ++i) {
          std::uint8_t& b = c.w.packed[static_cast<std::size_t>(i / 2)];
          const unsigned code = i < k ? 0u : 7u;
          b = static_cast<std::uint8_t>((i & 1) ? ((b & 0xf0u) | code) : ((b & 0x0fu) | (code << 4)));
        }
        float* x = reinterpret_cast<float*>(c.x.data());
        // x row 0: +0 (products with negative weights are -0: the root is -0 only when k is a
        // power of two, the contract's padding being +0); row 1: -0; row 2: one inf; row 3: a NaN.
        for (std::int64_t col = 0; col < k; ++col) {
          x[col] = 0.0f;
          x[k + col] = -0.0f;
        }
        x[2 * k + k / 2] = INFINITY;
        std::uint32_t nan_bits = 0x7fa00001u;  // a signalling NaN with a payload
        std::memcpy(&x[3 * k + (k - 1)], &nan_bits, 4);
        const auto y = c.oracle();
        const bool pow2 = (k & (k - 1)) == 0;
        CHECK(y_bits(y, yd, 0) == (pow2 ? gemv_out_bits(-0.0f, yd) : 0u));
        CHECK(y_bits(y, yd, c.n + 0) == 0u);  // -0 * negative = +0
        CHECK(y_bits(y, yd, 3 * c.n + 2) == gemv_out_bits(NAN, yd));
        const std::int64_t diff = compare(ctx, c);
        CHECK_MESSAGE(diff == 0, c.label() << ": " << diff);
      }
  }
}

TEST_CASE("gemv: the weight's out_dtype, out and out_bytes are not used (any value passes)") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    test::GemvCase c;
    test::make_gemv_case(c, 5, 96, 2, NF4_QUANT_NF4, 32, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 9001);
    const std::int32_t bad = 7;
    std::memcpy(&c.wt.out_dtype, &bad, sizeof bad);  // as a C caller could leave it
    c.wt.out = reinterpret_cast<void*>(std::uintptr_t{16});
    c.wt.out_bytes = -1;
    CHECK(compare(ctx, c) == 0);
  }
}

TEST_CASE("gemv: row tails, odd row counts, every m, chunk counts and k below, at and past a chunk") {
  // The vulkan shader takes rows in teams of R and workgroups of several teams, 16-bit outputs in pairs
  // of rows where n is even; the chunk stack is sized by the chunk count (8 levels up to 128
  // chunks). Rows: tails of every size, odd and even n; k: the vector path (k % 32 == 0) below,
  // at and past one chunk, chunk counts not a power of two, more than 128 chunks.
  struct Shape {
    std::int64_t n, k;
  };
  const Shape shapes[] = {{1, 32},   {2, 64},    {3, 96},    {7, 992},   {16, 1024}, {17, 1056}, {33, 2080}, {34, 3072},
                          {66, 992}, {65, 5120}, {15, 7168}, {4, 33792}, {3, 132096}, {2, 140000}};
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    CAPTURE(ctx.device_name());
    std::uint64_t seed = 9100;
    int cases = 0;
    for (const Shape& sh : shapes)
      for (std::int32_t m = 1; m <= 8; ++m) {
        const std::uint64_t s = seed++;
        test::GemvCase c;
        test::make_gemv_case(c, sh.n, sh.k, m, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 32 << (s % 5), s % 3 != 0,
                             test::kProductDTypes[(s / 2) % test::kProductDTypes.size()], test::kProductDTypes[s % test::kProductDTypes.size()], s);
        const std::int64_t diff = compare(ctx, c);
        CHECK_MESSAGE(diff == 0, c.label() << (diff < 0 ? ": wrote past y" : ": elements differ: " + std::to_string(diff)));
        ++cases;
      }
    MESSAGE("gemv tails: " << cases << " cases on " << ctx.device_name());
  }
}

TEST_CASE("gemv: the cpu backend's pieces of about 2^20 weights (whole rows) join into the oracle's result") {
  // run_gemv hands the thread pool pieces of 2^20 / k rows; these shapes take two, seven and three
  // pieces, with blocks straddling rows at piece boundaries (k % 64 != 0), the last off the vector path.
  struct Shape {
    std::int64_t n, k;
    std::int32_t m;
  };
  const Shape shapes[] = {{5, (1 << 18) + 96, 3}, {7, (1 << 19) + 32, 2}, {60000, 40, 1}};
  Context ctx(NF4_BACKEND_CPU);
  std::uint64_t seed = 9700;
  for (const Shape& sh : shapes) {
    test::GemvCase c;
    test::make_gemv_case(c, sh.n, sh.k, sh.m, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F32, seed++);
    const std::int64_t diff = compare(ctx, c);
    CHECK_MESSAGE(diff == 0, c.label() << (diff < 0 ? ": wrote past y" : ": elements differ: " + std::to_string(diff)));
  }
}

TEST_CASE("vulkan gemv: every launch shape gives the oracle's bits (shuffle levels, rows per team, workgroup, value tables)") {
  // NF4_VULKAN_GEMV_TUNE picks the shader's specialization: shuf=0 takes every level above the
  // lanes through shared memory, shuf=1..5 that many by subgroup shuffles (capped by the
  // device's subgroup size), r<m> the rows per team, wg the teams per workgroup, pair the
  // 256-entry pair table, waves fewer workgroups than slots (each taking several in turn; on a
  // device without an SM count, waves workgroups in all), xs x staged in shared memory (where a
  // workgroup takes two slots or more), ordered the ordered prefetch (with x held in registers
  // at m = 1 unless staged).
  if (!test::backend_ready(NF4_BACKEND_VULKAN)) return;
  const char* tunes[] = {"shuf=0", "shuf=1", "shuf=2,r1=3,r2=5", "shuf=3,wg=32", "r1=1,r2=1,r4=1,r8=1,wg=64", "r1=8,r2=16,r4=8,r8=4",
                         "pair=1", "pair=16,r1=4", "waves=1,xs=65536,ordered=1", "waves=3,pair=16,xs=65536,r1=4,shuf=0,split=2",
                         "ordered=1,r1=1,r2=1,r4=1,r8=1,wg=64"};
  std::uint64_t seed = 9500;
  for (const char* tune : tunes) {
    test::ScopedEnv env("NF4_VULKAN_GEMV_TUNE", tune);
    Context ctx(NF4_BACKEND_VULKAN);
    for (std::int64_t k : {96, 2080, 1000})
      for (std::int32_t m : {1, 3, 8}) {
        const std::uint64_t s = seed++;
        test::GemvCase c;
        test::make_gemv_case(c, 2 + static_cast<std::int64_t>(s % 37), k, m, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64 << (s % 3),
                             s % 3 != 0, test::kProductDTypes[(s / 2) % test::kProductDTypes.size()], test::kProductDTypes[s % test::kProductDTypes.size()], s);
        const std::int64_t diff = compare(ctx, c);
        CHECK_MESSAGE(diff == 0, std::string(tune) << ": " << c.label() << (diff < 0 ? ": wrote past y" : ": elements differ: " + std::to_string(diff)));
      }
  }
}

TEST_CASE("vulkan gemv: a row group's chunks split over teams give the oracle's bits (split=1, 2, 4, 8)") {
  // split=N makes N teams of a workgroup share a row group, each taking an aligned power-of-two
  // range of the padded chunk tree; chunk counts 1, 2, 3 and 5 leave parts of padding only (3, 5),
  // k a power of two or not picks the padding's sign, odd n takes the 16-bit pair write's atomic
  // tail, shuf=0 and shuf=2 take the levels above the lanes through shared memory (with a barrier
  // per chunk step) and the default as many by shuffles as lavapipe's subgroup allows. split=8
  // needs a workgroup of 8 teams. The requested split is capped by the chunk count.
  // Not covered on lavapipe (Mesa 22.3): the barrier before part 0 adds the parts' roots. llvmpipe
  // leaves a loop through a masked break, so each subgroup passes the chunk loop's barrier once
  // more after its last push and the roots are written before part 0 reads them at any subgroup
  // size; removing that barrier fails no case here, only a GPU can show the race.
  if (!test::backend_ready(NF4_BACKEND_VULKAN)) return;
  const char* tunes[] = {"split=1",        "split=2",        "split=4", "split=4,shuf=0", "split=2,shuf=2,r1=3",
                         "split=4,r1=1,r2=1,r4=1,r8=1", "split=8,wg=256", "split=8,wg=256,shuf=0"};
  struct Shape {
    std::int64_t n, k;
  };
  // chunks: 1 (k 1000, 1024), 2 (2048), 3 (2080: vector path; 3000: per element), 5 (5120, 4200).
  const Shape shapes[] = {{5, 1000}, {6, 1024}, {7, 2048}, {9, 2080}, {4, 3000}, {11, 5120}, {3, 4200}, {16, 4096}};
  std::uint64_t seed = 9700;
  for (const char* tune : tunes) {
    test::ScopedEnv env("NF4_VULKAN_GEMV_TUNE", tune);
    Context ctx(NF4_BACKEND_VULKAN);
    for (const Shape& sh : shapes)
      for (std::int32_t m : {1, 3, 8}) {
        const std::uint64_t s = seed++, h = (s * 0x9E3779B97F4A7C15ull) >> 40;
        test::GemvCase c;
        // The y dtype turns with the shape and m (fp32 shows a wrong order of additions best).
        test::make_gemv_case(c, sh.n, sh.k, m, h % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64 << ((h >> 1) % 3), (h >> 3) % 3 != 0,
                             test::kProductDTypes[(h >> 5) % test::kProductDTypes.size()], test::kProductDTypes[(s + s / 3) % test::kProductDTypes.size()], s);
        const std::int64_t diff = compare(ctx, c);
        CHECK_MESSAGE(diff == 0, std::string(tune) << ": " << c.label() << (diff < 0 ? ": wrote past y" : ": elements differ: " + std::to_string(diff)));
      }
    // Signed zeros through the parts: all-(-0) products are -0 only where k is a power of two.
    for (std::int64_t k : {1024, 2048, 3000, 4096, 5000})
      for (nf4_dtype yd : test::kProductDTypes) {
        test::GemvCase c;
        test::make_gemv_case(c, 3, k, 2, NF4_QUANT_NF4, 64, false, NF4_DTYPE_F32, yd, seed++);
        for (std::int64_t i = 0; i < 3 * k; ++i) {  // every weight -1 (code 0)
          std::uint8_t& b = c.w.packed[static_cast<std::size_t>(i / 2)];
          b = static_cast<std::uint8_t>((i & 1) ? (b & 0xf0u) : (b & 0x0fu));
        }
        float* x = reinterpret_cast<float*>(c.x.data());
        for (std::int64_t col = 0; col < 2 * k; ++col) x[col] = col < k ? 0.0f : -0.0f;
        const auto y = c.oracle();
        CHECK(y_bits(y, yd, 0) == (((k & (k - 1)) == 0) ? gemv_out_bits(-0.0f, yd) : 0u));
        const std::int64_t diff = compare(ctx, c);
        CHECK_MESSAGE(diff == 0, std::string(tune) << ": signed zeros " << c.label() << ": " << diff);
      }
  }
}

// A bad NF4_VULKAN_GEMV_TUNE value fails the product with NF4_ERR_INVALID_ARGUMENT, a message
// naming the key, and y untouched; good values give the oracle's bits.
static void check_gemv_tunes(const test::GemvCase& c, std::initializer_list<std::pair<const char*, const char*>> bad,
                             std::initializer_list<const char*> good) {
  for (const auto& entry : bad) {
    // Not a structured binding: clang before 16 cannot capture one in CAPTURE's lambda.
    const char* tune = entry.first;
    const char* key = entry.second;
    CAPTURE(tune);
    test::ScopedEnv env("NF4_VULKAN_GEMV_TUNE", tune);
    Context ctx(NF4_BACKEND_VULKAN);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()), 0xEE);
    const nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
    CHECK(nf4_gemv_host(ctx.get(), &g) == NF4_ERR_INVALID_ARGUMENT);
    const std::string message = nf4_last_error(ctx.get());
    CHECK_MESSAGE(message.find(std::string("NF4_VULKAN_GEMV_TUNE: ") + key) != std::string::npos, message);
    CHECK(std::all_of(y.begin(), y.end(), [](std::uint8_t b) { return b == 0xEE; }));
  }
  for (const char* tune : good) {
    CAPTURE(tune);
    test::ScopedEnv env("NF4_VULKAN_GEMV_TUNE", tune);
    Context ctx(NF4_BACKEND_VULKAN);
    CHECK(compare(ctx, c) == 0);
  }
}

TEST_CASE("vulkan gemv: NF4_VULKAN_GEMV_TUNE's split must be 0 or a power of two up to 32") {
  if (!test::backend_ready(NF4_BACKEND_VULKAN)) return;
  test::GemvCase c;
  test::make_gemv_case(c, 4, 2048, 1, NF4_QUANT_NF4, 64, false, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 9900);
  check_gemv_tunes(c,
                   {{"split=3", "split"}, {"split=64", "split"}, {"split=12", "split"}, {"split=x", "split"}, {"split=", "split"},
                    {"split=-1", "split"}, {"split=4294967298", "split"}},
                   {"split=0", "split=1", "split=32"});  // 32: capped by the teams and the chunks
}

TEST_CASE("vulkan gemv: NF4_VULKAN_GEMV_TUNE's numbers stop at 2^32 (no wrap past a range check)") {
  if (!test::backend_ready(NF4_BACKEND_VULKAN)) return;
  test::GemvCase c;
  test::make_gemv_case(c, 4, 2048, 1, NF4_QUANT_NF4, 64, false, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 9905);
  // Each would pass its range check if cut to 32 bits (2^32 + 128, 2^32 + 1, 2^32 + 2).
  check_gemv_tunes(c,
                   {{"wg=4294967424", "wg"}, {"pair=4294967297", "pair"}, {"shuf=4294967297", "shuf"}, {"r1=4294967298", "r1"},
                    {"xs=99999999999999999999", "xs"}},
                   {"wg=128,pair=0,shuf=5,r1=2"});
}

TEST_CASE("vulkan gemv: NF4_VULKAN_GEMV_TUNE's waves (0..64), xs (0..65536 bytes) and ordered (0, 1) are range-checked") {
  if (!test::backend_ready(NF4_BACKEND_VULKAN)) return;
  test::GemvCase c;
  test::make_gemv_case(c, 40, 2048, 1, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 9910);
  check_gemv_tunes(c,
                   {{"waves=65", "waves"}, {"waves=4294967297", "waves"}, {"waves=", "waves"}, {"xs=65537", "xs"}, {"xs=-1", "xs"},
                    {"xs=1k", "xs"}, {"ordered=2", "ordered"}, {"ordered=4294967297", "ordered"}},
                   {"waves=0,xs=0", "waves=64,xs=65536", "waves=1,xs=65536", "waves=1,xs=4096", "ordered=1", "ordered=0"});
}
