// SPDX-License-Identifier: MIT
#include "bench/weights.h"

#include <iterator>

#include "core/format.h"

namespace nf4::bench {
namespace {

constexpr int kNestedBlocksize = 256;

// splitmix64: a seeded, portable stream, so every run and machine times the same bytes.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  void fill(std::vector<std::uint8_t>& bytes) {
    for (std::size_t i = 0; i < bytes.size(); i += 8) {
      const std::uint64_t r = next();
      for (std::size_t b = 0; b < 8 && i + b < bytes.size(); ++b) bytes[i + b] = static_cast<std::uint8_t>(r >> (8 * b));
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace

nf4_tensor BenchWeight::describe(nf4_dtype out_dtype) const {
  nf4_tensor t{};
  t.quant_type = NF4_QUANT_NF4;
  t.out_dtype = out_dtype;
  t.numel = numel;
  t.blocksize = blocksize;
  t.packed = packed.data();
  t.packed_bytes = static_cast<std::int64_t>(packed.size());
  t.quant_map = quant_map.data();
  t.quant_map_count = static_cast<std::int64_t>(quant_map.size());
  t.nested = 1;
  t.absmax = absmax.data();
  t.absmax_count = static_cast<std::int64_t>(absmax.size());
  t.nested_absmax = nested_absmax.data();
  t.nested_absmax_count = static_cast<std::int64_t>(nested_absmax.size());
  t.nested_code = nested_code.data();
  t.nested_code_count = static_cast<std::int64_t>(nested_code.size());
  t.nested_blocksize = kNestedBlocksize;
  t.nested_offset = nested_offset;
  return t;
}

BenchWeight make_bench_weight(std::int64_t numel, int blocksize, std::uint64_t seed) {
  Random random(seed);
  BenchWeight w;
  w.numel = numel;
  w.blocksize = blocksize;
  w.packed.resize(static_cast<std::size_t>((numel + 1) / 2));
  random.fill(w.packed);
  if (numel % 2) w.packed.back() &= 0xf0;  // the unused low nibble of an odd count stays zero
  w.absmax.resize(static_cast<std::size_t>((numel + blocksize - 1) / blocksize));
  random.fill(w.absmax);
  // Absmax = code * 0.05 + 0.06 lies in [0.01, 0.11]: positive and normal, as a weight's are.
  w.nested_absmax.assign((w.absmax.size() + kNestedBlocksize - 1) / kNestedBlocksize, 0.05f);
  w.nested_offset = 0.06f;
  w.nested_code.resize(256);
  for (int i = 0; i < 256; ++i) w.nested_code[static_cast<std::size_t>(i)] = static_cast<float>(i - 128) / 128.0f;
  w.quant_map.assign(std::begin(format::kNf4Table), std::end(format::kNf4Table));
  return w;
}

std::vector<float> bench_values(std::int64_t n, std::uint64_t seed) {
  Random random(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  // The top 24 bits of each draw: exact in fp32, uniform in [-1, 1).
  for (float& x : v) x = static_cast<float>(random.next() >> 40) / static_cast<float>(1 << 23) - 1.0f;
  return v;
}

}  // namespace nf4::bench
