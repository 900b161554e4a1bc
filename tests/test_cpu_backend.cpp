// SPDX-License-Identifier: MIT
// The cpu backend's vector kernels and its thread pool.
//   - F16C's fp16 conversion (and the vector bf16 rounding) against core/half.h's integer rounding
//     on every one of the 2^32 fp32 bit patterns, NaNs included.
//   - Each kernel path (scalar, AVX2 + F16C, AVX-512: every one this CPU runs) against the oracle
//     on whole tensors, on unaligned sub-ranges and on absmax values that make NaN, infinities,
//     overflow and subnormals, also with flush-to-zero set by the caller.
//   - The thread count: nf4_context_options.cpu_threads > NF4_CPU_THREADS > hardware threads, the
//     options struct's versioning rules, bit-exact results with 1 and N threads, threads started
//     once per context and joined at destroy.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/oracle.h"
#include "backends/cpu/thread_pool.h"
#include "core/backend.h"
#include "core/half.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"

using namespace nf4;

namespace {

std::vector<cpu::Isa> vector_isas() {
  std::vector<cpu::Isa> isas;
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (cpu::isa_supported(isa)) isas.push_back(isa);
    else MESSAGE("kernel path " << cpu::isa_name(isa) << " skipped: this CPU does not run it");
  }
  return isas;
}

std::vector<cpu::Isa> all_isas() {
  std::vector<cpu::Isa> isas = {cpu::Isa::scalar};
  for (cpu::Isa isa : vector_isas()) isas.push_back(isa);
  return isas;
}

// Sanitizer builds (ASan/UBSan, TSan) instrument the integer rounding and run it ~10x slower, so
// they sweep 1 chunk of 2^16 patterns in every kStride (every exponent, both signs, NaNs); the
// Release build sweeps all 2^32. Set by tests/CMakeLists.txt.
#if defined(NF4_EXHAUSTIVE_STRIDE)
constexpr std::uint64_t kStride = NF4_EXHAUSTIVE_STRIDE;
#else
constexpr std::uint64_t kStride = 1;
#endif

std::uint16_t oracle_nan_f16(std::uint32_t u) {
  // The NaN core/half.h gives (and x86's vcvtps2ph and ARM's FCVT): the sign, a quiet NaN, the
  // top 10 bits of the fp32 payload (bit 9 = the quiet bit, set whatever the input had).
  return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
}

}  // namespace

TEST_CASE("core/half.h's NaNs: quiet, sign and top payload bits kept") {
  for (std::uint32_t u : {0x7f800001u, 0x7fc00000u, 0xffc00000u, 0x7fbfe000u, 0xff802000u, 0x7fffffffu, 0xffffe000u}) {
    CAPTURE(u);
    CHECK(f16_from_bits(u) == oracle_nan_f16(u));
    CHECK((bf16_from_bits(u) & 0x7fc0u) == 0x7fc0u);  // quiet NaN
    CHECK((bf16_from_bits(u) & 0x8000u) == ((u >> 16) & 0x8000u));
  }
}

TEST_CASE("vector fp16 (F16C) and bf16 rounding equal core/half.h on every fp32 bit pattern") {
  const std::vector<cpu::Isa> isas = vector_isas();
  if (isas.empty()) return;  // reported by vector_isas(): the scalar path is core/half.h itself
  if (kStride != 1)
    MESSAGE("sanitizer build: 1 chunk of 2^16 patterns in every " << kStride << " swept; the Release build sweeps all 2^32");
  constexpr std::uint64_t kChunk = 1 << 16;
  constexpr std::uint64_t kChunks = (std::uint64_t{1} << 32) / kChunk;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<std::uint64_t> next{0}, swept{0}, nan_swept{0};
  std::atomic<std::int64_t> f16_bad{0}, bf16_bad{0};
  std::atomic<std::uint32_t> first_bad{0};
  const auto start = std::chrono::steady_clock::now();
  // Separate simple loops, so the compiler vectorizes all but the integer fp16 rounding.
  const auto count_differences = [&](const std::vector<std::uint16_t>& out, const std::vector<std::uint16_t>& ref, std::uint32_t base) {
    std::uint32_t diff = 0;  // 32-bit lanes: the loop vectorizes wider
    for (std::uint32_t k = 0; k < kChunk; ++k) diff += out[k] != ref[k];
    if (diff) {
      std::uint64_t k = 0;
      while (out[k] == ref[k]) ++k;
      std::uint32_t none = 0;
      first_bad.compare_exchange_strong(none, base + static_cast<std::uint32_t>(k));
    }
    return static_cast<std::int64_t>(diff);
  };
  const auto work = [&] {
    std::vector<float> in(kChunk);
    std::vector<std::uint16_t> ref16(kChunk), refb(kChunk), out(kChunk);
    std::int64_t bad16 = 0, badb = 0;
    std::uint64_t nans = 0, done = 0;
    std::uint32_t chunk_nans;
    for (std::uint64_t c; (c = next.fetch_add(1)) < kChunks;) {
      if (c % kStride != 0) continue;
      const std::uint32_t base = static_cast<std::uint32_t>(c * kChunk);
      for (std::uint32_t k = 0; k < kChunk; ++k) in[k] = bits_float(base + k);
      for (std::uint32_t k = 0; k < kChunk; ++k) ref16[k] = f16_from_bits(base + k);
      for (std::uint32_t k = 0; k < kChunk; ++k) refb[k] = bf16_from_bits(base + k);
      chunk_nans = 0;
      for (std::uint32_t k = 0; k < kChunk; ++k) chunk_nans += ((base + k) & 0x7fffffffu) > 0x7f800000u;
      nans += chunk_nans;
      for (cpu::Isa isa : isas) {
        cpu::convert_f16(isa, in.data(), out.data(), kChunk);
        bad16 += count_differences(out, ref16, base);
        cpu::convert_bf16(isa, in.data(), out.data(), kChunk);
        badb += count_differences(out, refb, base);
      }
      done += kChunk;
    }
    f16_bad += bad16;
    bf16_bad += badb;
    swept += done;
    nan_swept += nans;
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE(swept.load() << " patterns (" << nan_swept.load() << " NaNs) x " << isas.size() << " vector paths on " << threads
                       << " threads: " << seconds << " s");
  CHECK(swept.load() == (kChunks + kStride - 1) / kStride * kChunk);
  CHECK(nan_swept.load() > 0);
  CHECK_MESSAGE(f16_bad.load() == 0, "first differing pattern 0x" << std::hex << first_bad.load());
  CHECK_MESSAGE(bf16_bad.load() == 0, "first differing pattern 0x" << std::hex << first_bad.load());
}

TEST_CASE("vector conversions of short arrays: every length's tail goes through the scalar rounding") {
  for (cpu::Isa isa : all_isas()) {
    std::mt19937 rng(7);
    for (std::size_t n = 0; n < 70; ++n) {
      std::vector<float> in(n);
      for (auto& f : in) f = bits_float(static_cast<std::uint32_t>(rng()));
      std::vector<std::uint16_t> a(n + 1, 0xabcd), b(n + 1, 0xabcd);
      cpu::convert_f16(isa, in.data(), a.data(), n);
      cpu::convert_bf16(isa, in.data(), b.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(a[i] == f16_from_float(in[i]));
        CHECK(b[i] == bf16_from_float(in[i]));
      }
      CHECK(a[n] == 0xabcd);  // nothing past the end
      CHECK(b[n] == 0xabcd);
    }
  }
}

namespace {

// Runs `isa`'s kernel over [0, numel) in pieces cut at `cuts` (unaligned on purpose) and compares
// with the oracle bit for bit; the bytes past the end must be untouched.
std::int64_t kernel_vs_oracle(cpu::Isa isa, nf4_tensor t, const std::vector<std::int64_t>& cuts) {
  const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype)), bytes = t.numel * es;
  std::vector<std::uint8_t> expected(bytes, 0x5a), actual(bytes + 64, 0xa5);
  t.out = expected.data();
  t.out_bytes = bytes;
  cpu::oracle_dequantize(t);
  t.out = actual.data();
  std::int64_t first = 0;
  for (std::int64_t cut : cuts) {
    if (cut <= first || cut >= t.numel) continue;
    cpu::dequantize_range(isa, t, first, cut - first);
    first = cut;
  }
  cpu::dequantize_range(isa, t, first, t.numel - first);
  for (std::int64_t i = bytes; i < bytes + 64; ++i)
    if (actual[i] != 0xa5) return -1;
  return test::differing_elements(expected.data(), actual.data(), t.numel, t.out_dtype);
}

}  // namespace

TEST_CASE("every kernel path equals the oracle on random tensors, whole and in unaligned pieces") {
  for (cpu::Isa isa : all_isas()) {
    CAPTURE(cpu::isa_name(isa));
    std::uint64_t seed = 100;
    for (std::int64_t n : test::sweep_sizes(1 << 15))
      for (nf4_quant_type qt : test::kQuantTypes)
        for (int bs : {32, 64, 4096})
          for (bool nested : {true, false}) {
            const auto w = test::random_weight(n, qt, bs, nested, seed++);
            std::mt19937_64 rng(seed);
            std::vector<std::int64_t> cuts;
            for (std::int64_t c = 0; c < n; c += 1 + static_cast<std::int64_t>(rng() % 200)) cuts.push_back(c);
            for (nf4_dtype d : test::kDTypes) {
              CHECK_MESSAGE(kernel_vs_oracle(isa, w.describe(d, nullptr, 0), {}) == 0,
                            "n=" << n << " qt=" << qt << " bs=" << bs << " nested=" << nested << " " << test::dtype_label(d));
              CHECK_MESSAGE(kernel_vs_oracle(isa, w.describe(d, nullptr, 0), cuts) == 0,
                            "pieces: n=" << n << " qt=" << qt << " bs=" << bs << " nested=" << nested << " " << test::dtype_label(d));
            }
          }
  }
}

namespace {

// A flat-absmax weight whose blocks scale by values that drive the products to NaN, infinities,
// fp16 overflow and rounding ties, fp16 and fp32 subnormals and signed zeros.
cpu::QuantizedWeight special_weight(nf4_quant_type qt) {
  auto w = test::random_weight(64 * 40 + 17, qt, 64, false, 5);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           bits_float(0x7f800001u),  // signalling NaN, payload below fp16's
                           bits_float(0xffa5a5a5u),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           0.0f,
                           -0.0f,
                           65504.0f,
                           65520.0f,
                           65519.996f,
                           std::numeric_limits<float>::max(),
                           1e-40f,   // fp32 subnormal
                           -3e-39f,  // fp32 subnormal: products flush under FTZ
                           6e-8f,    // around the smallest fp16 subnormal
                           2.98023224e-8f,
                           6.1e-5f,  // the fp16 normal boundary
                           1.1754944e-38f,
                           std::numeric_limits<float>::denorm_min(),
                           -1.0f};
  for (std::size_t b = 0; b < w.absmax_f32.size(); ++b) w.absmax_f32[b] = special[b % (sizeof special / sizeof special[0])];
  // Every code in every block: the 16 values times each scale.
  for (std::size_t j = 0; j < w.packed.size(); ++j) w.packed[j] = static_cast<std::uint8_t>((j * 2 % 16) << 4 | ((j * 2 + 1) % 16));
  return w;
}

}  // namespace

TEST_CASE("every kernel path equals the oracle on NaN, infinite, overflowing and subnormal products") {
  for (cpu::Isa isa : all_isas())
    for (nf4_quant_type qt : test::kQuantTypes) {
      const auto w = special_weight(qt);
      for (nf4_dtype d : test::kDTypes) {
        CAPTURE(cpu::isa_name(isa));
        CAPTURE(test::dtype_label(d));
        CHECK(kernel_vs_oracle(isa, w.describe(d, nullptr, 0), {}) == 0);
        CHECK(kernel_vs_oracle(isa, w.describe(d, nullptr, 0), {1, 33, 100, 1001}) == 0);
      }
    }
}

#if defined(__x86_64__)
TEST_CASE("the kernels give the contract's bits when the caller runs with flush-to-zero and denormals-are-zero") {
  const unsigned saved = _mm_getcsr();
  for (cpu::Isa isa : all_isas()) {
    const auto w = special_weight(NF4_QUANT_NF4);
    for (nf4_dtype d : test::kDTypes) {
      const std::int64_t bytes = w.numel * static_cast<std::int64_t>(nf4_dtype_size(d));
      std::vector<std::uint8_t> expected(bytes), actual(bytes);
      cpu::oracle_dequantize(w.describe(d, expected.data(), bytes));  // IEEE defaults here
      const unsigned ftz_daz = (saved & ~0x6000u) | 0x8040u;         // FTZ, DAZ, round to nearest
      _mm_setcsr(ftz_daz);
      cpu::dequantize_range(isa, w.describe(d, actual.data(), bytes), 0, w.numel);
      const unsigned after = _mm_getcsr();
      _mm_setcsr(saved);
      CHECK((after & ~0x3fu) == (ftz_daz & ~0x3fu));  // the caller's mode is restored (flags aside)
      CHECK_MESSAGE(test::differing_elements(expected.data(), actual.data(), w.numel, d) == 0,
                    cpu::isa_name(isa) << " " << test::dtype_label(d));
    }
  }
}
#endif

// ---- the thread pool and the thread-count control ----------------------------------------------

TEST_CASE("the thread pool runs every item once, on fewer threads when there are fewer items, and rethrows") {
  for (unsigned size : {1u, 2u, 5u}) {
    cpu::ThreadPool pool(size);
    CHECK(pool.size() == size);
    for (std::size_t count : {0, 1, 2, 3, 7, 100}) {
      std::vector<std::atomic<int>> hits(count);
      pool.run(count, [&](std::size_t i) { hits[i].fetch_add(1); });
      for (auto& h : hits) CHECK(h.load() == 1);
    }
    std::atomic<int> ran{0};
    CHECK_THROWS_AS(pool.run(20,
                             [&](std::size_t i) {
                               ran.fetch_add(1);
                               if (i == 3) throw std::runtime_error("item 3");
                             }),
                    std::runtime_error);
    CHECK(ran.load() == 20);  // the other items still ran
    pool.run(4, [&](std::size_t) { ran.fetch_add(1); });  // usable after an exception
    CHECK(ran.load() == 24);
  }
  // Calls from several threads at once (each waits for the one before).
  cpu::ThreadPool pool(3);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) pool.run(6, [&](std::size_t) { total.fetch_add(1); });
    });
  for (auto& t : callers) t.join();
  CHECK(total.load() == 4 * 50 * 6);
}

namespace {

unsigned context_threads(const nf4_context_options* options, nf4_status* status = nullptr) {
  nf4_context* ctx = nullptr;
  const nf4_status s = nf4_context_create_ex(NF4_BACKEND_CPU, options, &ctx);
  if (status) *status = s;
  if (s != NF4_OK) return 0;
  const unsigned n = nf4::context_backend(ctx).host_threads();
  nf4_context_destroy(ctx);
  return n;
}

nf4_context_options with_threads(int n) {
  nf4_context_options o = NF4_CONTEXT_OPTIONS_INIT;
  o.cpu_threads = n;
  return o;
}

// Threads of this process (Linux).
std::size_t process_threads() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The thread count once it has fallen to `expected`, or after 5 s. A joined thread leaves
// /proc/self/task a moment after pthread_join returns (join waits for the kernel's exit
// notification, the task entry goes when the kernel releases it), so a busy machine can still
// list it right after the join.
std::size_t threads_after_joins(std::size_t expected) {
  std::size_t n = process_threads();
  for (int i = 0; i < 500 && n > expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = process_threads();
  }
  return n;
}

}  // namespace

TEST_CASE("cpu thread count: the context option, then NF4_CPU_THREADS, then every hardware thread") {
  unsetenv("NF4_CPU_THREADS");
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  CHECK(context_threads(nullptr) == hw);
  nf4_context_options o = with_threads(0);
  CHECK(context_threads(&o) == hw);
  o = with_threads(3);
  CHECK(context_threads(&o) == 3);
  o = with_threads(1);
  CHECK(context_threads(&o) == 1);
  {
    nf4::Context plain(NF4_BACKEND_CPU);  // nf4_context_create: the defaults
    CHECK(nf4::context_backend(plain.get()).host_threads() == hw);
  }

  setenv("NF4_CPU_THREADS", "2", 1);
  CHECK(context_threads(nullptr) == 2);
  o = with_threads(5);
  CHECK(context_threads(&o) == 5);  // the option wins
  for (const char* bad : {"0", "-1", "abc", "2x", "1025", "99999999999999999999"}) {
    CAPTURE(bad);
    setenv("NF4_CPU_THREADS", bad, 1);
    nf4_status s = NF4_OK;
    CHECK(context_threads(nullptr, &s) == 0);
    CHECK(s == NF4_ERR_INVALID_ARGUMENT);
    CHECK(std::string(nf4_last_error(nullptr)).find("NF4_CPU_THREADS") != std::string::npos);
    CHECK(context_threads(&o) == 5);  // not read when the option is given
  }
  setenv("NF4_CPU_THREADS", "", 1);  // empty: unset
  CHECK(context_threads(nullptr) == hw);
  setenv("NF4_CPU_THREADS", "64", 1);  // more than the cores: taken as given
  CHECK(context_threads(nullptr) == 64);
  unsetenv("NF4_CPU_THREADS");
  nf4::Context wrapped(NF4_BACKEND_CPU, with_threads(2));  // the C++ wrapper
  CHECK(nf4::context_backend(wrapped.get()).host_threads() == 2);
}

TEST_CASE("nf4_context_options: range and struct_size rules") {
  nf4_status s = NF4_OK;
  for (int bad : {-1, 1025, std::numeric_limits<int>::min()}) {
    nf4_context_options o = with_threads(bad);
    CHECK(context_threads(&o, &s) == 0);
    CHECK(s == NF4_ERR_INVALID_ARGUMENT);
    CHECK(std::string(nf4_last_error(nullptr)).find("cpu_threads") != std::string::npos);
  }
  for (std::uint32_t size : {0u, 4u, 7u, 4097u}) {
    nf4_context_options o = with_threads(2);
    o.struct_size = size;
    CHECK(context_threads(&o, &s) == 0);
    CHECK(s == NF4_ERR_INVALID_ARGUMENT);
    CHECK(std::string(nf4_last_error(nullptr)).find("struct_size") != std::string::npos);
  }
  // A newer header's larger struct: fields this version does not know must be 0.
  struct Newer {
    nf4_context_options v1;
    std::int32_t future[3];
  } newer{with_threads(2), {0, 0, 0}};
  newer.v1.struct_size = sizeof(Newer);
  CHECK(context_threads(&newer.v1, &s) == 2);
  newer.future[1] = 7;
  CHECK(context_threads(&newer.v1, &s) == 0);
  CHECK(s == NF4_ERR_UNSUPPORTED);
  nf4_context* ctx = reinterpret_cast<nf4_context*>(1);
  CHECK(nf4_context_create_ex(NF4_BACKEND_CPU, nullptr, nullptr) == NF4_ERR_NULL_POINTER);
  const nf4_context_options ok = with_threads(1);
  CHECK(nf4_context_create_ex(static_cast<nf4_backend_kind>(9), &ok, &ctx) == NF4_ERR_UNKNOWN_BACKEND);
  CHECK(ctx == nullptr);
}

TEST_CASE("the cpu backend is bit-exact with 1 and with N threads, starts its threads once and joins them at destroy") {
  const auto w = test::random_weight((std::int64_t{5} << 20) + 333, NF4_QUANT_NF4, 64, true, 77);  // 6 chunks
  // The first context probes every backend; a GPU driver starts threads of its own then, which
  // must not be counted as the pool's (seen on a CUDA machine).
  {
    nf4_context* warm = nullptr;
    REQUIRE(nf4_context_create(NF4_BACKEND_CPU, &warm) == NF4_OK);
    nf4_context_destroy(warm);
  }
  for (nf4_dtype d : test::kDTypes) {
    const std::int64_t bytes = w.numel * static_cast<std::int64_t>(nf4_dtype_size(d));
    std::vector<std::uint8_t> expected(bytes);
    cpu::oracle_dequantize(w.describe(d, expected.data(), bytes));
    for (int threads : {1, 2, 4, 7}) {
      CAPTURE(threads);
      const std::size_t before = process_threads();
      nf4_context* ctx = nullptr;
      const nf4_context_options o = with_threads(threads);
      REQUIRE(nf4_context_create_ex(NF4_BACKEND_CPU, &o, &ctx) == NF4_OK);
      CHECK(process_threads() == before + static_cast<std::size_t>(threads - 1));
      for (int call = 0; call < 3; ++call) {
        std::vector<std::uint8_t> out(bytes, 0xcc);
        const nf4_tensor t = w.describe(d, out.data(), bytes);
        REQUIRE(nf4_dequantize_host(ctx, &t) == NF4_OK);
        CHECK(out == expected);
      }
      CHECK(process_threads() == before + static_cast<std::size_t>(threads - 1));  // no thread per call
      nf4_context_destroy(ctx);
      CHECK(threads_after_joins(before) == before);
    }
  }
}
