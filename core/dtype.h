// SPDX-License-Identifier: MIT
// Each output dtype's element codec: its storage type, its significand width, the rounding of an
// fp32 value to it (round to nearest even, docs/DESIGN.md section 2.4), its canonical NaN and the
// exact widening back to fp32. One specialization per row of NF4_DTYPES (core/types.h), for C++ and CUDA alike; the
// primary template has no definition, so a row without its codec does not build (checked for
// every row below), and every generic store derives its width from the codec's storage, whose
// size must be the row's size.
#pragma once

#include <cstdint>

#include "core/half.h"
#include "core/types.h"

namespace nf4 {

template <nf4_dtype D>
struct DtypeCodec;

template <>
struct DtypeCodec<NF4_DTYPE_F16> {
  using Storage = std::uint16_t;
  static constexpr int kSignificandBits = 11;  // with the implicit bit: half an ulp is 2^-11 relative
  NF4_HD static constexpr Storage nan_bits() { return 0x7e00u; }  // the positive quiet NaN
  NF4_HD static Storage from_bits(std::uint32_t u) { return f16_from_bits(u); }
  NF4_HD static float to_float(Storage s) { return float_from_f16(s); }
};

template <>
struct DtypeCodec<NF4_DTYPE_BF16> {
  using Storage = std::uint16_t;
  static constexpr int kSignificandBits = 8;
  NF4_HD static constexpr Storage nan_bits() { return 0x7fc0u; }
  NF4_HD static Storage from_bits(std::uint32_t u) { return bf16_from_bits(u); }
  NF4_HD static float to_float(Storage s) { return float_from_bf16(s); }
};

template <>
struct DtypeCodec<NF4_DTYPE_F32> {
  using Storage = std::uint32_t;  // the fp32 bits: stores move bits, never a float load of a NaN
  static constexpr int kSignificandBits = 24;
  NF4_HD static constexpr Storage nan_bits() { return 0x7fc00000u; }
  NF4_HD static Storage from_bits(std::uint32_t u) { return u; }
  NF4_HD static float to_float(Storage s) { return bits_float(s); }
};

#define NF4_X(value, name, torch_name, aliases, enum_name, st_name, size, product) \
  static_assert(sizeof(DtypeCodec<value>::Storage) == (size), "the codec's storage of " name " must be the row's size");
NF4_DTYPES(NF4_X)
#undef NF4_X

// The element of dtype D that v rounds to.
template <nf4_dtype D>
NF4_HD inline typename DtypeCodec<D>::Storage encode(float v) {
  return DtypeCodec<D>::from_bits(float_bits(v));
}

// out[i] = v rounded to D: exactly sizeof(Storage) == the row's size bytes at element i.
template <nf4_dtype D>
NF4_HD inline void store_element(void* out, std::int64_t i, float v) {
  static_cast<typename DtypeCodec<D>::Storage*>(out)[i] = encode<D>(v);
}

// in[i] of dtype D, widened exactly to fp32.
template <nf4_dtype D>
NF4_HD inline float load_element(const void* in, std::int64_t i) {
  return DtypeCodec<D>::to_float(static_cast<const typename DtypeCodec<D>::Storage*>(in)[i]);
}

// v rounded to D and widened back: the value an element of D holds for v.
template <nf4_dtype D>
NF4_HD inline float round_to(float v) {
  return DtypeCodec<D>::to_float(encode<D>(v));
}

}  // namespace nf4
