// SPDX-License-Identifier: MIT
// The cuda backend and its kernels: the device it reports (or why there is none), the tuning table
// against the compiled variants, the fp16/bf16 conversions on all 2^32 inputs, and every compiled
// variant on chunks that start inside absmax blocks. Without a GPU every case that needs one
// reports a visible skip. Fixtures: tests/support/cuda.h.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/tuning.h"
#include "backends/cuda/variants.h"
#include "core/backend.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/cuda.h"

using namespace nf4;
using namespace nf4::test;

TEST_CASE("cuda: the backend reports a device, or why there is none") {
  const RegisteredBackend* b = find_backend(NF4_BACKEND_CUDA);
  REQUIRE(b != nullptr);
  CHECK(b->entry.name == std::string("cuda"));
  REQUIRE(b->compiled_in);
  if (b->available) {
    MESSAGE("cuda device: " << b->device_or_reason);
    Context ctx(NF4_BACKEND_CUDA);
    CHECK(!ctx.device_name().empty());
  } else {
    MESSAGE("cuda unavailable (expected without a GPU): " << b->device_or_reason);
    CHECK(!b->device_or_reason.empty());
    nf4_context* c = nullptr;
    CHECK(nf4_context_create(NF4_BACKEND_CUDA, &c) == NF4_ERR_BACKEND_UNAVAILABLE);
    CHECK(c == nullptr);
  }
}

TEST_CASE("cuda: every tuning-table entry names a compiled kernel variant") {
  // Each entry's small and large configurations, for one tensor and for a grouped launch.
  for (const auto& e : cuda::kTuningTable)
    for (const cuda::KernelConfig& c : {cuda::select_config(e.min_cc, 1), cuda::select_config(e.min_cc, e.small_elements),
                                        cuda::select_config(e.min_cc, 1, 3), cuda::select_config(e.min_cc, e.small_elements, 3)}) {
      CHECK(c.threads % 32 == 0);
      CHECK(c.threads >= 32);
      CHECK(c.threads <= 1024);
      for (nf4_dtype d : test::kDTypes) CHECK_MESSAGE(cuda::has_variant(d, c), "cc " << e.min_cc);
    }
}

TEST_CASE("cuda: fp16/bf16 conversions equal core/half.h on all 2^32 inputs") {
  if (!cuda_ready()) return;
  cuda::testing::ConversionReport r{};
  cu(cuda::testing::exhaustive_conversion_check(&r));
  const unsigned long long nans = 2ull * ((1ull << 23) - 1);  // NaN patterns, minus the canonical one checked
  CHECK(r.checked == (1ull << 32) - nans + 1);
  CHECK_MESSAGE(r.f16_mismatches == 0, "first fp16 mismatch at input bits " << r.first_f16_mismatch);
  CHECK_MESSAGE(r.bf16_mismatches == 0, "first bf16 mismatch at input bits " << r.first_bf16_mismatch);
  char bits[16];
  std::snprintf(bits, sizeof bits, "0x%08x", r.fmul_nan_bits);
  MESSAGE("__fmul_rn(NaN payload 0x7fc12345, 1) on the device gives " << std::string(bits));
}

TEST_CASE("cuda: chunks that start inside absmax blocks, grid-stride CTAs crossing chunks") {
  if (!cuda_ready()) return;
  const cuda::DeviceInfo dev = cuda::query_device(0);
  std::uint64_t seed = 500;
  // Small groups (threads=32) so chunks of 3 groups start inside 4096-element absmax blocks and
  // inside nested blocks; capped grids make each CTA loop over many groups and cross from chunk to
  // chunk (shared table reloads), with and without the pipelined loop. Every compiled variant.
  std::vector<cuda::KernelConfig> configs;
#define NF4_X(u, h, o)                                               \
  configs.push_back(cuda::KernelConfig{32, u, h, cuda::Grid::per_group(), o}); \
  configs.push_back(cuda::KernelConfig{32, u, h, cuda::Grid::per_sm(1), o});   \
  configs.push_back(cuda::KernelConfig{64, u, h, cuda::Grid::occupancy(1), o});
  NF4_CUDA_VARIANTS(NF4_X)
#undef NF4_X
  for (const cuda::KernelConfig& cfg : configs)
    for (nf4_dtype d : test::kDTypes) {
      DeviceArena arena(true);
      std::vector<cpu::QuantizedWeight> hs = {synthetic_weight(300000, NF4_QUANT_NF4, 4096, true, seed++, 2),
                                    synthetic_weight(70001, NF4_QUANT_FP4, 32, true, seed++, 4),
                                    synthetic_weight(12345, NF4_QUANT_NF4, 128, false, seed++)};
      std::vector<DeviceCase> cases;
      cases.reserve(hs.size());
      for (const auto& h : hs) cases.emplace_back(arena, h.describe(d), Shifts{});
      std::vector<nf4_tensor> devs;
      for (const auto& c : cases) devs.push_back(c.dev);
      const std::int64_t per_group = std::int64_t{cfg.threads} * cfg.units * cuda::unit_elements(d);
      cuda::enqueue(devs.data(), devs.size(), nullptr, dev, cfg, 3 * per_group);
      cu(cudaDeviceSynchronize());
      for (const auto& c : cases) CHECK_MESSAGE(c.compare() == 0, label(c.host) << " threads=" << cfg.threads << " grid=" << cfg.grid.shape << "x" << cfg.grid.factor);
    }
}
