// SPDX-License-Identifier: MIT
// Prepared launches (nf4_prepare / nf4_prepared_launch*) with host pointers on the cpu backend:
// the same bits as the oracle into the prepared output, into another output, and from other input
// buffers of the same geometry; every bad description refused when prepared, every bad address
// refused when launched, nothing written in either case. The cuda backend's device-pointer form is
// tested in tests/test_cuda_api.cpp; the vulkan backend's prepared form is nf4_vulkan_job_*.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/oracle.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/env.h"

using namespace nf4;

namespace {

struct Prepared {
  nf4_prepared* p = nullptr;
  ~Prepared() { nf4_prepared_destroy(p); }
};

std::vector<std::uint16_t> oracle_bf16(const cpu::QuantizedWeight& w) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(w.numel), 0x7777);
  cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, out.data(), w.numel * 2));
  return out;
}

nf4_buffers buffers_of(const nf4_tensor& t) {
  return nf4_buffers{t.packed, t.absmax, t.quant_map, t.nested_absmax, t.nested_code, t.nested_offset_ptr, t.nested_offset, t.out};
}

}  // namespace

TEST_CASE("prepared launch on cpu: prepared output, another output, other inputs of the same geometry") {
  Context ctx(NF4_BACKEND_CPU);
  const auto a = test::random_weight(3 * 4096 + 17, NF4_QUANT_NF4, 64, true, 21);
  const auto b = test::random_weight(3 * 4096 + 17, NF4_QUANT_NF4, 64, true, 22);
  std::vector<std::uint16_t> out1(a.numel, 0x5A5A), out2(a.numel, 0x5A5A), out3(a.numel, 0x5A5A);
  const nf4_tensor t = a.describe(NF4_DTYPE_BF16, out1.data(), a.numel * 2);

  Prepared p;
  REQUIRE(nf4_prepare(ctx.get(), &t, 1, &p.p) == NF4_OK);
  CHECK(nf4_prepared_count(p.p) == 1);
  CHECK(out1 == std::vector<std::uint16_t>(a.numel, 0x5A5A));  // preparing writes nothing

  REQUIRE(nf4_prepared_launch(p.p, nullptr, nullptr) == NF4_OK);
  CHECK(out1 == oracle_bf16(a));

  void* other = out2.data();
  REQUIRE(nf4_prepared_launch(p.p, &other, nullptr) == NF4_OK);
  CHECK(out2 == oracle_bf16(a));

  nf4_buffers bb = buffers_of(b.describe(NF4_DTYPE_BF16, out3.data(), b.numel * 2));
  REQUIRE(nf4_prepared_launch_buffers(p.p, &bb, nullptr) == NF4_OK);
  CHECK(out3 == oracle_bf16(b));
}

TEST_CASE("prepared launch: bad descriptions are refused when prepared") {
  Context ctx(NF4_BACKEND_CPU);
  const auto w = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 5);
  std::vector<std::uint16_t> out(1000);
  nf4_tensor t = w.describe(NF4_DTYPE_F16, out.data(), 2000);
  nf4_prepared* p = reinterpret_cast<nf4_prepared*>(&t);  // must be reset to NULL on failure
  t.blocksize = 48;
  CHECK(nf4_prepare(ctx.get(), &t, 1, &p) == NF4_ERR_BLOCKSIZE);
  CHECK(p == nullptr);
  CHECK(std::string(nf4_last_error(ctx.get())).find("blocksize") != std::string::npos);
  t = w.describe(NF4_DTYPE_F16, out.data(), 1999);
  CHECK(nf4_prepare(ctx.get(), &t, 1, &p) == NF4_ERR_OUTPUT_TOO_SMALL);
  CHECK(nf4_prepare(ctx.get(), &t, 0, &p) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(nf4_prepare(ctx.get(), nullptr, 1, &p) == NF4_ERR_NULL_POINTER);
  CHECK(nf4_prepare(nullptr, &t, 1, &p) == NF4_ERR_NULL_POINTER);
  t = w.describe(NF4_DTYPE_F16, out.data(), 2000);
  CHECK(nf4_prepare(ctx.get(), &t, 1, nullptr) == NF4_ERR_NULL_POINTER);
}

TEST_CASE("prepared launch: bad addresses are refused when launched, and nothing is written") {
  Context ctx(NF4_BACKEND_CPU);
  const auto w = test::random_weight(4096, NF4_QUANT_NF4, 64, true, 6);
  std::vector<std::uint16_t> out(4096, 0x1234);
  const nf4_tensor t = w.describe(NF4_DTYPE_F16, out.data(), 4096 * 2);
  Prepared p;
  REQUIRE(nf4_prepare(ctx.get(), &t, 1, &p.p) == NF4_OK);

  void* null_out = nullptr;
  CHECK(nf4_prepared_launch(p.p, &null_out, nullptr) == NF4_ERR_NULL_POINTER);
  // An output over the packed codes.
  void* over_input = const_cast<std::uint8_t*>(t.packed);
  CHECK(nf4_prepared_launch(p.p, &over_input, nullptr) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("packed") != std::string::npos);
  // Buffers missing one the prepared description had.
  nf4_buffers b = buffers_of(t);
  b.nested_code = nullptr;
  CHECK(nf4_prepared_launch_buffers(p.p, &b, nullptr) == NF4_ERR_NULL_POINTER);
  CHECK(std::string(nf4_last_error(ctx.get())).find("nested_code") != std::string::npos);
  b = buffers_of(t);
  b.out = const_cast<float*>(t.nested_code);
  CHECK(nf4_prepared_launch_buffers(p.p, &b, nullptr) == NF4_ERR_ALIASING);
  CHECK(nf4_prepared_launch_buffers(p.p, nullptr, nullptr) == NF4_ERR_NULL_POINTER);
  // The cpu backend has no streams.
  int not_a_stream = 0;
  CHECK(nf4_prepared_launch(p.p, nullptr, &not_a_stream) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(nf4_prepared_launch(nullptr, nullptr, nullptr) == NF4_ERR_NULL_POINTER);
  CHECK(out == std::vector<std::uint16_t>(4096, 0x1234));
}

TEST_CASE("prepared grouped launch: mixed dtypes, and an output over another tensor's input refused") {
  Context ctx(NF4_BACKEND_CPU);
  const auto a = test::random_weight(5000, NF4_QUANT_NF4, 64, true, 7);
  const auto b = test::random_weight(777, NF4_QUANT_FP4, 128, false, 8);
  std::vector<std::uint16_t> oa(5000), oa2(5000);
  std::vector<float> ob(777), ob2(777);
  const nf4_tensor ts[2] = {a.describe(NF4_DTYPE_F16, oa.data(), 10000), b.describe(NF4_DTYPE_F32, ob.data(), 777 * 4)};
  Prepared p;
  REQUIRE(nf4_prepare(ctx.get(), ts, 2, &p.p) == NF4_OK);
  void* outs[2] = {oa2.data(), ob2.data()};
  REQUIRE(nf4_prepared_launch(p.p, outs, nullptr) == NF4_OK);
  std::vector<std::uint16_t> ea(5000);
  std::vector<float> eb(777);
  cpu::oracle_dequantize(a.describe(NF4_DTYPE_F16, ea.data(), 10000));
  cpu::oracle_dequantize(b.describe(NF4_DTYPE_F32, eb.data(), 777 * 4));
  CHECK(oa2 == ea);
  CHECK(test::differing_elements(ob2.data(), eb.data(), 777, NF4_DTYPE_F32) == 0);

  // Tensor 1's output over tensor 0's absmax (another dtype): one launch would read and write it.
  void* bad[2] = {oa2.data(), const_cast<void*>(ts[0].absmax)};
  CHECK(nf4_prepared_launch(p.p, bad, nullptr) == NF4_ERR_ALIASING);
  // (The fp32 output is longer than the absmax it starts in: the message names the first field hit.)
  CHECK(std::string(nf4_last_error(ctx.get())).find("out overlaps tensor ") != std::string::npos);
  void* same[2] = {oa2.data(), oa2.data()};
  CHECK(nf4_prepared_launch(p.p, same, nullptr) == NF4_ERR_ALIASING);
}

TEST_CASE("prepared launch: many threads launch one prepared object into their own outputs") {
  Context ctx(NF4_BACKEND_CPU);
  const auto w = test::random_weight(20000, NF4_QUANT_NF4, 64, true, 9);
  const nf4_tensor t = w.describe(NF4_DTYPE_BF16, nullptr, 0);
  std::vector<std::uint16_t> first(20000);
  nf4_tensor tp = t;
  tp.out = first.data();
  tp.out_bytes = 40000;
  Prepared p;
  REQUIRE(nf4_prepare(ctx.get(), &tp, 1, &p.p) == NF4_OK);
  std::vector<std::vector<std::uint16_t>> outs(4, std::vector<std::uint16_t>(20000));
  std::vector<nf4_status> status(4, NF4_ERR_INTERNAL);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      void* o = outs[i].data();
      status[i] = nf4_prepared_launch(p.p, &o, nullptr);
    });
  for (auto& th : threads) th.join();
  const auto expected = oracle_bf16(w);
  for (int i = 0; i < 4; ++i) {
    CHECK(status[i] == NF4_OK);
    CHECK(outs[i] == expected);
  }
}

TEST_CASE("every grouped call refuses an output over another tensor's buffer of another dtype, on every backend") {
  for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
    nf4_backend_info info{};
    REQUIRE(nf4_backend_get_info(i, &info) == NF4_OK);
    if (!info.available) continue;
    Context ctx(info.kind);
    CAPTURE(std::string(info.name));
    // Tensor 0: 64 fp32 outputs, exactly the 256 bytes of tensor 1's absmax (64 blocks), so the
    // overlap found is that one whatever the heap put next to it.
    const auto a = test::random_weight(64, NF4_QUANT_NF4, 64, false, 31);
    const auto b = test::random_weight(4096, NF4_QUANT_NF4, 64, false, 32);
    const std::vector<float> absmax_before = b.absmax_f32;
    nf4_tensor ts[2] = {a.describe(NF4_DTYPE_F32, nullptr, 0), b.describe(NF4_DTYPE_BF16, nullptr, 0)};
    std::vector<std::uint16_t> ob(4096);
    ts[1].out = ob.data();
    ts[1].out_bytes = 4096 * 2;
    ts[0].out = const_cast<void*>(ts[1].absmax);
    ts[0].out_bytes = 64 * 4;
    CHECK(nf4_dequantize_grouped_host(ctx.get(), ts, 2) == NF4_ERR_ALIASING);
    CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 0: out overlaps tensor 1's") != std::string::npos);
    CHECK(b.absmax_f32 == absmax_before);
  }
}

TEST_CASE("prepared launch: backends without raw pointers say so") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    if (context_backend(ctx.get()).capabilities().prepared_launch) continue;
    const auto w = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 5);
    std::vector<std::uint16_t> out(1000);
    const nf4_tensor t = w.describe(NF4_DTYPE_F16, out.data(), 2000);
    nf4_prepared* p = nullptr;
    CHECK(nf4_prepare(ctx.get(), &t, 1, &p) == NF4_ERR_UNSUPPORTED);
    CHECK(p == nullptr);
    CHECK(std::string(nf4_last_error(ctx.get())).find("native API") != std::string::npos);
  }
}
