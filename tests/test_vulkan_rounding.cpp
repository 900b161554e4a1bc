// SPDX-License-Identifier: MIT
// The Vulkan shaders' conversions: the integer fp16/bf16 rounding against core/half.h, inf and NaN,
// packHalf2x16 and the fast product's hardware bf16 conversion only where the device check proved
// them exact, subnormal absmax. Fixtures and the
// validation layer: tests/support/vulkan.h.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/vulkan/vk_kernels.h"
#include "core/half.h"
#include "nf4/nf4.hpp"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/gemv.h"
#include "tests/support/gemv_fast.h"
#include "tests/support/vulkan.h"

using namespace nf4;
using namespace nf4::test;

namespace {

// A flat NF4 weight whose quant_map is {1 + q * 2^-20} and whose absmax sweeps fp32 bit
// patterns: every output is RNE(fl32(absmax * (1 + q 2^-20))), exercising the shaders' integer
// rounding on every exponent, both signs, the fp16 overflow, subnormal and tie boundaries.
void rounding_sweep(Context& c, const std::vector<std::uint32_t>& patterns, const std::vector<std::uint32_t>& quant_map_bits = {}) {
  cpu::QuantizedWeight w;
  w.quant_type = NF4_QUANT_NF4;
  w.blocksize = 32;
  w.nested = false;
  w.numel = static_cast<std::int64_t>(patterns.size()) * 32;
  w.quant_map.resize(16);
  for (int q = 0; q < 16; ++q) w.quant_map[q] = 1.0f + static_cast<float>(q) * (1.0f / 1048576.0f);
  for (std::size_t q = 0; q < quant_map_bits.size() && q < 16; ++q) w.quant_map[q] = bits_float(quant_map_bits[q]);
  w.absmax_f32.resize(patterns.size());
  for (std::size_t b = 0; b < patterns.size(); ++b) w.absmax_f32[b] = bits_float(patterns[b]);
  w.packed.resize(static_cast<std::size_t>(w.numel / 2));
  for (std::size_t j = 0; j < w.packed.size(); ++j) w.packed[j] = static_cast<std::uint8_t>(j * 0x1d + (j >> 4));
  for (nf4_dtype d : test::kDTypes) {
    std::vector<std::uint8_t> got(static_cast<std::size_t>(w.numel) * nf4_dtype_size(d));
    c.dequantize_host(w.describe(d, got.data(), static_cast<std::int64_t>(got.size())));
    CHECK_MESSAGE(test::differing_elements(oracle(w, d).data(), got.data(), w.numel, d) == 0, std::string(test::dtype_label(d)));
  }
}

}  // namespace

TEST_CASE("vulkan: the shaders' integer fp16/bf16 rounding matches core/half.h") {
  if (!vulkan_available()) return;
  Context c(NF4_BACKEND_VULKAN);
  std::vector<std::uint32_t> patterns;
  const std::uint32_t lows[] = {0x0000, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xefff, 0xffff};
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi) {
    const std::uint32_t exp = (hi >> 7) & 0xff;
    if (exp == 0 || exp == 0xff) continue;  // subnormals: next test; inf/NaN: below
    for (std::uint32_t lo : lows) patterns.push_back(hi << 16 | lo);
  }
  for (std::uint32_t s : {0u, 0x80000000u}) patterns.insert(patterns.end(), {s | 0x7f800000u, s});  // +-inf, +-0
  rounding_sweep(c, patterns);
  check_no_validation_messages();
}

TEST_CASE("vulkan: inf and NaN in quant_map or absmax take the full conversion (both kernels)") {
  if (!vulkan_available()) return;
  // The direct kernel converts a unit without the NaN case only when its absmax and every
  // quant_map value are finite. NaN inputs here are the canonical 0x7fffffff, which a product keeps
  // on the CPU and on GPUs alike (inf * 0, whose NaN bits differ by platform, never occurs).
  std::vector<std::uint32_t> patterns = {0x7fffffffu, 0x7f800000u, 0xff800000u, 0x3f800000u, 0xbf123456u, 0x477fe000u, 0x33000001u};
  for (std::uint32_t k = 0; k < 200; ++k) {
    const std::uint32_t p = 0x30000000u + k * 0x00a5a5a5u;
    const std::uint32_t exp = (p >> 23) & 0xff;
    if (exp != 0 && exp != 0xff) patterns.push_back(p);  // finite, not zero (inf * 0 is NaN) nor subnormal
  }
  for (const std::string& tune : {tune_table("000") + ",wg=64,units=2", tune_table("110") + ",wg=128,units=2"}) {
    ScopedEnv env("NF4_VULKAN_TUNE", tune.c_str());
    Context c(NF4_BACKEND_VULKAN);
    rounding_sweep(c, patterns);                                   // non-finite absmax, finite values
    rounding_sweep(c, patterns, {0x3f800000u, 0x7f800000u});       // +inf among the values
    rounding_sweep(c, patterns, {0x3f800000u, 0x40000000u, 0x7fffffffu});  // NaN among the values
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: packHalf2x16 for fp16 only where the check proved it exact (sampled on CPU devices)") {
  if (!vulkan_available()) return;
  App app;
  // GPUs run the exhaustive check (auto); a CPU device (lavapipe) runs the strided sample, which
  // is a test hook and no proof, so that CI covers the hardware path and the check shader too.
  const bool cpu_device = app.info.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  ScopedEnv mode("NF4_VULKAN_F16_CHECK", cpu_device ? "sample" : "auto");
  ScopedEnv tune("NF4_VULKAN_TUNE", (tune_table("000") + ",wg=64,units=2,pair=0").c_str());
  Context c(NF4_BACKEND_VULKAN);
  const int verdict = vk::f16_verdict(app.info);
  REQUIRE(verdict >= 0);  // the check ran in this process
  MESSAGE(app.info.name() << ": packHalf2x16 " << std::string(verdict ? "equals" : "differs from") << " the integer fp16 rounding on "
                          << std::string(cpu_device ? "a sample of" : "all") << " the non-NaN fp32 inputs"
                          << std::string(verdict ? ": the direct fp16 kernel uses it" : ": integer rounding kept"));
  std::vector<std::uint32_t> patterns;
  const std::uint32_t lows[] = {0x0000, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x8000, 0xffff};
  for (std::uint32_t hi = 0; hi < 0x10000; hi += cpu_device ? 7 : 1) {
    const std::uint32_t exp = (hi >> 7) & 0xff;
    if (exp == 0 || exp == 0xff) continue;
    for (std::uint32_t lo : lows) patterns.push_back(hi << 16 | lo);
  }
  rounding_sweep(c, patterns);
  // An embedded context on the same device and driver takes the verdict of this process.
  nf4_vulkan_context* ctx = app.nf4_context();
  run_embedded(app, ctx, {test::random_weight(40000, NF4_QUANT_NF4, 64, true, 77), test::random_weight(999, NF4_QUANT_FP4, 32, false, 78)},
               {NF4_DTYPE_F16, NF4_DTYPE_F16});
  nf4_vulkan_context_destroy(ctx);
  check_no_validation_messages();
}

TEST_CASE("vulkan: the fast product's bf16 weights by the hardware conversion only where the check proved it exact") {
  // The check runs where the fast product runs on bf16 x (cooperative matrices with bfloat16;
  // NF4_VULKAN_COOP=1); lavapipe and older drivers have no such path, and the exact shader's bits
  // are covered by the other cases.
  if (!vulkan_available()) return;
  App app;
  Context c(NF4_BACKEND_VULKAN);
  const int verdict = vk::f16_verdict(app.info, NF4_DTYPE_BF16);
  test::GemvCase g;
  test::make_gemv_case(g, 37, 4096, 24, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 501);
  std::vector<std::uint8_t> y(static_cast<std::size_t>(g.y_bytes())), y_integer(y.size());
  nf4_gemv_desc d = g.describe(y.data(), g.y_bytes());
  d.mode = NF4_GEMV_FAST;
  nf4_gemv_mode used = NF4_GEMV_EXACT;
  REQUIRE(nf4_gemv_mode_used(c.get(), &d, &used) == NF4_OK);
  if (used != NF4_GEMV_FAST) {
    CHECK(verdict < 0);  // no check where nothing would use its verdict
    MESSAGE("skipped: " << app.info.name() << " runs no fast product on bf16 x here (NF4_VULKAN_COOP=1 and bfloat16 cooperative matrices)");
    return;
  }
  REQUIRE(verdict >= 0);  // the check ran in this process
  MESSAGE(app.info.name() << ": its bf16 conversion " << std::string(verdict ? "equals" : "differs from")
                          << " the integer rounding on all the non-NaN fp32 inputs"
                          << std::string(verdict ? ": the fast product's weights use it" : ": integer rounding kept"));
  REQUIRE(nf4_gemv_host(c.get(), &d) == NF4_OK);
  const test::FastErrors e = test::fast_errors(g, y.data());
  CHECK_MESSAGE(e.outside == 0, e.outside << " outputs past the bound");
  // The integer rounding (a context made with bf16hw=0) gives the same bits: the conversion is
  // used in the form the check proved.
  ScopedEnv tune("NF4_VULKAN_TUNE", "bf16hw=0");
  Context integer(NF4_BACKEND_VULKAN);
  d.y = y_integer.data();
  REQUIRE(nf4_gemv_host(integer.get(), &d) == NF4_OK);
  CHECK(y == y_integer);
  check_no_validation_messages();
}

TEST_CASE("vulkan: subnormal absmax (IEEE where the device preserves fp32 denormals)") {
  if (!vulkan_available()) return;
  App app;
  if (!app.info.denorm_preserve32) {
    MESSAGE("skipped: " << app.info.name() << " does not let nf4 ask for IEEE fp32 denormals (" << app.info.float_controls
                        << "); it may flush fp32 subnormals, as bitsandbytes does");
    return;
  }
  Context c(NF4_BACKEND_VULKAN);
  std::vector<std::uint32_t> patterns;
  for (std::uint32_t m = 1; m < 0x800000u; m = m * 3 + 1) patterns.insert(patterns.end(), {m, 0x80000000u | m});
  for (std::uint32_t e : {1u, 2u, 3u}) patterns.push_back(e << 23 | 0x123456u);  // products near the subnormal edge
  rounding_sweep(c, patterns);
  check_no_validation_messages();
}
