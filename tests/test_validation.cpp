// SPDX-License-Identifier: MIT
// Every bad input gets its own status code, a message naming the field, and writes nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "nf4/nf4.hpp"
#include "tests/support/common.h"

using namespace nf4;

namespace {

struct BadCase {
  const char* name;
  nf4_status expected;
  const char* message_contains;
  std::function<void(nf4_tensor&)> mutate;
};

}  // namespace

TEST_CASE("each invalid description returns its status, names the field, and writes nothing") {
  const auto nested = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 5);
  const auto flat = test::random_weight(1000, NF4_QUANT_NF4, 64, false, 6);
  const std::vector<BadCase> cases = {
      {"null packed", NF4_ERR_NULL_POINTER, "packed", [](nf4_tensor& t) { t.packed = nullptr; }},
      {"null absmax", NF4_ERR_NULL_POINTER, "absmax", [](nf4_tensor& t) { t.absmax = nullptr; }},
      {"null out", NF4_ERR_NULL_POINTER, "out", [](nf4_tensor& t) { t.out = nullptr; }},
      {"null quant_map (nf4)", NF4_ERR_NULL_POINTER, "quant_map", [](nf4_tensor& t) { t.quant_map = nullptr; }},
      {"null nested_absmax", NF4_ERR_NULL_POINTER, "nested_absmax", [](nf4_tensor& t) { t.nested_absmax = nullptr; }},
      {"null nested_code", NF4_ERR_NULL_POINTER, "nested_code", [](nf4_tensor& t) { t.nested_code = nullptr; }},
      {"bad quant type", NF4_ERR_QUANT_TYPE, "quant_type", [](nf4_tensor& t) { t.quant_type = static_cast<nf4_quant_type>(7); }},
      {"bad dtype", NF4_ERR_DTYPE, "out_dtype", [](nf4_tensor& t) { t.out_dtype = static_cast<nf4_dtype>(9); }},
      {"zero elements", NF4_ERR_ELEMENT_COUNT, "numel", [](nf4_tensor& t) { t.numel = 0; }},
      {"negative elements", NF4_ERR_ELEMENT_COUNT, "numel", [](nf4_tensor& t) { t.numel = -5; }},
      {"element count overflow", NF4_ERR_ELEMENT_COUNT, "numel", [](nf4_tensor& t) { t.numel = INT64_MAX / 2; }},
      {"blocksize not a power of two", NF4_ERR_BLOCKSIZE, "blocksize", [](nf4_tensor& t) { t.blocksize = 96; }},
      {"blocksize too small", NF4_ERR_BLOCKSIZE, "blocksize", [](nf4_tensor& t) { t.blocksize = 16; }},
      {"blocksize too large", NF4_ERR_BLOCKSIZE, "blocksize", [](nf4_tensor& t) { t.blocksize = 8192; }},
      {"nested blocksize not a power of two", NF4_ERR_NESTED_BLOCKSIZE, "nested_blocksize", [](nf4_tensor& t) { t.nested_blocksize = 100; }},
      {"nested blocksize zero", NF4_ERR_NESTED_BLOCKSIZE, "nested_blocksize", [](nf4_tensor& t) { t.nested_blocksize = 0; }},
      {"packed bytes short", NF4_ERR_PACKED_SIZE, "packed_bytes", [](nf4_tensor& t) { t.packed_bytes -= 1; }},
      {"packed bytes long", NF4_ERR_PACKED_SIZE, "packed_bytes", [](nf4_tensor& t) { t.packed_bytes += 1; }},
      {"absmax count", NF4_ERR_ABSMAX_SIZE, "absmax_count", [](nf4_tensor& t) { t.absmax_count -= 1; }},
      {"nested absmax count", NF4_ERR_NESTED_ABSMAX_SIZE, "nested_absmax_count", [](nf4_tensor& t) { t.nested_absmax_count += 1; }},
      {"quant map size", NF4_ERR_QUANT_MAP_SIZE, "quant_map_count", [](nf4_tensor& t) { t.quant_map_count = 15; }},
      {"nested code size", NF4_ERR_NESTED_CODE_SIZE, "nested_code_count", [](nf4_tensor& t) { t.nested_code_count = 255; }},
      {"output too small", NF4_ERR_OUTPUT_TOO_SMALL, "out_bytes", [](nf4_tensor& t) { t.out_bytes -= 1; }},
      {"nested not 0 or 1", NF4_ERR_INVALID_ARGUMENT, "nested", [](nf4_tensor& t) { t.nested = 2; }},
      {"numel disagrees with packed", NF4_ERR_PACKED_SIZE, "packed_bytes", [](nf4_tensor& t) { t.numel += 2; t.out_bytes += 8; }},
  };
  for (nf4_backend_kind kind : {NF4_BACKEND_CPU}) {
    Context ctx(kind);
    for (const auto& c : cases) {
      CAPTURE(c.name);
      std::vector<std::uint8_t> out(1000 * 4 + 16, 0xEE);
      nf4_tensor t = nested.describe(NF4_DTYPE_F32, out.data(), 1000 * 4);
      c.mutate(t);
      CHECK(nf4_validate(&t) == c.expected);
      CHECK(std::string(nf4_last_error(nullptr)).find(c.message_contains) != std::string::npos);
      CHECK(nf4_dequantize_host(ctx.get(), &t) == c.expected);
      const std::string msg = nf4_last_error(ctx.get());
      CHECK_MESSAGE(msg.find(c.message_contains) != std::string::npos, msg);
      CHECK(std::all_of(out.begin(), out.end(), [](std::uint8_t b) { return b == 0xEE; }));
      CHECK(nf4_dequantize(ctx.get(), &t) == c.expected);
    }
    // A valid flat tensor with a nested field broken still passes: nested fields are ignored.
    std::vector<float> out(1000);
    nf4_tensor t = flat.describe(NF4_DTYPE_F32, out.data(), 4000);
    t.nested_code_count = 3;
    CHECK(nf4_dequantize_host(ctx.get(), &t) == NF4_OK);
  }
}

TEST_CASE("output overlapping an input is refused") {
  auto w = test::random_weight(100, NF4_QUANT_NF4, 64, false, 3);
  Context ctx(NF4_BACKEND_CPU);
  std::vector<std::uint8_t> buf(1000);
  std::copy(w.packed.begin(), w.packed.end(), buf.begin());
  nf4_tensor t = w.describe(NF4_DTYPE_F16, buf.data() + 10, 200);
  t.packed = buf.data();
  CHECK(nf4_dequantize_host(ctx.get(), &t) == NF4_ERR_ALIASING);
}

TEST_CASE("grouped validation names the bad tensor and writes none of them") {
  const auto a = test::random_weight(500, NF4_QUANT_NF4, 64, true, 1);
  const auto b = test::random_weight(600, NF4_QUANT_FP4, 32, false, 2);
  std::vector<std::uint16_t> oa(500, 7), ob(600, 7);
  nf4_tensor ts[2] = {a.describe(NF4_DTYPE_F16, oa.data(), 1000), b.describe(NF4_DTYPE_F16, ob.data(), 1200)};
  ts[1].absmax_count = 3;
  Context ctx(NF4_BACKEND_CPU);
  CHECK(nf4_dequantize_grouped_host(ctx.get(), ts, 2) == NF4_ERR_ABSMAX_SIZE);
  CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 1") != std::string::npos);
  CHECK(std::all_of(oa.begin(), oa.end(), [](auto v) { return v == 7; }));
  CHECK(std::all_of(ob.begin(), ob.end(), [](auto v) { return v == 7; }));
}

TEST_CASE("grouped calls refuse an output overlapping another tensor's input or output") {
  const auto a = test::random_weight(500, NF4_QUANT_NF4, 64, true, 1);
  const auto b = test::random_weight(600, NF4_QUANT_NF4, 64, false, 2);
  Context ctx(NF4_BACKEND_CPU);
  std::vector<std::uint16_t> out(1200, 7);
  nf4_tensor ts[2] = {a.describe(NF4_DTYPE_F16, out.data(), 1000), b.describe(NF4_DTYPE_F16, out.data() + 400, 1200)};
  CHECK(nf4_dequantize_grouped_host(ctx.get(), ts, 2) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 0: out overlaps tensor 1's out") != std::string::npos);
  CHECK(std::all_of(out.begin(), out.end(), [](auto v) { return v == 7; }));
  // Tensor 1 writing over tensor 0's packed codes.
  std::vector<std::uint8_t> shared(a.packed.begin(), a.packed.end());
  shared.resize(shared.size() + 1200 * 2);
  ts[0] = a.describe(NF4_DTYPE_F16, out.data(), 1000);
  ts[0].packed = shared.data();
  ts[1] = b.describe(NF4_DTYPE_F16, shared.data() + 10, 1200);
  CHECK(nf4_dequantize_grouped_host(ctx.get(), ts, 2) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 1: out overlaps tensor 0's packed") != std::string::npos);
  // Disjoint buffers pass.
  std::vector<std::uint16_t> o1(600);
  ts[1] = b.describe(NF4_DTYPE_F16, o1.data(), 1200);
  CHECK(nf4_dequantize_grouped_host(ctx.get(), ts, 2) == NF4_OK);
}

TEST_CASE("API argument errors") {
  nf4_context* ctx = nullptr;
  CHECK(nf4_context_create(NF4_BACKEND_CPU, nullptr) == NF4_ERR_NULL_POINTER);
  CHECK(nf4_context_create(static_cast<nf4_backend_kind>(42), &ctx) == NF4_ERR_UNKNOWN_BACKEND);
  CHECK(ctx == nullptr);
  CHECK(nf4_dequantize(nullptr, nullptr) == NF4_ERR_NULL_POINTER);
  REQUIRE(nf4_context_create(NF4_BACKEND_CPU, &ctx) == NF4_OK);
  CHECK(nf4_dequantize(ctx, nullptr) == NF4_ERR_NULL_POINTER);
  CHECK(nf4_dequantize_grouped(ctx, nullptr, 0) == NF4_ERR_NULL_POINTER);
  CHECK(nf4_context_set_cuda_stream(ctx, nullptr) == NF4_ERR_UNSUPPORTED);
  nf4_backend_kind k;
  CHECK(nf4_backend_parse("vulkan", &k) == NF4_OK);
  CHECK(k == NF4_BACKEND_VULKAN);
  CHECK(nf4_backend_parse("metal", &k) == NF4_ERR_UNKNOWN_BACKEND);
  CHECK(std::string(nf4_status_string(NF4_ERR_ABSMAX_SIZE)) == "wrong absmax count");
  // One version source (VERSION): the library, the header's string and its three numbers agree.
  CHECK(std::string(nf4_version()) == NF4_VERSION_STRING);
  CHECK(std::string(nf4_version()) == std::to_string(NF4_VERSION_MAJOR) + "." + std::to_string(NF4_VERSION_MINOR) + "." +
                                          std::to_string(NF4_VERSION_PATCH));
  CHECK(std::string(nf4_status_string(static_cast<nf4_status>(12345))) == "unknown status");
  CHECK(nf4_dtype_size(static_cast<nf4_dtype>(77)) == 0);
  nf4_context_destroy(ctx);
  nf4_context_destroy(nullptr);
}
