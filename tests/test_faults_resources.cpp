// SPDX-License-Identifier: MIT
// Faults (docs/RELIABILITY.md, sections 3 and 4): what the library and `nf4 convert` do when the
// world goes wrong. Each case checks a clear error (status / exit code and a message naming the
// cause), that nothing partial is left behind, and that nothing crashes.
//
// Here: resources - memory bounded by --batch-mb with nested blocksize 2^20 (through the nf4
// binary, tests/support/faults.h; $NF4_TEST_CLI instead of this build's when that is set), and on
// a GPU machine:
//   NF4_TEST_DEVICE_OOM=1 - a tensor larger than the CUDA device (plain cudaMalloc);
//   NF4_TEST_LARGE=1 - more than 2^31 elements on every available backend, checked against the
//   oracle at the start, around 2^30 / 2^31 and at the last elements.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#if defined(NF4_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/safetensors.h"
#include "nf4/nf4.hpp"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/faults.h"
#include "tests/support/io.h"

using namespace nf4;
using nf4::test::contains;
using nf4::test::golden_path;
using nf4::test::Run;
using nf4::test::run_bin;
using nf4::test::ScratchDir;

namespace {

// Anonymous memory that is only backed where touched (MAP_NORESERVE): huge host buffers for
// tests that must describe more memory than they use.
class LazyBuffer {
 public:
  explicit LazyBuffer(std::size_t bytes) : bytes_(bytes) {
    p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p_ == MAP_FAILED) p_ = nullptr;
  }
  ~LazyBuffer() {
    if (p_) ::munmap(p_, bytes_);
  }
  LazyBuffer(const LazyBuffer&) = delete;
  LazyBuffer& operator=(const LazyBuffer&) = delete;
  std::uint8_t* get() const { return static_cast<std::uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

}  // namespace

// ---- memory ------------------------------------------------------------------------------------

TEST_CASE("faults: --batch-mb bounds memory with nested blocksize 2^20 (one nested block of 32 Mi elements)") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  // 32 Mi + 4 Ki elements, blocksize 32, nested blocksize 2^20: 64 MiB of bf16 output in two
  // nested blocks, the first 64 MiB of output by itself.
  const std::int64_t n = (std::int64_t{1} << 25) + 4096;
  {
    cpu::QuantizedWeight w = test::synthetic_weight(n, NF4_QUANT_NF4, 64, /*nested=*/true, 5);
    w.blocksize = 32;
    w.nested_blocksize = 1 << 20;
    const std::int64_t blocks = n / 32;
    w.absmax_u8.resize(static_cast<std::size_t>(blocks));
    for (std::size_t i = 0; i < w.absmax_u8.size(); ++i) w.absmax_u8[i] = static_cast<std::uint8_t>(i * 2654435761u >> 24);
    w.nested_absmax.assign(static_cast<std::size_t>((blocks + (1 << 20) - 1) >> 20), 0.02f);
    std::vector<io::TensorData> ts;
    std::deque<std::string> keep;
    test::add_param(ts, keep, "w.weight", w, test::quant_state_json(w, {n}).dump());
    io::write_safetensors(scratch / "in.safetensors", ts, {});
  }
  // A child's peak includes what it shared with this process before exec, and a backend's set-up
  // (a Vulkan driver on the CPU is large): both measured by converting a small checkpoint, and
  // subtracted.
  const Run base = run_bin({"convert", golden_path(), scratch / "small.safetensors", "--backend", "cpu", "--batch-mb", "4"}, scratch);
  REQUIRE(base.code == 0);
  const Run r = run_bin({"convert", scratch / "in.safetensors", scratch / "out.safetensors", "--backend", "cpu", "--batch-mb", "4"}, scratch, 120);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const long extra_mib = (r.max_rss_kb - base.max_rss_kb) / 1024;
  MESSAGE("peak resident memory with --batch-mb 4: " << r.max_rss_kb / 1024 << " MiB (" << extra_mib << " MiB above a small conversion)");
  CHECK(extra_mib < 32);  // one whole nested block is 64 MiB of output alone
  // The bytes are the oracle's, across the pieces cut inside the nested block.
  const io::SafetensorsFile in(scratch / "in.safetensors"), out(scratch / "out.safetensors");
  const auto params = io::find_quantized_params(in);
  REQUIRE(params.size() == 1);
  const io::TensorInfo* dense = out.find("w.weight");
  REQUIRE(dense != nullptr);
  const std::int64_t starts[] = {0, (std::int64_t{1} << 21) - 7, std::int64_t{1} << 24, n - 5000};
  for (std::int64_t first : starts) {
    std::vector<std::uint16_t> expected(5000);
    const nf4_tensor t = io::describe(params[0], NF4_DTYPE_BF16, expected.data() - first, n * 2);
    cpu::oracle_dequantize_range(t, first, 5000);
    CHECK_MESSAGE(std::memcmp(expected.data(), out.data(*dense) + first * 2, 10000) == 0, "at " << first);
  }
}

// ---- GPU machine -------------------------------------------------------------------------------

TEST_CASE("faults: a tensor larger than the CUDA device fails with NF4_ERR_OUT_OF_MEMORY and frees everything (NF4_TEST_DEVICE_OOM=1)") {
  if (!test::env_on("NF4_TEST_DEVICE_OOM")) {
    MESSAGE("skipped: set NF4_TEST_DEVICE_OOM=1 (GPU machine)");
    return;
  }
#if defined(NF4_HAVE_CUDA)
  const RegisteredBackend* b = find_backend(NF4_BACKEND_CUDA);
  REQUIRE(b != nullptr);
  if (!b->available) {
    MESSAGE("skipped: cuda unavailable: " << b->device_or_reason);
    return;
  }
  Context ctx(NF4_BACKEND_CUDA);
  std::size_t free0 = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free0, &total) == cudaSuccess);
  MESSAGE("device " << ctx.device_name() << ": " << total / (1 << 20) << " MiB, " << free0 / (1 << 20) << " MiB free");
  // Just over the device's memory in fp32 output alone, then far over it. The host side is
  // described, not backed: lazily mapped memory that the failed call must never touch.
  const std::int64_t sizes[] = {static_cast<std::int64_t>(total / 4 + total / 64) / 4096 * 4096, std::int64_t{1} << 36};
  for (std::int64_t n : sizes) {
    CAPTURE(n);
    LazyBuffer packed(static_cast<std::size_t>(n / 2)), out(static_cast<std::size_t>(n) * 4);
    if (!packed.get() || !out.get()) {  // e.g. vm.overcommit_memory=2
      MESSAGE("size " << n << " skipped: cannot map " << n * 4 / (1 << 20) << " MiB of lazy host memory");
      continue;
    }
    std::vector<float> absmax(static_cast<std::size_t>(n / 4096), 1.0f);
    const auto qmap = cpu::saved_quant_map(NF4_QUANT_NF4);
    nf4_tensor t{};
    t.quant_type = NF4_QUANT_NF4;
    t.out_dtype = NF4_DTYPE_F32;
    t.numel = n;
    t.blocksize = 4096;
    t.packed = packed.get();
    t.packed_bytes = n / 2;
    t.absmax = absmax.data();
    t.absmax_count = static_cast<std::int64_t>(absmax.size());
    t.quant_map = qmap.data();
    t.quant_map_count = 16;
    t.out = out.get();
    t.out_bytes = n * 4;
    std::memset(out.get(), 0xAB, 64);
    std::memset(out.get() + n * 4 - 64, 0xAB, 64);
    const nf4_status s = nf4_dequantize_host(ctx.get(), &t);
    CHECK(s == NF4_ERR_OUT_OF_MEMORY);
    CHECK_MESSAGE(contains(nf4_last_error(ctx.get()), "out of device memory"), std::string(nf4_last_error(ctx.get())));
    for (int i = 0; i < 64; ++i) {
      CHECK(out.get()[i] == 0xAB);
      CHECK(out.get()[n * 4 - 64 + i] == 0xAB);
    }
    std::size_t free1 = 0;
    REQUIRE(cudaMemGetInfo(&free1, &total) == cudaSuccess);
    CHECK_MESSAGE(free1 + (std::size_t{64} << 20) >= free0, "device memory not freed: " << free0 << " -> " << free1);
  }
  // The context still works.
  const auto w = test::random_weight(100000, NF4_QUANT_NF4, 64, true, 9);
  std::vector<std::uint16_t> got(100000), expected(100000);
  ctx.dequantize_host(w.describe(NF4_DTYPE_BF16, got.data(), 200000));
  cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, expected.data(), 200000));
  CHECK(got == expected);
#else
  MESSAGE("skipped: the cuda backend is not compiled in");
#endif
}

TEST_CASE("faults: more than 2^31 elements on every available backend, checked at the start, 2^30, 2^31 and the end (NF4_TEST_LARGE=1)") {
  if (!test::env_on("NF4_TEST_LARGE")) {
    MESSAGE("skipped: set NF4_TEST_LARGE=1 (GPU machine; about 6 GB of host memory)");
    return;
  }
  // Past 2^31 by more than a window, odd: a half-used last packed byte.
  const std::int64_t n = (std::int64_t{1} << 31) + (1 << 17) + 4099;
  for (const bool nested : {true, false}) {
    const cpu::QuantizedWeight w = test::synthetic_weight(n, NF4_QUANT_NF4, 64, nested, nested ? 7 : 8);
    const nf4_dtype dtype = nested ? NF4_DTYPE_F16 : NF4_DTYPE_BF16;  // 4 GiB of output: byte offsets past 2^32
    std::vector<std::uint16_t> got(static_cast<std::size_t>(n));
    LazyBuffer expected(static_cast<std::size_t>(n) * 2);  // the oracle writes only the windows
    REQUIRE(expected.get() != nullptr);
    const nf4_tensor oracle_t = w.describe(dtype, expected.get(), n * 2);
    // Windows: the first elements, around 2^30 and 2^31, and the last blocks (oracle only there).
    const std::int64_t win = 1 << 16;
    const std::int64_t starts[] = {0, (std::int64_t{1} << 30) - win / 2, (std::int64_t{1} << 31) - win / 2, n - win};
    for (std::int64_t first : starts) {
      REQUIRE(first + win <= n);
      cpu::oracle_dequantize_range(oracle_t, first, win);
    }
    for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
      nf4_backend_info info{};
      REQUIRE(nf4_backend_get_info(i, &info) == NF4_OK);
      if (!info.available) {
        MESSAGE("backend '" << std::string(info.name) << "' skipped: " << std::string(info.device_name));
        continue;
      }
      CAPTURE(std::string(info.name));
      CAPTURE(nested);
      std::fill(got.begin(), got.end(), std::uint16_t{0x7777});
      Context ctx(info.kind);
      const auto t0 = std::chrono::steady_clock::now();
      ctx.dequantize_host(w.describe(dtype, got.data(), n * 2));
      MESSAGE(std::string(info.name) << ": " << n << " elements in "
                                     << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
      for (std::int64_t first : starts)
        CHECK_MESSAGE(std::memcmp(got.data() + first, expected.get() + first * 2, static_cast<std::size_t>(win) * 2) == 0,
                      "window at " << first);
      CHECK(got.back() != 0x7777);
    }
  }
}
