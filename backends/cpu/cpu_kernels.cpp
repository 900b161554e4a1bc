// SPDX-License-Identifier: MIT
// Compiled with -ffp-contract=off like the oracle: the only float arithmetic is one multiply per
// element (and the oracle's absmax), each a single correctly rounded IEEE operation.
#include "backends/cpu/cpu_kernels.h"

#include <algorithm>

#include "backends/cpu/oracle.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/tensor.h"

#if defined(__x86_64__)
#define NF4_CPU_X86 1
#include <cpuid.h>
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build "undefined" vectors from themselves (`__m512i __Y = __Y;`),
// which -Wmaybe-uninitialized reports at the header's lines wherever an intrinsic is inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

namespace nf4::cpu {
namespace {

#if defined(NF4_CPU_X86)

// The SSE control register at IEEE defaults for the lifetime of the guard: round to nearest even,
// every exception masked, no flush-to-zero, no denormals-are-zero. A process built with fast
// math sets FTZ/DAZ at start-up; this keeps the vector multiplies and conversions to the contract.
class IeeeMxcsr {
 public:
  IeeeMxcsr() : saved_(_mm_getcsr()) { _mm_setcsr(0x1f80u); }
  ~IeeeMxcsr() { _mm_setcsr(saved_); }
  IeeeMxcsr(const IeeeMxcsr&) = delete;
  IeeeMxcsr& operator=(const IeeeMxcsr&) = delete;

 private:
  unsigned saved_;
};

// vcvtps2ph's immediate: round to nearest even whatever MXCSR.RC says, exceptions suppressed.
constexpr int kF16Rounding = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// Blocks are walked in batches whose absmax values the oracle computes first, so the vector loops
// make no calls and no divisions.
constexpr std::int64_t kScaleBatch = 256;

// The blocks that the elements [a, b) touch (a < b), in order, each with its scale and its part of
// [a, b):
//   for (BlockWalk w(t, a, b); w.more(); w.next()) ... w.scale(), [w.begin(), w.end()) ...
class BlockWalk {
 public:
  BlockWalk(const nf4_tensor& t, std::int64_t a, std::int64_t b) : t_(t), a_(a), b_(b), block_(a / t.blocksize), last_((b - 1) / t.blocksize) {
    fill();
  }
  BlockWalk(const BlockWalk&) = delete;
  BlockWalk& operator=(const BlockWalk&) = delete;
  bool more() const { return block_ <= last_; }
  void next() {
    if (++block_ - batch_ == kScaleBatch) fill();
  }
  float scale() const { return scales_[block_ - batch_]; }
  std::int64_t begin() const { return std::max(a_, block_ * t_.blocksize); }
  std::int64_t end() const { return std::min(b_, (block_ + 1) * t_.blocksize); }

 private:
  // The scales of the next batch, from the current block on.
  void fill() {
    batch_ = block_;
    const std::int64_t n = std::min(kScaleBatch, last_ + 1 - block_);
    for (std::int64_t k = 0; k < n; ++k) scales_[k] = oracle_absmax(t_, block_ + k);
  }
  const nf4_tensor& t_;
  std::int64_t a_, b_, block_, last_, batch_ = 0;
  float scales_[kScaleBatch];
};

// ---- AVX2 + F16C: 8 lanes ---------------------------------------------------------------------
#define NF4_AVX2 __attribute__((target("avx2,f16c")))

// core/half.h's bf16_from_bits on 8 lanes, narrowed to 16 bits.
NF4_AVX2 inline __m128i bf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));  // == (u & 0x7fffffff) > 0x7f800000
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i rounding = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, rounding), 16);
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Every lane is <= 0xffff, so the unsigned saturating pack only narrows.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// A dtype without a vector conversion here stores its lanes one by one through its codec.
template <nf4_dtype D>
NF4_AVX2 inline void store8(void* out, std::int64_t i, __m256 v) {
  if constexpr (D == NF4_DTYPE_F32) _mm256_storeu_ps(static_cast<float*>(out) + i, v);
  else if constexpr (D == NF4_DTYPE_F16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(out) + i), _mm256_cvtps_ph(v, kF16Rounding));
  else if constexpr (D == NF4_DTYPE_BF16) _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(out) + i), bf16x8(v));
  else {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (int j = 0; j < 8; ++j) store_element<D>(out, i + j, lanes[j]);
  }
}

// values[idx] for 8 codes 0..15: two 8-entry permutes, bit 3 of the code picks between them.
NF4_AVX2 inline __m256 lookup8(__m256 lo, __m256 hi, __m256i idx) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                          _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

// [a, b) multiples of 16 (so of whole packed bytes, each group inside one block).
template <nf4_dtype D>
NF4_AVX2 void range_avx2(const nf4_tensor& t, const float* values, std::int64_t a, std::int64_t b) {
  const __m256 lo = _mm256_loadu_ps(values), hi = _mm256_loadu_ps(values + 8);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const std::uint8_t* packed = t.packed;
  void* out = t.out;
  for (BlockWalk w(t, a, b); w.more(); w.next()) {
    const __m256 scale = _mm256_set1_ps(w.scale());
    for (std::int64_t i = w.begin(), end = w.end(); i < end; i += 16) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + i / 2));
      // Element 2j is byte j's high nibble, 2j+1 its low nibble: interleave high, low.
      const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), _mm_and_si128(bytes, nibble));
      const __m256 v0 = _mm256_mul_ps(lookup8(lo, hi, _mm256_cvtepu8_epi32(codes)), scale);                    // fl32
      const __m256 v1 = _mm256_mul_ps(lookup8(lo, hi, _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))), scale);  // fl32
      store8<D>(out, i, v0);
      store8<D>(out, i + 8, v1);
    }
  }
}

NF4_AVX2 void convert_f16_avx2(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), kF16Rounding));
  for (; i < n; ++i) out[i] = f16_from_float(in[i]);
}

NF4_AVX2 void convert_bf16_avx2(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bf16x8(_mm256_loadu_ps(in + i)));
  for (; i < n; ++i) out[i] = bf16_from_float(in[i]);
}

// ---- AVX-512 F + BW + VL: 16 lanes ------------------------------------------------------------
#define NF4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

// core/half.h's bf16_from_bits on 16 lanes, kept in 32-bit lanes (each <= 0xffff).
NF4_AVX512 inline __m512i bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);  // == (u & 0x7fffffff) > 0x7f800000
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i rounding = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, rounding), 16);
  return _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
}

// 32 bf16 results, in order, from two vectors of 32-bit lanes that are each <= 0xffff.
NF4_AVX512 inline __m512i narrow32(__m512i a, __m512i b) {
  // The pack works per 128-bit lane (a0 b0 a1 b1 ...); the permute puts a's quarters first.
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), _mm512_packus_epi32(a, b));
}

template <nf4_dtype D>
NF4_AVX512 inline void store32(void* out, std::int64_t i, __m512 v0, __m512 v1) {
  if constexpr (D == NF4_DTYPE_F32) {
    _mm512_storeu_ps(static_cast<float*>(out) + i, v0);
    _mm512_storeu_ps(static_cast<float*>(out) + i + 16, v1);
  } else if constexpr (D == NF4_DTYPE_F16) {
    auto* o = static_cast<std::uint16_t*>(out) + i;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_cvtps_ph(v0, kF16Rounding));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), _mm512_cvtps_ph(v1, kF16Rounding));
  } else if constexpr (D == NF4_DTYPE_BF16) {
    _mm512_storeu_si512(static_cast<std::uint16_t*>(out) + i, narrow32(bf16x16(v0), bf16x16(v1)));
  } else {  // as store8
    alignas(64) float lanes[32];
    _mm512_store_ps(lanes, v0);
    _mm512_store_ps(lanes + 16, v1);
    for (int j = 0; j < 32; ++j) store_element<D>(out, i + j, lanes[j]);
  }
}

// [a, b) multiples of 32 (16 packed bytes, each group inside one block: blocksize >= 32).
template <nf4_dtype D>
NF4_AVX512 void range_avx512(const nf4_tensor& t, const float* values, std::int64_t a, std::int64_t b) {
  const __m512 table = _mm512_loadu_ps(values);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const std::uint8_t* packed = t.packed;
  void* out = t.out;
  for (BlockWalk w(t, a, b); w.more(); w.next()) {
    const __m512 scale = _mm512_set1_ps(w.scale());
    for (std::int64_t i = w.begin(), end = w.end(); i < end; i += 32) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + i / 2));
      const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), low = _mm_and_si128(bytes, nibble);
      const __m512 v0 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(high, low)), table), scale);  // fl32
      const __m512 v1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(high, low)), table), scale);  // fl32
      store32<D>(out, i, v0, v1);
    }
  }
}

NF4_AVX512 void convert_f16_avx512(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtps_ph(_mm512_loadu_ps(in + i), kF16Rounding));
  for (; i < n; ++i) out[i] = f16_from_float(in[i]);
}

NF4_AVX512 void convert_bf16_avx512(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(out + i, narrow32(bf16x16(_mm512_loadu_ps(in + i)), bf16x16(_mm512_loadu_ps(in + i + 16))));
  for (; i < n; ++i) out[i] = bf16_from_float(in[i]);
}

#else  // not x86-64: the scalar path only

class IeeeMxcsr {};

#endif

#if defined(NF4_CPU_X86)
bool has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2+f16c";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if defined(NF4_CPU_X86)
    // F16C from CPUID leaf 1 (not every compiler's __builtin_cpu_supports knows "f16c"); the
    // AVX2 check already covers the OS saving the AVX registers that F16C uses.
    case Isa::avx2: return __builtin_cpu_supports("avx2") && has_f16c();
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             isa_supported(Isa::avx2);
#else
    case Isa::avx2:
    case Isa::avx512: return false;
#endif
  }
  return false;
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::scalar;
  return best;
}

void convert_f16(Isa isa, const float* in, std::uint16_t* out, std::size_t n) {
  [[maybe_unused]] IeeeMxcsr ieee;
#if defined(NF4_CPU_X86)
  if (isa == Isa::avx512) return convert_f16_avx512(in, out, n);
  if (isa == Isa::avx2) return convert_f16_avx2(in, out, n);
#endif
  (void)isa;
  for (std::size_t i = 0; i < n; ++i) out[i] = f16_from_float(in[i]);
}

void convert_bf16(Isa isa, const float* in, std::uint16_t* out, std::size_t n) {
  [[maybe_unused]] IeeeMxcsr ieee;
#if defined(NF4_CPU_X86)
  if (isa == Isa::avx512) return convert_bf16_avx512(in, out, n);
  if (isa == Isa::avx2) return convert_bf16_avx2(in, out, n);
#endif
  (void)isa;
  for (std::size_t i = 0; i < n; ++i) out[i] = bf16_from_float(in[i]);
}

void dequantize_range(Isa isa, const nf4_tensor& t, std::int64_t first, std::int64_t count) {
  [[maybe_unused]] IeeeMxcsr ieee;
#if defined(NF4_CPU_X86)
  if (isa != Isa::scalar) {
    // The vector loop covers whole groups of `step` elements (inside one block, since blocksize
    // >= 32); the oracle writes the unaligned head and the tail.
    const std::int64_t step = isa == Isa::avx512 ? 32 : 16;
    const std::int64_t end = first + count;
    const std::int64_t a = std::min(end, (first + step - 1) / step * step);
    const std::int64_t b = std::max(a, end / step * step);
    if (a > first) oracle_dequantize_range(t, first, a - first);
    if (b > a) {
      float values[16];
      value_table(t, values);
      dispatch_dtype(t.out_dtype, [&](auto dtype) {
        if (isa == Isa::avx512) range_avx512<decltype(dtype)::value>(t, values, a, b);
        else range_avx2<decltype(dtype)::value>(t, values, a, b);
      });
    }
    if (end > b) oracle_dequantize_range(t, b, end - b);
    return;
  }
#endif
  (void)isa;
  oracle_dequantize_range(t, first, count);
}

}  // namespace nf4::cpu
