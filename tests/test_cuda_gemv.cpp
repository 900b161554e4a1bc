// SPDX-License-Identifier: MIT
// The cuda matrix-vector product with device pointers (nf4_gemv on the context's stream), bit for
// bit against the oracle. Every input in its own exact-size allocation (compute-sanitizer sees any
// access past an array), y between poisoned guard bytes that must survive. Without a GPU every
// case reports a visible skip.
//
// NF4_CUDA_LARGE=1 adds a weight of more than 2^31 elements (64-bit offsets), checked on sampled
// rows past the 2^31st element, and products of 2^26 and 2^26 + 1024 columns (the fast kernel's
// widest k and the first past it).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/gemv_oracle.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemv_backend.h"
#include "backends/cuda/gemv_launch.h"
#include "core/backend.h"
#include "core/gemv.h"
#include "nf4/nf4.hpp"
#include "tests/support/cuda.h"
#include "tests/support/gemv.h"
#include "tests/support/gemv_fast.h"

using namespace nf4;
using cuda::DeviceBuffer;
using test::cu;
using test::kGuard;
using test::TestStream;

namespace {

// One exact-size device allocation per array, `shift` bytes into it.
struct DeviceGemvCase {
  std::vector<DeviceBuffer> bufs;
  nf4_tensor wt{};
  nf4_gemv_desc g{};
  std::uint8_t* y_region = nullptr;
  std::size_t y_bytes = 0;

  template <typename T = std::uint8_t>
  T* put(const void* src, std::size_t bytes, std::size_t shift, std::uint8_t poison = 0xA5) {
    bufs.emplace_back(bytes + shift);
    auto* d = static_cast<std::uint8_t*>(bufs.back().get()) + shift;
    std::vector<std::uint8_t> tmp(bytes, poison);
    if (src) std::memcpy(tmp.data(), src, bytes);
    cu(cudaMemcpy(d, tmp.data(), bytes, cudaMemcpyHostToDevice));
    return reinterpret_cast<T*>(d);
  }

  // x_shift / packed_shift in bytes (x_shift a multiple of the x element size).
  DeviceGemvCase(const test::GemvCase& c, std::size_t packed_shift, std::size_t x_shift) {
    const nf4_tensor& h = c.wt;
    const TensorSizes z = expected_sizes(h);
    wt = h;
    wt.packed = put(h.packed, static_cast<std::size_t>(z.packed_bytes), packed_shift);
    wt.absmax = h.nested ? static_cast<const void*>(put(h.absmax, static_cast<std::size_t>(z.absmax_count), 1))
                         : static_cast<const void*>(put(h.absmax, static_cast<std::size_t>(z.absmax_count) * 4, 4));
    if (h.quant_map) wt.quant_map = put<const float>(h.quant_map, 64, 0);
    if (h.nested) {
      wt.nested_absmax = put<const float>(h.nested_absmax, static_cast<std::size_t>(z.nested_absmax_count) * 4, 0);
      wt.nested_code = put<const float>(h.nested_code, 1024, 0);
    }
    g = c.describe(nullptr, c.y_bytes());
    g.weight = &wt;
    g.x = put(c.x.data(), c.x.size(), x_shift);
    y_bytes = static_cast<std::size_t>(c.y_bytes());
    y_region = put(nullptr, kGuard + y_bytes + kGuard, 0);
    g.y = y_region + kGuard;
  }

  // Differing elements against `expected`; -1 if a guard byte changed.
  std::int64_t compare(const std::vector<std::uint8_t>& expected, std::int64_t elements, nf4_dtype d) const {
    std::vector<std::uint8_t> got(kGuard + y_bytes + kGuard);
    cu(cudaMemcpy(got.data(), y_region, got.size(), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kGuard; ++i)
      if (got[i] != 0xA5 || got[kGuard + y_bytes + i] != 0xA5) return -1;
    return test::differing_elements(expected.data(), got.data() + kGuard, elements, d);
  }
};

}  // namespace

TEST_CASE("cuda gemv: every tuning entry names a compiled variant") {
  for (const cuda::GemvTuning& t : cuda::kGemvTuning) CHECK_MESSAGE(cuda::gemv_has_variant(t), "cc " << t.min_cc);
  for (const cuda::GemvFastTuning& t : cuda::kGemvFastTuning) CHECK_MESSAGE(cuda::gemv_fast_has_variant(t), "fast, cc " << t.min_cc);
}

TEST_CASE("cuda gemv: device pointers, vector and element paths, against the oracle") {
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 20000;
  int runs = 0;
  const std::int64_t ks[] = {1, 7, 32, 33, 64, 96, 100, 1024, 1056, 2048, 3000, 4096, 4128, 14336};
  for (std::int64_t k : ks)
    for (std::int64_t n : {1, 3, 70})
      for (std::int32_t m : {1, 2, 3, 4, 5, 8}) {
        const std::uint64_t s = seed++;
        test::GemvCase c;
        test::make_gemv_case(c, n, k, m, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, (s / 2) % 2 ? 64 : 32 << (s % 8), (s / 3) % 2 == 0,
                             test::kProductDTypes[s % test::kProductDTypes.size()], test::kProductDTypes[(s / 5) % test::kProductDTypes.size()], s);
        const auto expected = c.oracle();
        // Aligned (the vector path where k allows), then codes and x off their 16-byte alignment.
        for (const auto& [ps, xs] : {std::pair<std::size_t, std::size_t>{0, 0}, {1, 0}, {0, 4}}) {
          DeviceGemvCase d(c, ps, xs);
          const nf4_status st = nf4_gemv(ctx.get(), &d.g);
          REQUIRE_MESSAGE(st == NF4_OK, std::string(nf4_last_error(ctx.get())));
          cu(cudaDeviceSynchronize());
          const std::int64_t diff = d.compare(expected, c.m * c.n, c.y_dtype);
          CHECK_MESSAGE(diff == 0, c.label() << " shifts " << ps << "/" << xs << (diff < 0 ? ": wrote outside y" : ": differ: " + std::to_string(diff)));
          ++runs;
        }
      }
  MESSAGE(runs << " device-pointer gemv runs compared");
}

TEST_CASE("cuda gemv: every compiled shape of the fast kernel, x staged or not, against the oracle") {
  if (!test::cuda_ready()) return;
  const cuda::DeviceInfo dev = cuda::query_device(0);
  if (dev.cc < 80) {
    MESSAGE("fast gemv kernel cases skipped: sm_" << dev.cc << " runs gemv.cu's kernel");
    return;
  }
  int runs = 0;
  std::uint64_t seed = 30000;
  // Row tails of every R (n % 4 = 1, 2, 3), k below a chunk, not a multiple of a chunk, several
  // chunks (padding to a power of two), and every m bucket.
  for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{1, 32}, {5, 96}, {6, 1024}, {7, 3072}, {33, 4128}, {130, 14336}})
    for (std::int32_t m : {1, 2, 3, 4, 6, 8}) {
      const std::uint64_t s = seed++;
      test::GemvCase c;
      test::make_gemv_case(c, n, k, m, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, (s / 2) % 2 ? 64 : 256, (s / 3) % 2 == 0,
                           test::kProductDTypes[s % test::kProductDTypes.size()], test::kProductDTypes[(s / 5) % test::kProductDTypes.size()], s);
      const auto expected = c.oracle();
      DeviceGemvCase d(c, 0, 0);
      const int bucket = m <= 1 ? 0 : m <= 2 ? 1 : m <= 4 ? 2 : 3;
      {
        cuda::GemvChoice legacy;
        legacy.legacy = true;
        cu(cudaMemset(d.g.y, 0xA5, d.y_bytes));
        cuda::enqueue_gemv(validate_gemv(d.g), nullptr, dev, legacy);
        cu(cudaDeviceSynchronize());
        CHECK_MESSAGE(d.compare(expected, c.m * c.n, c.y_dtype) == 0, c.label() << " legacy kernel");
      }
      // split: a row group's chunk tree over 1..8 warps (capped by the chunk count: k = 3072 and
      // 4128 pad to 4 and 8 chunks, so some parts hold padding chunks only); 0: chosen per shape.
      for (int threads : {64, 128, 256})
        for (int rows : {1, 2, 4})
          for (std::int64_t x_shared : {std::int64_t{0}, std::int64_t{1} << 20})
            for (int split : {0, 1, 2, 4, 8}) {
              cuda::GemvFastTuning t = *cuda::gemv_fast_tuning_for(dev.cc);
              t.threads = threads;
              t.rows[bucket] = rows;
              t.x_shared_max[bucket] = x_shared;
              t.split = split;
              if (!cuda::gemv_fast_has_variant(t)) continue;
              cuda::GemvChoice choice;
              choice.fast = t;
              cu(cudaMemset(d.g.y, 0xA5, d.y_bytes));
              cuda::enqueue_gemv(validate_gemv(d.g), nullptr, dev, choice);
              cu(cudaDeviceSynchronize());
              const std::int64_t diff = d.compare(expected, c.m * c.n, c.y_dtype);
              CHECK_MESSAGE(diff == 0, c.label() << " threads " << threads << " rows " << rows << " x_shared " << x_shared << " split "
                                                 << split << (diff < 0 ? ": wrote outside y" : ": differ: " + std::to_string(diff)));
              ++runs;
            }
    }
  MESSAGE(runs << " fast-kernel gemv runs compared");
}

TEST_CASE("cuda gemv: batch invariance and repeatability on the device") {
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  test::GemvCase c;
  test::make_gemv_case(c, 300, 4096, 8, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 31);
  DeviceGemvCase d(c, 0, 0);
  REQUIRE(nf4_gemv(ctx.get(), &d.g) == NF4_OK);
  cu(cudaDeviceSynchronize());
  std::vector<std::uint8_t> all(d.y_bytes), again(d.y_bytes);
  cu(cudaMemcpy(all.data(), d.g.y, d.y_bytes, cudaMemcpyDeviceToHost));
  for (int rep = 0; rep < 3; ++rep) {
    REQUIRE(nf4_gemv(ctx.get(), &d.g) == NF4_OK);
    cu(cudaMemcpy(again.data(), d.g.y, d.y_bytes, cudaMemcpyDeviceToHost));
    CHECK(again == all);
  }
  const std::size_t row_bytes = static_cast<std::size_t>(c.n) * 2;
  for (std::int32_t j = 0; j < 8; ++j) {
    nf4_gemv_desc one = d.g;
    one.m = 1;
    one.x = static_cast<const std::uint8_t*>(d.g.x) + static_cast<std::size_t>(j * c.k) * 2;
    REQUIRE(nf4_gemv(ctx.get(), &one) == NF4_OK);
    std::vector<std::uint8_t> row(row_bytes);
    cu(cudaMemcpy(row.data(), one.y, row_bytes, cudaMemcpyDeviceToHost));
    CHECK_MESSAGE(std::memcmp(row.data(), all.data() + row_bytes * static_cast<std::size_t>(j), row_bytes) == 0, "row " << j);
  }
}

TEST_CASE("cuda gemv: bad device descriptions are refused before any launch") {
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  test::GemvCase c;
  test::make_gemv_case(c, 4, 64, 2, NF4_QUANT_NF4, 64, false, NF4_DTYPE_F32, NF4_DTYPE_F32, 41);
  DeviceGemvCase d(c, 0, 0);
  nf4_gemv_desc g = d.g;
  g.x = static_cast<const std::uint8_t*>(g.x) + 2;  // fp32 x must be 4-byte aligned
  CHECK(nf4_gemv(ctx.get(), &g) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nf4_last_error(ctx.get())).find("x must be 4-byte aligned") != std::string::npos);
  g = d.g;
  g.y = const_cast<void*>(g.x);
  CHECK(nf4_gemv(ctx.get(), &g) == NF4_ERR_ALIASING);
  CHECK(d.compare(std::vector<std::uint8_t>(d.y_bytes, 0xA5), c.m * c.n, c.y_dtype) == 0);  // y untouched
}

TEST_CASE("cuda gemv: a prepared product gives nf4_gemv's bits with the prepared and with new x and y, on any stream") {
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 60000;
  for (std::int64_t k : {100, 4096})
    for (std::int32_t m : {1, 3, 8}) {
      const std::uint64_t s = seed++;
      test::GemvCase c, c2;
      test::make_gemv_case(c, 70, k, m, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, test::kProductDTypes[s % test::kProductDTypes.size()], s);
      CAPTURE(c.label());
      DeviceGemvCase d(c, 0, 0);
      nf4_gemv_prepared* raw = nullptr;
      REQUIRE_MESSAGE(nf4_gemv_prepare(ctx.get(), &d.g, &raw) == NF4_OK, std::string(nf4_last_error(ctx.get())));
      const std::unique_ptr<nf4_gemv_prepared, void (*)(nf4_gemv_prepared*)> p(raw, nf4_gemv_prepared_destroy);
      // The caller's description may change or go away after preparing.
      d.g.n = -1;
      d.wt.numel = 0;
      REQUIRE(nf4_gemv_prepared_launch(p.get(), nullptr, nullptr, nullptr) == NF4_OK);
      cu(cudaDeviceSynchronize());
      CHECK(d.compare(c.oracle(), c.m * c.n, c.y_dtype) == 0);
      // New activations (same shape and dtype, another allocation) into a new output, on a stream.
      test::make_gemv_case(c2, 70, k, m, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, c.y_dtype, s + 500);
      c2.w = c.w;  // the prepared weight
      c2.wt = c2.w.describe(NF4_DTYPE_F32, nullptr, 0);
      DeviceBuffer x2(c2.x.size()), y2(kGuard + d.y_bytes + kGuard);
      cu(cudaMemcpy(x2.get(), c2.x.data(), c2.x.size(), cudaMemcpyHostToDevice));
      cu(cudaMemset(y2.get(), 0xA5, kGuard + d.y_bytes + kGuard));
      const TestStream stream;
      auto* y2p = static_cast<std::uint8_t*>(y2.get()) + kGuard;
      REQUIRE_MESSAGE(nf4_gemv_prepared_launch(p.get(), x2.get(), y2p, stream) == NF4_OK, std::string(nf4_last_error(ctx.get())));
      cu(cudaStreamSynchronize(stream));
      std::vector<std::uint8_t> got(kGuard + d.y_bytes + kGuard);
      cu(cudaMemcpy(got.data(), y2.get(), got.size(), cudaMemcpyDeviceToHost));
      CHECK(test::differing_elements(c2.oracle().data(), got.data() + kGuard, c.m * c.n, c.y_dtype) == 0);
      CHECK(std::all_of(got.begin(), got.begin() + kGuard, [](std::uint8_t b) { return b == 0xA5; }));
      CHECK(std::all_of(got.end() - kGuard, got.end(), [](std::uint8_t b) { return b == 0xA5; }));
      // Bad pointers at launch: refused, nothing written.
      const std::vector<std::uint8_t> before = got;
      CHECK(nf4_gemv_prepared_launch(p.get(), x2.get(), x2.get(), nullptr) == NF4_ERR_ALIASING);
      CHECK(nf4_gemv_prepared_launch(p.get(), nullptr, const_cast<std::uint8_t*>(d.wt.packed), nullptr) == NF4_ERR_ALIASING);
      CHECK(std::string(nf4_last_error(ctx.get())).find("packed") != std::string::npos);
      CHECK(nf4_gemv_prepared_launch(p.get(), nullptr, y2p + 1, nullptr) == NF4_ERR_INVALID_ARGUMENT);
      if (k % 32 == 0) {  // prepared with a 16-byte aligned x: the 16-byte loads need every x aligned so
        CHECK(nf4_gemv_prepared_launch(p.get(), static_cast<std::uint8_t*>(x2.get()) + 2, y2p, nullptr) == NF4_ERR_INVALID_ARGUMENT);
        CHECK(std::string(nf4_last_error(ctx.get())).find("16-byte") != std::string::npos);
      }
      cu(cudaDeviceSynchronize());
      cu(cudaMemcpy(got.data(), y2.get(), got.size(), cudaMemcpyDeviceToHost));
      CHECK(got == before);
    }
}

namespace {

// Row j of c's x as a product of its own (m = 1) with c's weight.
void row_case(test::GemvCase& one, const test::GemvCase& c, std::int32_t j) {
  test::make_gemv_case(one, c.n, c.k, 1, NF4_QUANT_NF4, 64, false, c.x_dtype, c.y_dtype, 0);
  one.w = c.w;
  one.wt = c.w.describe(NF4_DTYPE_F32, nullptr, 0);
  const auto row = static_cast<std::ptrdiff_t>(c.k * static_cast<std::int64_t>(nf4_dtype_size(c.x_dtype)));
  one.x.assign(c.x.begin() + j * row, c.x.begin() + (j + 1) * row);
}

// A workspace of `bytes` (none for 0), every byte 0xFF (a NaN in every float) so that a sum read
// from a slot no CTA wrote shows in y.
DeviceBuffer poisoned_workspace(std::int64_t bytes) {
  if (bytes <= 0) return {};
  DeviceBuffer w(static_cast<std::size_t>(bytes));
  cu(cudaMemset(w.get(), 0xFF, static_cast<std::size_t>(bytes)));
  return w;
}

// The fast contract of d on the device: through nf4_gemv, or through the backend with a forced
// kernel choice (sm_75's m16n8k8 steps, a kernel or a schedule of the parts); with the workspace
// the plan asks for where it asks for one (nf4_gemv_workspace_size), as a caller that gives one;
// y copied back.
std::vector<std::uint8_t> run_fast(Context& ctx, DeviceGemvCase& d, const cuda::GemvMmaChoice& forced = {}) {
  d.g.mode = NF4_GEMV_FAST;
  DeviceBuffer workspace;
  if (!forced.automatic()) {
    ValidGemv v = validate_gemv(d.g);
    cuda::GemvChoice choice;
    choice.mma = forced;
    const cuda::DeviceInfo dev = cuda::query_device(0);
    workspace = poisoned_workspace(cuda::gemv_workspace_bytes(v, dev, choice));
    v.desc.workspace = workspace.get();
    v.desc.workspace_bytes = static_cast<std::int64_t>(workspace.size());
    cuda::enqueue_gemv(v, nullptr, dev, choice);
  } else {
    std::size_t bytes = 0;
    REQUIRE_MESSAGE(nf4_gemv_workspace_size(ctx.get(), &d.g, &bytes) == NF4_OK, std::string(nf4_last_error(ctx.get())));
    workspace = poisoned_workspace(static_cast<std::int64_t>(bytes));
    nf4_gemv_desc g = d.g;
    g.workspace = workspace.get();
    g.workspace_bytes = static_cast<std::int64_t>(workspace.size());
    REQUIRE_MESSAGE(nf4_gemv(ctx.get(), &g) == NF4_OK, std::string(nf4_last_error(ctx.get())));
  }
  cu(cudaDeviceSynchronize());
  std::vector<std::uint8_t> y(d.y_bytes);
  cu(cudaMemcpy(y.data(), d.g.y, d.y_bytes, cudaMemcpyDeviceToHost));
  return y;
}

}  // namespace

namespace {
// The kernels that stage x per CTA: the wide kernels, and the warpgroup kernels where the build
// and device have them, the cluster form with one, two and four parts of k per CTA and the split
// forms (64 tokens with one, two and every part per CTA, 128 with one, two and four: each part's
// sums left in its slot for the addition kernel, or the first CTA of an item adding its parts
// itself, where the 128-token form takes two or more and wherever one CTA takes them all, then
// with no addition kernel), and the 256-token form (its total in shared memory) with one, two, four
// and every part per CTA and by its model (two CTAs an item: the relay); run with the workspace
// they ask for, run_fast.
std::vector<cuda::GemvMmaChoice> wide_choices(int cc) {
  std::vector<cuda::GemvMmaChoice> choices;
  const auto add = [&](cuda::GemvMmaKernel kernel, int parts) {
    cuda::GemvMmaChoice c;
    c.kernel = kernel;
    c.cluster_parts = parts;
    choices.push_back(c);
  };
  add(cuda::GemvMmaKernel::wide32, 0);
  add(cuda::GemvMmaKernel::wide64, 0);
  if (cuda::gemv_wgmma_available(cc)) {
    add(cuda::GemvMmaKernel::wgmma64, 0);
    add(cuda::GemvMmaKernel::wgmma128, 0);
    add(cuda::GemvMmaKernel::wgmma64_cluster, 1);
    add(cuda::GemvMmaKernel::wgmma64_cluster, 2);
    add(cuda::GemvMmaKernel::wgmma64_cluster, 4);
    add(cuda::GemvMmaKernel::wgmma64_split, 1);
    add(cuda::GemvMmaKernel::wgmma64_split, 2);
    add(cuda::GemvMmaKernel::wgmma64_split, 8);  // every part in one CTA (fewer where k has fewer): no addition kernel
    add(cuda::GemvMmaKernel::wgmma128_split, 1);
    add(cuda::GemvMmaKernel::wgmma128_split, 2);
    add(cuda::GemvMmaKernel::wgmma128_split, 4);
    // Four parts a CTA where k has eight: two CTAs an item, the relay (its pairs hand the running
    // total over distributed shared memory) where its pairs take no more waves than the CTAs.
    for (const int parts : {0, 1, 2, 4, 8}) add(cuda::GemvMmaKernel::wgmma256, parts);
  }
  return choices;
}
}  // namespace

TEST_CASE("cuda gemv fast: tensor cores within the bound; vector and element paths, every kernel, schedule and token tile give the same bits") {
  if (!test::cuda_ready()) return;
  const cuda::DeviceInfo dev = cuda::query_device(0);
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 74000;
  int runs = 0;
  double worst_rel = 0, worst_use = 0;
  for (std::int64_t k : {32, 96, 1000, 4096, 4128})
    for (std::int64_t n : {1, 17, 300})
      for (std::int32_t m : {1, 9, 17, 33, 200}) {
        const std::uint64_t s = seed++;
        const nf4_dtype xd = s % 2 ? NF4_DTYPE_F16 : NF4_DTYPE_BF16;
        test::GemvCase c;
        test::make_gemv_case(c, n, k, m, (s / 2) % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 32 << (s % 4), (s / 3) % 2 == 0, xd, test::kProductDTypes[s % test::kProductDTypes.size()], s);
        CAPTURE(c.label());
        if (!cuda::gemv_mma_available(dev.cc, xd)) {
          MESSAGE("sm_" << dev.cc << " has no tensor-core path for " << c.label() << ": exact contract");
          continue;
        }
        DeviceGemvCase aligned(c, 0, 0), shifted(c, 1, 2);  // shifted: codes and x off 16 bytes, the element path
        const auto y = run_fast(ctx, aligned);
        CHECK(aligned.compare(y, c.m * c.n, c.y_dtype) == 0);  // guards intact
        CHECK(run_fast(ctx, shifted) == y);
        if (k % 32 == 0) {
          // The vector path's kernels and schedules of the parts: the same sums in the same order.
          for (const auto schedule : {cuda::GemvMmaSchedule::split, cuda::GemvMmaSchedule::single}) {
            cuda::GemvMmaChoice forced;
            forced.schedule = schedule;
            forced.kernel = cuda::GemvMmaKernel::ring;
            CHECK(run_fast(ctx, aligned, forced) == y);
            for (const auto kernel : {cuda::GemvMmaKernel::stream1, cuda::GemvMmaKernel::stream2}) {
              forced.kernel = kernel;
              CAPTURE(static_cast<int>(kernel));
              CAPTURE(static_cast<int>(schedule));
              CHECK(run_fast(ctx, aligned, forced) == y);
            }
            if (m <= 8) {  // the 8-warp form of one row tile (devices of 99 KB of shared memory)
              forced.kernel = cuda::GemvMmaKernel::stream1;
              forced.stream_warps = 8;
              CHECK(run_fast(ctx, aligned, forced) == y);
              forced.stream_warps = 0;
            }
          }
          for (const auto& wide : wide_choices(dev.cc)) {  // every part in turn, or a cluster's: their own schedules
            CAPTURE(static_cast<int>(wide.kernel));
            CAPTURE(wide.cluster_parts);
            CHECK(run_fast(ctx, aligned, wide) == y);
          }
        }
        CHECK(shifted.compare(y, c.m * c.n, c.y_dtype) == 0);
        const test::FastErrors e = test::fast_errors(c, y.data());
        CHECK_MESSAGE(e.outside == 0, e.outside << " outputs past the bound");
        worst_rel = std::max(worst_rel, e.max_rel);
        worst_use = std::max(worst_use, e.worst_bound_use);
        // The first row alone (m = 1: the streaming kernel) gives the batch's bits (m = 200: the automatic choice).
        test::GemvCase one;
        row_case(one, c, 0);
        DeviceGemvCase d1(one, 0, 0);
        const auto y1 = run_fast(ctx, d1);
        CHECK(std::memcmp(y1.data(), y.data(), y1.size()) == 0);
        runs += 3;
      }
  MESSAGE(runs << " fast-contract runs; max relative error vs float64 " << worst_rel << ", largest fraction of the bound used " << worst_use
                << std::string(cuda::gemv_wgmma_available(dev.cc) ? "; the warpgroup kernels included" : "; no warpgroup kernel on this device or build"));
}

TEST_CASE("cuda gemv fast: the streaming kernel's forms on shapes small enough for racecheck") {
  // Two or three row tiles (a CTA or two), k of 8, 32 and 48 full chunks and a partial one (split:
  // parts of a few chunks each; single: one warp through every part in turn, its three-chunk turn
  // wrapping the ring's stages many times), x staged or in registers as the plan chooses per m,
  // 16 and 8 warps: ring stages refilled while other lanes read the stages beside them. The bits
  // against the ring kernel's. Racecheck runs this case (lab/gpu_gemv.sh), the one above taking
  // minutes under it.
  if (!test::cuda_ready()) return;
  const cuda::DeviceInfo dev = cuda::query_device(0);
  if (!cuda::gemv_mma_available(dev.cc, NF4_DTYPE_BF16) || dev.cc < 80) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 91000;
  int runs = 0;
  for (std::int64_t k : {1056, 4128, 6176})
    for (std::int64_t n : {17, 33})
      for (std::int32_t m : {1, 5, 16}) {
        const std::uint64_t s = seed++;
        test::GemvCase c;
        test::make_gemv_case(c, n, k, m, NF4_QUANT_NF4, 64, s % 2 == 0, NF4_DTYPE_BF16, NF4_DTYPE_BF16, s);
        CAPTURE(c.label());
        DeviceGemvCase d(c, 0, 0);
        cuda::GemvMmaChoice ring;
        ring.kernel = cuda::GemvMmaKernel::ring;
        const auto y = run_fast(ctx, d, ring);
        for (const auto schedule : {cuda::GemvMmaSchedule::split, cuda::GemvMmaSchedule::single})
          for (const auto kernel : {cuda::GemvMmaKernel::stream1, cuda::GemvMmaKernel::stream2})
            for (const int warps : {0, 8}) {
              if (warps == 8 && (kernel != cuda::GemvMmaKernel::stream1 || m > 8)) continue;
              cuda::GemvMmaChoice forced;
              forced.schedule = schedule;
              forced.kernel = kernel;
              forced.stream_warps = warps;
              CAPTURE(static_cast<int>(kernel));
              CAPTURE(static_cast<int>(schedule));
              CAPTURE(warps);
              CHECK(run_fast(ctx, d, forced) == y);
              ++runs;
            }
      }
  MESSAGE(runs << " streaming-kernel runs compared with the ring kernel");
}

TEST_CASE("cuda gemv fast: the wide kernels walk several items per CTA or cluster (more items than resident CTAs)") {
  // The small shapes above give every CTA one item; here 2 token blocks of 141 row blocks exceed
  // the resident CTAs (one per SM) of any device this runs on, so CTAs take a second item and
  // reuse their x stages and code rings after the item's last barrier. With k of 67 chunks the
  // parts are 8 (the cluster form: 8, 4 or 2 CTAs per item; 72 items exceed the clusters resident
  // at once, about SMs / 8, SMs / 4 or SMs / 2, so each CTA's sums, read by others over distributed
  // shared memory, are overwritten by its next item after the read). Racecheck runs this case.
  if (!test::cuda_ready()) return;
  const cuda::DeviceInfo dev = cuda::query_device(0);
  if (!cuda::gemv_mma_available(dev.cc, NF4_DTYPE_BF16) || dev.cc < 80) return;
  Context ctx(NF4_BACKEND_CUDA);
  // Then 70 row blocks with k of 65 chunks (8 parts, the last short, the last chunk half): 70
  // items of the 256-token form, so its relay's pairs (about SMs / 2 resident) take a second item
  // after handing the first's totals over; that form's choices only (the others walk items in the
  // shapes before, and under racecheck each choice at this size takes seconds). Last, 200 tokens
  // with k of SMs / 2 + 6 chunks (the last half): x's image has 16 units a chunk, more than its
  // grid of 8 CTAs an SM, so its CTAs load their next unit while storing one.
  struct Shape {
    std::int64_t n, k;
    std::int32_t m;
    bool wgmma256_only;
  };
  for (const Shape shape : {Shape{141 * 128 - 5, 288, 100, false}, Shape{36 * 128 - 5, 67 * 128, 100, false}, Shape{70 * 128 - 5, 64 * 128 + 64, 17, true},
                           Shape{2 * 128 - 3, (dev.sms / 2 + 5) * std::int64_t{128} + 64, 200, true}}) {
    const std::int64_t n = shape.n, k = shape.k;
    test::GemvCase c;
    test::make_gemv_case(c, n, k, shape.m, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F32, 77001);
    CAPTURE(c.label());
    CAPTURE(cuda::gemv_mma_split(k));
    DeviceGemvCase d(c, 0, 0);
    cuda::GemvMmaChoice stream;
    stream.kernel = cuda::GemvMmaKernel::stream2;
    const auto want = run_fast(ctx, d, stream);
    for (const auto& wide : wide_choices(dev.cc)) {
      if (shape.wgmma256_only && wide.kernel != cuda::GemvMmaKernel::wgmma256) continue;
      CAPTURE(static_cast<int>(wide.kernel));
      CAPTURE(wide.cluster_parts);
      CHECK(run_fast(ctx, d, wide) == want);
      CHECK(d.compare(want, c.m * c.n, c.y_dtype) == 0);  // guards intact
    }
    // The bound on the small k (a float64 reference of the large one takes minutes on a CPU).
    if (k == 288) {
      const test::FastErrors e = test::fast_errors(c, want.data());
      CHECK_MESSAGE(e.outside == 0, e.outside << " outputs past the bound");
    }
  }
}

TEST_CASE("cuda gemv fast: sm_75's m16n8k8 steps (forced on this device) are within the bound and batch-invariant") {
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 75000;
  cuda::GemvMmaChoice k8;
  k8.k8 = true;
  for (std::int64_t k : {64, 1000, 4096}) {
    test::GemvCase c;
    test::make_gemv_case(c, 70, k, 40, NF4_QUANT_NF4, 64, true, NF4_DTYPE_F16, NF4_DTYPE_F32, seed++);
    CAPTURE(c.label());
    DeviceGemvCase d(c, 0, 0);
    const auto y = run_fast(ctx, d, k8);
    CHECK(test::fast_errors(c, y.data()).outside == 0);
    CHECK(run_fast(ctx, d, k8) == y);
    const std::size_t row_bytes = static_cast<std::size_t>(c.n) * 4;
    for (std::int32_t j : {0, 7, 39}) {
      test::GemvCase one;
      row_case(one, c, j);
      DeviceGemvCase d1(one, 0, 0);
      CHECK(std::memcmp(run_fast(ctx, d1, k8).data(), y.data() + row_bytes * static_cast<std::size_t>(j), row_bytes) == 0);
    }
  }
}

TEST_CASE("cuda gemv fast: a prepared product runs the fast contract with new x and y") {
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  test::GemvCase c;
  test::make_gemv_case(c, 130, 4096, 24, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 76000);
  DeviceGemvCase d(c, 0, 0);
  const auto y = run_fast(ctx, d);
  nf4_gemv_prepared* raw = nullptr;
  REQUIRE(nf4_gemv_prepare(ctx.get(), &d.g, &raw) == NF4_OK);
  const std::unique_ptr<nf4_gemv_prepared, void (*)(nf4_gemv_prepared*)> p(raw, nf4_gemv_prepared_destroy);
  const bool fast = cuda::gemv_mma_available(cuda::query_device(0).cc, c.x_dtype);
  CHECK(nf4_gemv_prepared_mode(p.get()) == (fast ? NF4_GEMV_FAST : NF4_GEMV_EXACT));
  DeviceBuffer y2(d.y_bytes);
  REQUIRE(nf4_gemv_prepared_launch(p.get(), nullptr, y2.get(), nullptr) == NF4_OK);
  cu(cudaDeviceSynchronize());
  std::vector<std::uint8_t> got(d.y_bytes);
  cu(cudaMemcpy(got.data(), y2.get(), d.y_bytes, cudaMemcpyDeviceToHost));
  CHECK(got == y);
}

TEST_CASE("cuda gemv fast: a workspace changes the kernel, never the bits; prepared, it is every launch's") {
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  // 4096 rows, 64 tokens: 32 items of four parts, where the split form is the fastest plan on sm_90.
  test::GemvCase c;
  test::make_gemv_case(c, 4096, 4096, 64, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 77000);
  DeviceGemvCase d(c, 0, 0);
  d.g.mode = NF4_GEMV_FAST;
  std::size_t bytes = 0;
  REQUIRE(nf4_gemv_workspace_size(ctx.get(), &d.g, &bytes) == NF4_OK);
  const cuda::DeviceInfo dev = cuda::query_device(0);
  CAPTURE(bytes);
  CHECK((bytes > 0) == cuda::gemv_wgmma_available(dev.cc));
  const auto read_y = [&](const void* y) {
    cu(cudaDeviceSynchronize());
    std::vector<std::uint8_t> got(d.y_bytes);
    cu(cudaMemcpy(got.data(), y, d.y_bytes, cudaMemcpyDeviceToHost));
    return got;
  };
  REQUIRE(nf4_gemv(ctx.get(), &d.g) == NF4_OK);  // no workspace: another kernel
  const std::vector<std::uint8_t> without = read_y(d.g.y);
  CHECK(test::fast_errors(c, without.data()).outside == 0);
  // With the workspace (poisoned: a slot read before it is written shows), and with one a byte
  // short of it (not used): the same bits.
  DeviceBuffer workspace = poisoned_workspace(static_cast<std::int64_t>(bytes) + 64);
  for (const std::int64_t given : {static_cast<std::int64_t>(bytes), static_cast<std::int64_t>(bytes) - 1}) {
    if (given <= 0) continue;
    CAPTURE(given);
    nf4_gemv_desc g = d.g;
    g.workspace = workspace.get();
    g.workspace_bytes = given;
    cu(cudaMemset(d.g.y, 0, d.y_bytes));
    REQUIRE_MESSAGE(nf4_gemv(ctx.get(), &g) == NF4_OK, std::string(nf4_last_error(ctx.get())));
    CHECK(read_y(d.g.y) == without);
  }
  // At NF4_LOG's debug level the plan is logged: here the split form's warpgroup kernel, x's image
  // laid out first (a callback sees every level).
  if (bytes > 0) {
    std::vector<std::string> debug;
    nf4_set_log_callback(
        [](nf4_log_level level, const char* message, void* user) {
          if (level == NF4_LOG_DEBUG) static_cast<std::vector<std::string>*>(user)->emplace_back(message);
        },
        &debug);
    nf4_gemv_desc g = d.g;
    g.workspace = workspace.get();
    g.workspace_bytes = static_cast<std::int64_t>(bytes);
    const nf4_status logged = nf4_gemv(ctx.get(), &g);
    nf4_set_log_callback(nullptr, nullptr);
    REQUIRE(logged == NF4_OK);
    const auto plan = std::find_if(debug.begin(), debug.end(), [](const std::string& m) { return m.find("gemv fast 4096x4096 m 64: ") == 0; });
    REQUIRE(plan != debug.end());
    CAPTURE(*plan);
    CHECK(plan->find("gemv_mma_wgmma_kernel") != std::string::npos);
    CHECK(plan->find("x image first") != std::string::npos);
    CHECK(read_y(d.g.y) == without);
  }
  // A workspace off 16 bytes is refused on cuda, whether the plan would use it or not.
  nf4_gemv_desc off = d.g;
  off.workspace = static_cast<std::uint8_t*>(workspace.get()) + 4;
  off.workspace_bytes = static_cast<std::int64_t>(bytes) + 32;
  CHECK(nf4_gemv(ctx.get(), &off) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nf4_last_error(ctx.get())).find("workspace must be 16-byte aligned") != std::string::npos);
  if (bytes == 0) return;
  // Prepared with it: every launch uses it; a new y on it is refused, nothing written.
  nf4_gemv_desc g = d.g;
  g.workspace = workspace.get();
  g.workspace_bytes = static_cast<std::int64_t>(bytes);
  nf4_gemv_prepared* raw = nullptr;
  REQUIRE(nf4_gemv_prepare(ctx.get(), &g, &raw) == NF4_OK);
  const std::unique_ptr<nf4_gemv_prepared, void (*)(nf4_gemv_prepared*)> p(raw, nf4_gemv_prepared_destroy);
  DeviceBuffer y2(d.y_bytes);
  for (int launch = 0; launch < 2; ++launch) {
    cu(cudaMemset(y2.get(), 0, d.y_bytes));
    REQUIRE(nf4_gemv_prepared_launch(p.get(), nullptr, y2.get(), nullptr) == NF4_OK);
    CHECK(read_y(y2.get()) == without);
  }
  CHECK(nf4_gemv_prepared_launch(p.get(), nullptr, static_cast<std::uint8_t*>(workspace.get()) + 16, nullptr) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("workspace overlaps y") != std::string::npos);
  CHECK(nf4_gemv_prepared_launch(p.get(), workspace.get(), nullptr, nullptr) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("workspace overlaps x") != std::string::npos);
}

TEST_CASE("cuda gemv: back-to-back products see each other's writes (programmatic dependent launch)") {
  // On sm_90 the product kernels are programmatic dependent launches on a stream the caller
  // created: the next kernel's CTAs may be resident while the previous one drains. Read after
  // write: B reads A's output as its x (poisoned with NaN before A writes it). Write after read: C
  // writes its output over A's x, which A's last CTAs read. Each chain, back to back, must give the
  // bits of the same calls with a synchronization after each (the exact contract: the oracle's).
  if (!test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  const TestStream s;
  ctx.set_cuda_stream(s);
  for (const nf4_gemv_mode mode : {NF4_GEMV_EXACT, NF4_GEMV_FAST})
    for (const std::int32_t m : {1, 8}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(m);
      test::GemvCase a, b, c;
      test::make_gemv_case(a, 8192, 4096, m, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 77000 + m);
      test::make_gemv_case(b, 256, 8192, m, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 77100 + m);
      test::make_gemv_case(c, 4096, 256, m, NF4_QUANT_FP4, 64, false, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 77200 + m);
      DeviceGemvCase da(a, 0, 0), db(b, 0, 0), dc(c, 0, 0);
      db.g.x = da.g.y;                         // B reads A's output
      dc.g.y = const_cast<void*>(da.g.x);      // C overwrites A's x (the same bytes: m x 4096 bf16)
      da.g.mode = db.g.mode = dc.g.mode = mode;
      const auto read = [&](const void* p, std::size_t bytes) {
        std::vector<std::uint8_t> h(bytes);
        cu(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
        return h;
      };
      const auto run = [&](bool sync_each) {
        cu(cudaMemsetAsync(da.g.y, 0xff, da.y_bytes, s));  // NaN until A writes
        cu(cudaMemcpyAsync(const_cast<void*>(da.g.x), a.x.data(), a.x.size(), cudaMemcpyHostToDevice, s));
        for (nf4_gemv_desc* g : {&da.g, &db.g, &dc.g}) {
          REQUIRE_MESSAGE(nf4_gemv(ctx.get(), g) == NF4_OK, std::string(nf4_last_error(ctx.get())));
          if (sync_each) cu(cudaStreamSynchronize(s));
        }
        cu(cudaStreamSynchronize(s));
        return std::vector<std::vector<std::uint8_t>>{read(da.g.y, da.y_bytes), read(db.g.y, db.y_bytes), read(dc.g.y, dc.y_bytes)};
      };
      const auto expected = run(true);
      if (mode == NF4_GEMV_EXACT) {
        CHECK(expected[0] == a.oracle());
        b.x = expected[0];
        CHECK(expected[1] == b.oracle());
        CHECK(expected[2] == c.oracle());
      }
      for (int round = 0; round < 3; ++round) {
        const auto got = run(false);
        CHECK_MESSAGE(got[0] == expected[0], "round " << round << ": C overwrote A's x too early");
        CHECK_MESSAGE(got[1] == expected[1], "round " << round << ": B read A's output too early");
        CHECK_MESSAGE(got[2] == expected[2], "round " << round);
      }
    }
  ctx.set_cuda_stream(nullptr);
}

namespace {

// NF4_CUDA_LARGE set and not 0: the cases of hundreds of MB to GB run; otherwise a visible skip.
bool large_cases_asked(const char* skipped) {
  const char* large = std::getenv("NF4_CUDA_LARGE");
  if (large && std::string(large) != "0") return true;
  MESSAGE(skipped << ": set NF4_CUDA_LARGE=1");
  return false;
}

// An n x k product of m rows with nested NF4 (blocksize 64, nested blocksize 256) of random codes
// and statistics (test::synthetic_weight: a quantizer would be slow at these sizes), bf16 x and
// fp32 y, run through nf4_gemv_host; the case and y come back for the oracle's rows.
struct HostProduct {
  test::GemvCase c;
  std::vector<float> y;
  nf4_gemv_desc g{};
};
void run_synthetic_product(Context& ctx, std::int64_t n, std::int64_t k, std::int32_t m, std::uint64_t seed, HostProduct& p) {
  p.c.n = n;
  p.c.k = k;
  p.c.m = m;
  p.c.x_dtype = NF4_DTYPE_BF16;
  p.c.y_dtype = NF4_DTYPE_F32;
  p.c.w = test::synthetic_weight(n * k, NF4_QUANT_NF4, 64, /*nested=*/true, seed);
  p.c.wt = p.c.w.describe(NF4_DTYPE_F32, nullptr, 0);
  p.c.x = test::random_activations(m * k, p.c.x_dtype, seed + 1);
  p.y.assign(static_cast<std::size_t>(m * n), 0.0f);
  p.g = p.c.describe(p.y.data(), p.c.y_bytes());
  REQUIRE_MESSAGE(nf4_gemv_host(ctx.get(), &p.g) == NF4_OK, std::string(nf4_last_error(ctx.get())));
}

}  // namespace

TEST_CASE("cuda gemv: more than 2^31 weights (NF4_CUDA_LARGE=1)") {
  if (!large_cases_asked("cuda gemv large case skipped") || !test::cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  // 65,600 x 32,800 = 2.15e9 weights.
  const std::int64_t n = 65600, k = 32800;
  HostProduct p;
  run_synthetic_product(ctx, n, k, 2, 99, p);
  // Rows on both sides of the 2^31st element, and the last ones.
  std::vector<float> want(p.y.size());
  nf4_gemv_desc o = p.g;
  o.y = want.data();
  for (std::int64_t r : {std::int64_t{0}, (std::int64_t{1} << 31) / k - 1, (std::int64_t{1} << 31) / k, (std::int64_t{1} << 31) / k + 1,
                         n - 2, n - 1}) {
    cpu::oracle_gemv_rows(o, r, 1);
    for (std::int32_t j = 0; j < p.c.m; ++j)
      CHECK_MESSAGE(std::memcmp(&p.y[static_cast<std::size_t>(j * n + r)], &want[static_cast<std::size_t>(j * n + r)], 4) == 0, "row " << r);
  }
}

TEST_CASE("cuda gemv: more than 2^26 columns run gemv.cu's kernel, 2^26 the fast one, both with the oracle's bits (NF4_CUDA_LARGE=1)") {
  if (!large_cases_asked("cuda gemv wide-k case skipped") || !test::cuda_ready()) return;
  const cuda::DeviceInfo dev = cuda::query_device(0);
  Context ctx(NF4_BACKEND_CUDA);
  // The fast kernel's offsets inside a row group and inside x are 32-bit up to k = 2^26
  // (gemv_fast.cu, kFastMaxK); one chunk more and the plan falls through to gemv.cu's kernel.
  // Five rows: a full row group and a tail of one.
  const std::int64_t n = 5;
  for (const std::int64_t k : {std::int64_t{1} << 26, (std::int64_t{1} << 26) + 1024}) {
    const bool fast = k <= (std::int64_t{1} << 26);
    if (dev.cc >= 80) {
      cuda::GemvArgs a{};
      a.n = n;
      a.k = k;
      a.m = 1;
      a.vector = 1;
      cuda::GemvKernelLaunch launch;
      const cudaError_t e = cuda::plan_gemv_fast(a, NF4_DTYPE_BF16, *cuda::gemv_fast_tuning_for(dev.cc), dev.sms, &launch);
      CHECK_MESSAGE((fast ? e == cudaSuccess : e == cudaErrorInvalidConfiguration), "k " << k << ": " << cudaGetErrorName(e));
    }
    HostProduct p;
    run_synthetic_product(ctx, n, k, 1, 7 + 2 * static_cast<std::uint64_t>(fast), p);
    std::vector<float> want(p.y.size());
    nf4_gemv_desc o = p.g;
    o.y = want.data();
    cpu::oracle_gemv_rows(o, 0, n);
    CHECK_MESSAGE(std::memcmp(p.y.data(), want.data(), p.y.size() * sizeof(float)) == 0, "k " << k);
  }
}
