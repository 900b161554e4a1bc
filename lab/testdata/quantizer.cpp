// SPDX-License-Identifier: MIT
#include "lab/testdata/quantizer.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "core/format.h"
#include "core/half.h"
#include "core/tensor.h"
#include "core/types.h"

namespace nf4::cpu {
namespace {

// Index of the entry of a sorted table nearest to v (lower index on ties).
unsigned nearest_sorted(const std::vector<float>& table, float v) {
  const auto it = std::lower_bound(table.begin(), table.end(), v);
  if (it == table.begin()) return 0;
  if (it == table.end()) return static_cast<unsigned>(table.size() - 1);
  const auto hi = static_cast<unsigned>(it - table.begin());
  return (v - table[hi - 1] <= table[hi] - v) ? hi - 1 : hi;
}

unsigned nearest_fp4(float v) {
  const float a = std::fabs(v);
  unsigned best = 0;
  for (unsigned q = 1; q < 8; ++q)
    if (std::fabs(format::kFp4Magnitudes[q] - a) < std::fabs(format::kFp4Magnitudes[best] - a)) best = q;
  return best | (v < 0.0f ? 8u : 0u);
}

}  // namespace

std::vector<float> dynamic_code_map() {
  // Signed, 7 exponent bits, 8 bits total: for each decade i, 2^i means of a linear split of
  // [0.1, 1], scaled by 10^(i-6), both signs; plus 0 and 1; sorted.
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int items = (1 << i) + 1;
    std::vector<float> bounds(items);
    for (int k = 0; k < items; ++k) bounds[k] = 0.1f + (0.9f * static_cast<float>(k)) / static_cast<float>(items - 1);
    const double scale = std::pow(10.0, -6 + i);
    for (int k = 0; k + 1 < items; ++k) {
      const float mean = (bounds[k] + bounds[k + 1]) / 2.0f;
      data.push_back(static_cast<float>(scale * mean));
      data.push_back(static_cast<float>(-scale * mean));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  return data;
}

namespace {
// What bitsandbytes does per quant type, one case per row of NF4_QUANT_TYPES (a row without its
// case does not build): the quant_map it saves, and the code it gives a value in [-1, 1].
template <nf4_quant_type Q>
struct BnbQuantizer;
template <>
struct BnbQuantizer<NF4_QUANT_NF4> {
  static float saved_value(unsigned q) { return format::kNf4Table[q]; }
  static unsigned code(float v, const std::vector<float>& nf4_sorted) { return nearest_sorted(nf4_sorted, v); }
};
template <>
struct BnbQuantizer<NF4_QUANT_FP4> {
  static float saved_value(unsigned q) { return q == 8 ? 0.0f : format::fp4_value(q); }  // the saved map has +0 at code 8
  static unsigned code(float v, const std::vector<float>&) { return nearest_fp4(v); }
};
}  // namespace

std::vector<float> saved_quant_map(nf4_quant_type type) {
  std::vector<float> m(16);
  dispatch_quant_type(type, [&](auto tag) {
    for (unsigned q = 0; q < 16; ++q) m[q] = BnbQuantizer<decltype(tag)::value>::saved_value(q);
  });
  return m;
}

QuantizedWeight quantize(const float* x, std::int64_t n, const QuantizeOptions& o) {
  if (n < 1 || n > NF4_MAX_ELEMENTS) fail(NF4_ERR_ELEMENT_COUNT, "quantize: element count {} out of range", n);
  if (!is_power_of_two(o.blocksize) || o.blocksize < format::kMinBlocksize || o.blocksize > format::kMaxBlocksize)
    fail(NF4_ERR_BLOCKSIZE, "quantize: blocksize must be a power of two in [32, 4096], got {}", o.blocksize);
  if (o.nested && (!is_power_of_two(o.nested_blocksize) || o.nested_blocksize > format::kMaxNestedBlocksize))
    fail(NF4_ERR_NESTED_BLOCKSIZE, "quantize: nested_blocksize must be a power of two, got {}", o.nested_blocksize);

  QuantizedWeight w;
  w.quant_type = o.quant_type;
  w.numel = n;
  w.blocksize = o.blocksize;
  w.nested = o.nested;
  w.nested_blocksize = o.nested_blocksize;
  w.quant_map = saved_quant_map(o.quant_type);
  const std::vector<float> nf4_sorted(format::kNf4Table, format::kNf4Table + 16);

  const std::int64_t blocks = ceil_div(n, o.blocksize);
  std::vector<float> absmax(blocks);
  w.packed.assign(ceil_div(n, 2), 0);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t lo = b * o.blocksize, hi = std::min(n, lo + o.blocksize);
    float m = 0.0f;
    for (std::int64_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(x[i]));
    absmax[b] = m;
    const float inv = m > 0.0f ? 1.0f / m : 0.0f;
    for (std::int64_t i = lo; i < hi; ++i) {
      const float v = x[i] * inv;
      const unsigned q = dispatch_quant_type(o.quant_type, [&](auto tag) { return BnbQuantizer<decltype(tag)::value>::code(v, nf4_sorted); });
      w.packed[i / 2] |= static_cast<std::uint8_t>((i & 1) ? q : q << 4);
    }
  }

  if (!o.nested) {
    w.absmax_f32 = std::move(absmax);
    return w;
  }
  // Double quantization: subtract the mean, then 8-bit blockwise dynamic quantization.
  double sum = 0.0;
  for (float a : absmax) sum += a;
  w.nested_offset = static_cast<float>(sum / static_cast<double>(blocks));
  w.nested_code = dynamic_code_map();
  const std::int64_t blocks2 = ceil_div(blocks, o.nested_blocksize);
  w.nested_absmax.resize(blocks2);
  w.absmax_u8.resize(blocks);
  for (std::int64_t b2 = 0; b2 < blocks2; ++b2) {
    const std::int64_t lo = b2 * o.nested_blocksize, hi = std::min(blocks, lo + o.nested_blocksize);
    float m = 0.0f;
    for (std::int64_t b = lo; b < hi; ++b) m = std::max(m, std::fabs(absmax[b] - w.nested_offset));
    w.nested_absmax[b2] = m;
    const float inv = m > 0.0f ? 1.0f / m : 0.0f;
    for (std::int64_t b = lo; b < hi; ++b)
      w.absmax_u8[b] = static_cast<std::uint8_t>(nearest_sorted(w.nested_code, (absmax[b] - w.nested_offset) * inv));
  }
  return w;
}

namespace {
template <typename Widen>
QuantizedWeight quantize_widened(const std::uint16_t* x, std::int64_t n, const QuantizeOptions& o, Widen widen) {
  if (n < 1 || n > NF4_MAX_ELEMENTS) fail(NF4_ERR_ELEMENT_COUNT, "quantize: element count {} out of range", n);
  std::vector<float> f(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) f[i] = widen(x[i]);
  return quantize(f.data(), n, o);
}
}  // namespace

QuantizedWeight quantize_f16(const std::uint16_t* x, std::int64_t n, const QuantizeOptions& o) {
  return quantize_widened(x, n, o, float_from_f16);
}
QuantizedWeight quantize_bf16(const std::uint16_t* x, std::int64_t n, const QuantizeOptions& o) {
  return quantize_widened(x, n, o, float_from_bf16);
}

nf4_tensor QuantizedWeight::describe(nf4_dtype out_dtype, void* out, std::int64_t out_bytes) const {
  nf4_tensor t{};
  t.quant_type = quant_type;
  t.out_dtype = out_dtype;
  t.numel = numel;
  t.blocksize = blocksize;
  t.nested = nested ? 1 : 0;
  t.packed = packed.data();
  t.packed_bytes = static_cast<std::int64_t>(packed.size());
  t.absmax = nested ? static_cast<const void*>(absmax_u8.data()) : absmax_f32.data();
  t.absmax_count = static_cast<std::int64_t>(nested ? absmax_u8.size() : absmax_f32.size());
  t.quant_map = quant_map.data();
  t.quant_map_count = static_cast<std::int64_t>(quant_map.size());
  if (nested) {
    t.nested_absmax = nested_absmax.data();
    t.nested_absmax_count = static_cast<std::int64_t>(nested_absmax.size());
    t.nested_code = nested_code.data();
    t.nested_code_count = static_cast<std::int64_t>(nested_code.size());
    t.nested_blocksize = nested_blocksize;
    t.nested_offset = nested_offset;
  }
  t.out = out;
  t.out_bytes = out_bytes;
  return t;
}

std::vector<float> random_normal(std::int64_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace nf4::cpu
