// SPDX-License-Identifier: MIT
#include <algorithm>
#include <set>

#include "tests/support/common.h"

namespace nf4::test {
namespace {

float uniform(std::uint64_t& s, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(splitmix(s) >> 40) / static_cast<float>(1 << 24);
}

}  // namespace

const io::SafetensorsFile& golden_file() {
  static const io::SafetensorsFile f(data_path("golden.safetensors"));
  return f;
}

const std::vector<GoldenCase>& golden_cases() {
  static const std::vector<GoldenCase> cases = [] {
    std::vector<GoldenCase> out;
    const auto& f = golden_file();
    for (auto& p : io::find_quantized_params(f)) {
      GoldenCase c;
      c.case_name = p.name.substr(0, p.name.find('.'));
      const char* suffix[3] = {".expected.float16", ".expected.bfloat16", ".expected.float32"};
      for (int d = 0; d < 3; ++d) c.expected[d] = f.find(c.case_name + suffix[d]);
      c.param = std::move(p);
      out.push_back(std::move(c));
    }
    return out;
  }();
  return cases;
}

cpu::QuantizedWeight random_weight(std::int64_t n, nf4_quant_type qt, int blocksize, bool nested, std::uint64_t seed,
                                   int nested_blocksize) {
  const auto x = cpu::random_normal(n, seed, 0.02f);
  return cpu::quantize(x.data(), n, cpu::QuantizeOptions{qt, blocksize, nested, nested_blocksize});
}

cpu::QuantizedWeight synthetic_weight(std::int64_t n, nf4_quant_type qt, int blocksize, bool nested, std::uint64_t seed,
                                      int nested_blocksize) {
  cpu::QuantizedWeight w;
  w.quant_type = qt;
  w.numel = n;
  w.blocksize = blocksize;
  w.nested_blocksize = nested_blocksize;
  w.nested = nested;
  std::uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
  w.packed.resize(static_cast<std::size_t>((n + 1) / 2));
  for (auto& b : w.packed) b = static_cast<std::uint8_t>(splitmix(s));
  const std::int64_t na = (n + blocksize - 1) / blocksize;
  w.quant_map = cpu::saved_quant_map(qt);
  if (nested) {
    w.absmax_u8.resize(static_cast<std::size_t>(na));
    for (auto& b : w.absmax_u8) b = static_cast<std::uint8_t>(splitmix(s));
    w.nested_absmax.resize(static_cast<std::size_t>((na + nested_blocksize - 1) / nested_blocksize));
    for (auto& v : w.nested_absmax) v = uniform(s, 0.001f, 0.5f);
    w.nested_code = cpu::dynamic_code_map();
    w.nested_offset = uniform(s, 0.0f, 0.1f);
  } else {
    w.absmax_f32.resize(static_cast<std::size_t>(na));
    for (auto& v : w.absmax_f32) v = uniform(s, 1e-4f, 3.0f);
  }
  return w;
}

std::vector<std::int64_t> sweep_sizes(std::int64_t max_size) {
  std::set<std::int64_t> s;
  for (std::int64_t n : {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025})
    s.insert(n);
  for (std::int64_t b = 64; b <= max_size; b *= 2)
    for (std::int64_t d : {-1, 0, 1}) s.insert(b * 3 / 2 + d);
  for (double n = 2048; n <= static_cast<double>(max_size); n *= 2.7) s.insert(static_cast<std::int64_t>(n));
  std::vector<std::int64_t> v;
  for (auto n : s)
    if (n >= 1 && n <= max_size) v.push_back(n);
  return v;
}

}  // namespace nf4::test
