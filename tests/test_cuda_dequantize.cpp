// SPDX-License-Identifier: MIT
// The cuda backend with device pointers, bit for bit against the oracle (and bitsandbytes' own
// output on the golden cases): every size, blocksize and variant, pointers at offsets, large
// tensors, many tensors of mixed dtypes in one call. Without a GPU every case reports a visible
// skip. Fixtures: tests/support/cuda.h.
//
// Environment (the GPU machine's script, lab/gpu_check.sh, sets them):
//   NF4_CUDA_FULL_SWEEP=1  every size 1..4096 x every blocksize x nested/flat x nf4/fp4 x 3 dtypes
//                          (default: a subset that stays quick, also under compute-sanitizer)
//   NF4_CUDA_LARGE=1       geometric sizes up to 2^28 elements
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/checkpoint/checkpoint.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/cuda.h"
#include "tests/support/env.h"

using namespace nf4;
using namespace nf4::test;

TEST_CASE("cuda: every golden case equals bitsandbytes' output, device pointers") {
  if (!cuda_ready()) return;
  const auto& f = test::golden_file();
  Context ctx(NF4_BACKEND_CUDA);
  DeviceArena arena(false, std::size_t{256} << 20);
  struct Item {
    DeviceCase c;
    const io::TensorInfo* expected;
    std::string name;
  };
  std::vector<Item> items;
  for (const auto& gc : test::golden_cases())
    for (nf4_dtype d : test::kDTypes)
      items.push_back(Item{DeviceCase(arena, io::describe(f, gc.param, d, nullptr, 0), Shifts{}), gc.expected[d],
                           gc.case_name + " " + test::dtype_label(d)});
  arena.upload();
  for (auto& it : items) ctx.dequantize(it.c.dev);
  cu(cudaDeviceSynchronize());
  for (auto& it : items) {
    std::vector<std::uint8_t> got;
    const std::int64_t diff = it.c.compare(&got);
    CHECK_MESSAGE(diff == 0, it.name << " vs oracle");
    REQUIRE(it.expected != nullptr);
    CHECK_MESSAGE(test::differing_elements(got.data(), f.data(*it.expected), it.c.host.numel, it.c.host.out_dtype) == 0,
                  it.name << " vs bitsandbytes");
  }
  MESSAGE(items.size() << " golden case x dtype runs compared");
}

TEST_CASE("cuda: random tensors of every size, blocksize and variant") {
  if (!cuda_ready()) return;
  const bool full = env_on("NF4_CUDA_FULL_SWEEP");
  Context ctx(NF4_BACKEND_CUDA);
  std::vector<std::int64_t> sizes;
  if (full) {
    for (std::int64_t n = 1; n <= 4096; ++n) sizes.push_back(n);
  } else {
    for (std::int64_t n = 1; n <= 40; ++n) sizes.push_back(n);
    for (std::int64_t n : {63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025, 2047, 2049, 4095, 4096, 8191, 8193, 65537})
      sizes.push_back(n);
  }
  const int blocksizes[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};
  std::uint64_t seed = 7;
  std::size_t runs = 0;
  for (nf4_dtype d : test::kDTypes) {
    std::vector<cpu::QuantizedWeight> hs;
    std::vector<nf4_tensor> ts;
    hs.reserve(sizes.size() * 32);
    std::size_t variant = 0;
    for (std::int64_t n : sizes)
      for (int bs : blocksizes)
        for (nf4_quant_type qt : test::kQuantTypes)
          for (bool nested : {true, false}) {
            ++variant;
            // Subset: 4 of the 32 variants per size, rotating, so each appears at many sizes.
            if (!full && (variant + static_cast<std::size_t>(n)) % 8 != 0) continue;
            // Nested blocksize varies too (a power of two; 256 in practice).
            const int bs2 = nested ? (1 << (splitmix(seed) % 9)) : 256;
            hs.push_back(synthetic_weight(n, qt, bs, nested, seed++, bs2));
          }
    for (const auto& h : hs) ts.push_back(h.describe(d));
    run_batches(ctx, ts, 40, !full, Shifts{});
    runs += ts.size();
  }
  MESSAGE(runs << " random tensors compared" << std::string(full ? " (full sweep)" : " (subset; NF4_CUDA_FULL_SWEEP=1 for all)"));
}

TEST_CASE("cuda: geometric sizes up to 2^28 elements") {
  if (!cuda_ready()) return;
  if (!env_on("NF4_CUDA_LARGE")) {
    MESSAGE("large sizes skipped (NF4_CUDA_LARGE=1 runs them on the GPU machine)");
    return;
  }
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 1000;
  int i = 0;
  for (std::int64_t n = 5000; n <= (std::int64_t{1} << 28); n = n * 4 + 3) {
    for (std::int64_t m : {n, std::min<std::int64_t>(std::int64_t{1} << 28, n * 2 - 1)}) {
      const nf4_dtype d = test::kDTypes[i % test::kDTypes.size()];
      const cpu::QuantizedWeight h = synthetic_weight(m, i % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64 << (i % 3), i % 4 != 3, seed++);
      run_batches(ctx, {h.describe(d)}, 1, true, Shifts{});
      ++i;
    }
  }
  const cpu::QuantizedWeight h = synthetic_weight(std::int64_t{1} << 28, NF4_QUANT_NF4, 64, true, seed++);
  run_batches(ctx, {h.describe(NF4_DTYPE_BF16)}, 1, true, Shifts{});
  MESSAGE((i + 1) << " large tensors compared, up to 2^28 elements");
}

TEST_CASE("cuda: pointers at offsets into larger buffers (misaligned for vector access)") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 77;
  std::size_t runs = 0;
  for (std::int64_t n : {1, 2, 7, 8, 9, 17, 4097, 65536 + 3})
    for (std::size_t ps : {0, 1, 2, 3})
      for (std::size_t oe : {0, 1, 3, 7}) {
        if (ps == 0 && oe == 0) continue;
        const Shifts s{ps, 4 * (ps + 1), ps + 5, oe};
        std::vector<cpu::QuantizedWeight> hs;
        for (bool nested : {true, false}) hs.push_back(synthetic_weight(n, runs % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64, nested, seed++));
        std::vector<nf4_tensor> ts;
        for (const auto& h : hs)
          for (nf4_dtype d : test::kDTypes) ts.push_back(h.describe(d));
        run_batches(ctx, ts, ts.size(), true, s);
        runs += ts.size();
      }
  MESSAGE(runs << " misaligned runs compared");
}

TEST_CASE("cuda: mixed dtypes and more tensors than one launch holds, in one grouped call") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::vector<cpu::QuantizedWeight> hs;
  std::vector<nf4_tensor> ts;
  for (int i = 0; i < 40; ++i) hs.push_back(synthetic_weight(1000 + 977 * i, i % 3 ? NF4_QUANT_NF4 : NF4_QUANT_FP4, 32 << (i % 8), i % 2, 900 + i));
  for (int i = 0; i < 40; ++i) ts.push_back(hs[i].describe(test::kDTypes[i % test::kDTypes.size()]));
  run_batches(ctx, ts, ts.size(), true, Shifts{});
}
