// SPDX-License-Identifier: MIT
// Fuzz target: the bitsandbytes quant-state JSON, alone and inside a checkpoint.
// Input: 1 control byte, then the JSON text.
//  1. io::parse_quant_state(text): only NF4_ERR_FORMAT may escape; an accepted state has a valid
//     quant type, blocksize, nested blocksize and an element count <= 2^56.
//  2. If it parsed and the weight is small, a checkpoint holding that parameter is built in
//     memory with companion tensors of exactly the right sizes, then damaged as the control byte
//     says (a companion missing, of the wrong dtype or one element off, the key's nf4/fp4 suffix
//     disagreeing with the JSON). find_quantized_params must accept the undamaged file (if the
//     element count is >= 1) and reject every damaged one with NF4_ERR_FORMAT; an accepted
//     parameter is dequantized by the oracle and the cpu backend, which must agree bit for bit.
#include <cmath>

#include "lab/testdata/quantizer.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using nf4::fuzz::FileBuilder;

std::string bytes_of(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

std::string pseudo_random(std::size_t n, std::uint32_t seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    s[i] = static_cast<char>(seed >> 24);
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nf4::fuzz::Bytes in(data, size);
  const auto control = in.take<std::uint8_t>();
  const std::string text(in.rest());

  nf4::io::QuantState s;
  try {
    s = nf4::io::parse_quant_state(text);
  } catch (const nf4::Error& e) {
    FUZZ_ASSERT(e.status() == NF4_ERR_FORMAT, "status %d, expected NF4_ERR_FORMAT: %s", e.status(), e.what());
    return 0;
  }
  FUZZ_ASSERT(s.quant_type == NF4_QUANT_NF4 || s.quant_type == NF4_QUANT_FP4, "quant_type %d", s.quant_type);
  FUZZ_ASSERT(s.blocksize >= 32 && s.blocksize <= 4096 && (s.blocksize & (s.blocksize - 1)) == 0, "blocksize %d", s.blocksize);
  FUZZ_ASSERT(!s.shape.empty(), "empty shape accepted");
  unsigned __int128 numel128 = 1;
  for (auto d : s.shape) {
    FUZZ_ASSERT(d >= 0, "negative dimension accepted");
    numel128 *= static_cast<unsigned __int128>(d);
    FUZZ_ASSERT(numel128 <= (static_cast<unsigned __int128>(1) << 56), "more than 2^56 elements accepted");
  }
  if (s.nested)
    FUZZ_ASSERT(s.nested_blocksize >= 1 && s.nested_blocksize <= (1 << 20) && (s.nested_blocksize & (s.nested_blocksize - 1)) == 0,
                "nested_blocksize %d", s.nested_blocksize);
  const auto numel = static_cast<std::int64_t>(numel128);
  if (numel > (1 << 16)) return 0;

  // The companions, exactly sized.
  const std::int64_t packed = (numel + 1) / 2, blocks = (numel + s.blocksize - 1) / s.blocksize;
  const std::int64_t nested_blocks = s.nested ? (blocks + s.nested_blocksize - 1) / s.nested_blocksize : 0;
  const int damage = control & 7, which = (control >> 3) & 7;
  const bool off_by_one_up = (control & 0x40) != 0;
  const auto size_of = [&](int companion, std::int64_t n) {
    if (damage == 3 && which % 5 == companion) return off_by_one_up ? n + 1 : std::max<std::int64_t>(n - 1, 0);
    return n;
  };
  const bool drop = damage == 1, wrong_dtype = damage == 2;
  const auto skip = [&](int companion) { return drop && which % 5 == companion; };
  const auto dtype = [&](int companion, const char* right, const char* wrong) { return wrong_dtype && which % 5 == companion ? wrong : right; };

  FileBuilder b;
  const std::string p = "model.layers.0.w.weight";
  const auto seed = static_cast<std::uint32_t>(std::hash<std::string>{}(text));
  if (!skip(0)) {
    const auto n = size_of(0, packed);
    b.add(p, dtype(0, "U8", "I8"), {n, 1}, pseudo_random(n, seed));
  }
  if (!skip(1)) {
    const auto n = size_of(1, blocks);
    if (s.nested) b.add(p + ".absmax", dtype(1, "U8", "F32"), {n}, pseudo_random(n * (wrong_dtype && which % 5 == 1 ? 4 : 1), seed + 1));
    else {
      std::vector<float> a(n);
      for (std::int64_t i = 0; i < n; ++i) a[i] = 0.01f * static_cast<float>(i % 97 + 1);
      b.add(p + ".absmax", dtype(1, "F32", "F16"), {n}, bytes_of(a).substr(0, n * (wrong_dtype && which % 5 == 1 ? 2 : 4)));
    }
  }
  if (!skip(2)) {
    auto qm = nf4::cpu::saved_quant_map(s.quant_type);
    qm.resize(size_of(2, 16), 0.5f);
    b.add(p + ".quant_map", dtype(2, "F32", "I32"), {static_cast<std::int64_t>(qm.size())}, bytes_of(qm));
  }
  if (s.nested) {
    if (!skip(3)) {
      std::vector<float> na(size_of(3, nested_blocks), 0.75f);
      b.add(p + ".nested_absmax", dtype(3, "F32", "F64"), {static_cast<std::int64_t>(na.size())},
            bytes_of(na) + (wrong_dtype && which % 5 == 3 ? bytes_of(na) : ""));
    }
    if (!skip(4)) {
      auto code = nf4::cpu::dynamic_code_map();
      code.resize(size_of(4, 256), 0.0f);
      b.add(p + ".nested_quant_map", dtype(4, "F32", "U32"), {static_cast<std::int64_t>(code.size())}, bytes_of(code));
    }
  }
  const bool swap_suffix = damage == 4;
  const bool fp4_key = (s.quant_type == NF4_QUANT_FP4) != swap_suffix;
  const bool state_wrong_dtype = damage == 5;
  b.add(p + (fp4_key ? ".quant_state.bitsandbytes__fp4" : ".quant_state.bitsandbytes__nf4"), state_wrong_dtype ? "I8" : "U8",
        {static_cast<std::int64_t>(text.size())}, text);
  b.metadata("format", "pt");

  // Did the damage actually change anything? (An off-by-one "down" on a 0-sized array, a dropped
  // or retyped nested companion on a flat state, do not.)
  bool damaged = false;
  switch (damage) {
    case 1: case 2: damaged = which % 5 < 3 || s.nested; break;
    case 3: damaged = (which % 5 < 3 || s.nested) && (off_by_one_up || (which % 5 == 0 ? packed : which % 5 == 1 ? blocks : which % 5 == 2 ? 16 : which % 5 == 3 ? nested_blocks : 256) > 0); break;
    case 4: case 5: damaged = true; break;
    default: break;
  }

  const nf4::fuzz::MemFile mem(b.bytes());
  const nf4::io::SafetensorsFile f(mem.path());  // the builder's output is always well formed
  std::vector<nf4::io::QuantizedParam> params;
  try {
    params = nf4::io::find_quantized_params(f);
  } catch (const nf4::Error& e) {
    FUZZ_ASSERT(e.status() == NF4_ERR_FORMAT, "status %d, expected NF4_ERR_FORMAT: %s", e.status(), e.what());
    FUZZ_ASSERT(damaged || numel == 0, "an undamaged parameter of %lld elements was rejected: %s", static_cast<long long>(numel), e.what());
    return 0;
  }
  FUZZ_ASSERT(!damaged && numel >= 1, "a damaged parameter (damage %d, companion %d) was accepted", damage, which % 5);
  FUZZ_ASSERT(params.size() == 1 && params[0].name == p, "expected exactly the one parameter");
  nf4::fuzz::dequantize_and_compare(nf4::io::describe(f, params[0], static_cast<nf4_dtype>(control % 3), nullptr, 0));
  return 0;
}
