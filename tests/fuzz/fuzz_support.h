// SPDX-License-Identifier: MIT
// Helpers shared by the libFuzzer targets in tests/fuzz (see docs/RELIABILITY.md).
//
// The targets abort (FUZZ_ASSERT) on any broken invariant, not only on crashes the sanitizers
// see: a fuzzer that only looks for segfaults misses a validator that accepts a bad description,
// or a backend that silently disagrees with the oracle.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/oracle.h"
#include "core/dtype.h"
#include "core/error.h"
#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/safetensors.h"
#include "core/tensor.h"
#include "nf4/nf4.h"

#define FUZZ_ASSERT(cond, ...)                                                     \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "FUZZ_ASSERT failed: %s (%s:%d): ", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                          \
      std::fprintf(stderr, "\n");                                                 \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

namespace nf4::fuzz {

// Reads typed values off the front of the fuzz input; past the end it yields zeros, so every
// input, however short, is a complete test case.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  template <typename T>
  T take() {
    T v{};
    const std::size_t k = std::min(sizeof(T), n_);
    std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  // A value in [lo, hi] (inclusive).
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    const auto v = take<std::uint32_t>();
    return lo + static_cast<std::int64_t>(span == 0 ? v : v % span);
  }
  // Copies up to `bytes` of the input into dst; the rest of dst keeps a fixed pattern (byte i is
  // i * 37 + 11 mod 256). The pattern is copied from a table a period at a time: a byte loop
  // here is instrumented like the code under test, a coverage callback per byte, which would
  // make the filling of fuzz_capi's buffers a large part of its run time.
  void fill(void* dst, std::size_t bytes) {
    static const auto pattern = [] {
      std::array<std::uint8_t, 512> p{};
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(i * 37 + 11);
      return p;
    }();
    auto* d = static_cast<std::uint8_t*>(dst);
    const std::size_t k = std::min(bytes, n_);
    std::memcpy(d, p_, k);
    for (std::size_t i = k; i < bytes;) {  // the pattern repeats every 256 bytes
      const std::size_t n = std::min<std::size_t>(256, bytes - i);
      std::memcpy(d + i, pattern.data() + i % 256, n);
      i += n;
    }
    p_ += k;
    n_ -= k;
  }
  std::string_view rest() const { return {reinterpret_cast<const char*>(p_), n_}; }
  std::size_t remaining() const { return n_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline bool pow2(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The count a field claims: right, near miss, or raw.
inline std::int64_t claim(Bytes& in, std::int64_t right) {
  const auto sel = in.take<std::uint8_t>() % 16;
  if (sel < 12) return right;
  if (sel < 15) return right + in.range(-2, 2);
  return in.take<std::int64_t>();
}

// An enum field holding whatever int a C caller put there: written as raw bytes, since forming an
// out-of-range enum value in C++ would itself be undefined.
template <typename E>
std::int32_t set_enum(E& field, Bytes& in, int values) {
  static_assert(sizeof(E) == sizeof(std::int32_t));
  const auto sel = in.take<std::uint8_t>();
  const std::int32_t v = sel < 240 ? sel % values : in.take<std::int32_t>();
  std::memcpy(&field, &v, sizeof v);
  return v;
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (a NULL range shares none).
inline bool overlaps(const void* a, std::int64_t a_bytes, const void* b, std::int64_t b_bytes) {
  if (!a || !b) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + static_cast<std::uintptr_t>(b_bytes) && y < x + static_cast<std::uintptr_t>(a_bytes);
}

// The block format of a weight description: blocksize, nested, nested_blocksize and the nested
// offset, each mostly right, sometimes off or raw.
inline void take_block_format(Bytes& in, nf4_tensor& t) {
  auto sel = in.take<std::uint8_t>() % 16;
  t.blocksize = sel < 13 ? 32 << in.range(0, 7) : sel < 14 ? (32 << in.range(0, 7)) + static_cast<int>(in.range(-1, 1)) : in.take<std::int32_t>();
  sel = in.take<std::uint8_t>() % 16;
  t.nested = sel < 7 ? 0 : sel < 15 ? 1 : in.take<std::int32_t>();
  sel = in.take<std::uint8_t>() % 16;
  t.nested_blocksize = sel < 10 ? 256 : sel < 15 ? 1 << in.range(0, 21) : in.take<std::int32_t>();
  t.nested_offset = in.take<float>();
}

// A weight description's right array sizes where its fields define them (else 1, which the
// model knows to be meaningless), and which fields are valid.
struct WeightSizes {
  bool numel_ok, bs_ok, nbs_ok, qt_ok, qt_nf4;
  std::int64_t packed, blocks, nblocks;  // packed bytes, absmax and nested_absmax entries
};

inline WeightSizes weight_sizes(const nf4_tensor& t) {
  std::int32_t qt;
  std::memcpy(&qt, &t.quant_type, sizeof qt);
  WeightSizes s{};
  s.numel_ok = t.numel >= 1 && t.numel <= NF4_MAX_ELEMENTS;
  s.bs_ok = pow2(t.blocksize) && t.blocksize >= 32 && t.blocksize <= 4096;
  s.nbs_ok = pow2(t.nested_blocksize) && t.nested_blocksize <= (1 << 20);
  s.qt_nf4 = qt == NF4_QUANT_NF4;
  s.qt_ok = qt == NF4_QUANT_NF4 || qt == NF4_QUANT_FP4;
  s.packed = s.numel_ok ? ceil_div(t.numel, 2) : 1;
  s.blocks = s.numel_ok && s.bs_ok ? ceil_div(t.numel, t.blocksize) : 1;
  s.nblocks = s.nbs_ok ? ceil_div(s.blocks, t.nested_blocksize) : 1;
  return s;
}

// The five array counts of a weight description, each claimed against its right value.
inline void claim_weight_counts(Bytes& in, nf4_tensor& t, const WeightSizes& s) {
  t.packed_bytes = claim(in, s.packed);
  t.absmax_count = claim(in, s.blocks);
  t.quant_map_count = claim(in, 16);
  t.nested_absmax_count = claim(in, s.nblocks);
  t.nested_code_count = claim(in, 256);
}

// The model's verdict on the weight's own fields (not its output or dtype): every status whose
// check the description fails, each only where the check's inputs are defined.
template <typename Set>
void weight_violations(const nf4_tensor& t, const WeightSizes& s, Set& v) {
  if (!s.qt_ok) v.insert(NF4_ERR_QUANT_TYPE);
  if (!s.numel_ok) v.insert(NF4_ERR_ELEMENT_COUNT);
  if (!s.bs_ok) v.insert(NF4_ERR_BLOCKSIZE);
  if (t.nested != 0 && t.nested != 1) v.insert(NF4_ERR_INVALID_ARGUMENT);
  if (!t.packed || !t.absmax || (s.qt_nf4 && !t.quant_map)) v.insert(NF4_ERR_NULL_POINTER);
  if (s.numel_ok && t.packed_bytes != s.packed) v.insert(NF4_ERR_PACKED_SIZE);
  if (s.numel_ok && s.bs_ok && t.absmax_count != s.blocks) v.insert(NF4_ERR_ABSMAX_SIZE);
  if (t.quant_map && t.quant_map_count != 16) v.insert(NF4_ERR_QUANT_MAP_SIZE);
  if (t.nested == 1) {
    if (!s.nbs_ok) v.insert(NF4_ERR_NESTED_BLOCKSIZE);
    if (!t.nested_absmax || !t.nested_code) v.insert(NF4_ERR_NULL_POINTER);
    if (s.nbs_ok && s.numel_ok && s.bs_ok && t.nested_absmax_count != s.nblocks) v.insert(NF4_ERR_NESTED_ABSMAX_SIZE);
    if (t.nested_code_count != 256) v.insert(NF4_ERR_NESTED_CODE_SIZE);
  }
}

// The arrays of a valid weight that an output must not overlap, with their sizes in bytes, in
// the order of kWeightInputNames.
inline std::vector<std::pair<const void*, std::int64_t>> weight_inputs(const nf4_tensor& t, const WeightSizes& s) {
  std::vector<std::pair<const void*, std::int64_t>> in = {{t.packed, s.packed}, {t.absmax, s.blocks * (t.nested ? 1 : 4)}, {t.quant_map, 64}};
  if (t.nested) in.insert(in.end(), {{t.nested_absmax, s.nblocks * 4}, {t.nested_code, 1024}, {t.nested_offset_ptr, 4}});
  return in;
}
inline constexpr const char* kWeightInputNames[] = {"packed", "absmax", "quant_map", "nested_absmax", "nested_code", "nested_offset_ptr"};

// The name of the first of `inputs` (weight_inputs' list) that [p, p + bytes) overlaps, or NULL.
inline const char* overlapped_weight_array(const void* p, std::int64_t bytes, const std::vector<std::pair<const void*, std::int64_t>>& inputs) {
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (overlaps(p, bytes, inputs[i].first, inputs[i].second)) return kWeightInputNames[i];
  return nullptr;
}

// The weight's six arrays from the first six buffers, in weight_inputs' order (packed, absmax,
// quant_map, nested_absmax, nested_code, nested_offset_ptr).
inline void set_weight_arrays(nf4_tensor& t, const std::vector<std::uint8_t*>& ptr) {
  t.packed = ptr[0];
  t.absmax = ptr[1];
  t.quant_map = reinterpret_cast<const float*>(ptr[2]);
  t.nested_absmax = reinterpret_cast<const float*>(ptr[3]);
  t.nested_code = reinterpret_cast<const float*>(ptr[4]);
  t.nested_offset_ptr = reinterpret_cast<const float*>(ptr[5]);
}

// One buffer of a described case: its place in the arena (arena mode), the bytes allocated, and
// whether the description gets NULL instead.
struct Buffer {
  std::int64_t offset = 0, bytes = 0;
  bool null = false;
};

// The memory behind a described case: one arena holding every buffer at its offset, or one
// allocation per buffer, filled from the input. Every allocation is a region, to snapshot and
// compare.
struct Memory {
  struct Region {
    std::uint8_t* p;
    std::int64_t bytes;
  };
  std::vector<std::unique_ptr<std::uint8_t[]>> owned;
  std::vector<Region> regions;

  // The buffers' addresses (NULL where b[i].null); arena_bytes covers every buffer in arena mode.
  std::vector<std::uint8_t*> place(Bytes& in, const Buffer* b, std::size_t count, bool arena, std::int64_t arena_bytes) {
    std::uint8_t* base = nullptr;
    if (arena) base = allocate(in, arena_bytes);
    std::vector<std::uint8_t*> ptr(count);
    for (std::size_t i = 0; i < count; ++i) {
      ptr[i] = arena ? base + b[i].offset : allocate(in, b[i].bytes);
      if (b[i].null) ptr[i] = nullptr;
    }
    return ptr;
  }

 private:
  std::uint8_t* allocate(Bytes& in, std::int64_t bytes) {
    owned.emplace_back(new std::uint8_t[std::max<std::int64_t>(bytes, 1)]);
    std::uint8_t* p = owned.back().get();
    in.fill(p, static_cast<std::size_t>(bytes));
    regions.push_back({p, bytes});
    return p;
  }
};

// The cpu context the API targets run on, made once per process.
inline nf4_context* cpu_context() {
  static nf4_context* ctx = [] {
    nf4_context* c = nullptr;
    FUZZ_ASSERT(nf4_context_create(NF4_BACKEND_CPU, &c) == NF4_OK, "cannot create a cpu context");
    return c;
  }();
  return ctx;
}

// An anonymous in-memory file reachable by path (/proc/self/fd/N), so the fuzzers exercise
// SafetensorsFile's real open/fstat/pread/mmap path without adding an in-memory entry point to core
// and without touching the disk.
class MemFile {
 public:
  explicit MemFile(std::string_view bytes) {
    fd_ = ::memfd_create("nf4-fuzz", MFD_CLOEXEC);
    FUZZ_ASSERT(fd_ >= 0, "memfd_create failed");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t w = ::write(fd_, bytes.data() + done, bytes.size() - done);
      FUZZ_ASSERT(w > 0, "write to memfd failed");
      done += static_cast<std::size_t>(w);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A minimal safetensors writer for building structured inputs (tensors laid out in order).
class FileBuilder {
 public:
  void add(const std::string& name, const char* dtype, std::vector<std::int64_t> shape, std::string_view bytes) {
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data_.size(), data_.size() + bytes.size()}}};
    data_.append(bytes);
  }
  void metadata(const std::string& key, const std::string& value) { header_["__metadata__"][key] = value; }
  std::string bytes() const {
    const std::string h = header_.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<std::uint64_t>(h.size()) >> (8 * i)) & 0xff);
    return out + h + data_;
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::string data_;
};

// Invariants every header the reader accepts must satisfy (checked independently of the reader).
inline void check_header(const io::Header& h, std::int64_t data_bytes) {
  std::int64_t prev_end = 0;
  for (const auto& t : h.tensors) {
    FUZZ_ASSERT(0 <= t.begin && t.begin <= t.end && t.end <= data_bytes, "tensor '%s' [%lld, %lld) outside %lld bytes",
                t.name.c_str(), static_cast<long long>(t.begin), static_cast<long long>(t.end),
                static_cast<long long>(data_bytes));
    FUZZ_ASSERT(t.begin >= prev_end, "tensor '%s' overlaps its predecessor", t.name.c_str());
    prev_end = t.end;
    // The element count, computed without overflow, times the element size is the byte count.
    unsigned __int128 n = 1;
    for (auto d : t.shape) {
      FUZZ_ASSERT(d >= 0, "negative dimension in '%s'", t.name.c_str());
      n *= static_cast<unsigned __int128>(d);
      if (n > (static_cast<unsigned __int128>(1) << 100)) n = static_cast<unsigned __int128>(1) << 100;  // stays exact enough
    }
    FUZZ_ASSERT(n * io::dtype_size(t.dtype) == static_cast<unsigned __int128>(t.bytes()), "size of '%s' disagrees with its shape",
                t.name.c_str());
  }
}

// Dequantizes `t` (host pointers, out ignored) with the oracle and through the C API on the cpu
// backend, and checks the two agree bit for bit and neither writes past numel elements.
// Whether the element of dtype d at p is a NaN.
inline bool is_nan_element(const std::uint8_t* p, nf4_dtype d) {
  return dispatch_dtype(d, [&](auto tag) { return std::isnan(load_element<decltype(tag)::value>(p, 0)); });
}

// The first element where two outputs of numel elements of dtype d disagree, or -1. Elements agree
// when their bits are equal or both are NaN: docs/DESIGN.md section 2.4 promises a NaN there, not its
// payload. A product of two NaN operands (a NaN table value times a NaN scale) carries the payload of
// whichever operand the hardware takes first, and the compiler orders the operands of the oracle's
// scalar product and of the SIMD product independently; a GPU's arithmetic gives its canonical NaN.
inline std::int64_t first_difference(nf4_dtype d, const std::uint8_t* a, const std::uint8_t* b, std::int64_t numel) {
  const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(d));
  for (std::int64_t i = 0; i < numel; ++i)
    if (std::memcmp(a + i * es, b + i * es, static_cast<std::size_t>(es)) != 0 &&
        !(is_nan_element(a + i * es, d) && is_nan_element(b + i * es, d)))
      return i;
  return -1;
}

// One buffer's snapshot after a call against the expected one: every byte equal, except inside the
// output, bytes [out, out + out_bytes) of the buffer that starts at `base` (when it lies there),
// whose elements of dtype d may differ where both are NaNs (first_difference says why), or in any
// way when !compare_output (bits the backend chooses, the fast contract's).
inline bool same_but_nan_payloads(const std::uint8_t* base, const std::vector<std::uint8_t>& after, const std::vector<std::uint8_t>& expected,
                                  const void* out, std::size_t out_bytes, nf4_dtype d, bool compare_output = true) {
  if (after.size() != expected.size()) return false;
  if (after == expected) return true;  // memcmp: the byte loop below is instrumented, and slow
  const auto* o_ptr = static_cast<const std::uint8_t*>(out);
  const bool out_here = o_ptr >= base && o_ptr < base + after.size();
  const std::size_t es = nf4_dtype_size(d);
  const std::size_t o = out_here ? static_cast<std::size_t>(o_ptr - base) : 0;
  const std::size_t o_end = out_here ? std::min(after.size(), o + out_bytes) : 0;
  for (std::size_t b = 0; b < after.size(); ++b) {
    if (after[b] == expected[b]) continue;
    if (!out_here || b < o || b >= o_end) return false;
    if (!compare_output) continue;
    const std::size_t elem = o + (b - o) / es * es;
    if (elem + es > after.size() || !is_nan_element(&after[elem], d) || !is_nan_element(&expected[elem], d)) return false;
  }
  return true;
}

inline void dequantize_and_compare(nf4_tensor t) {
  static nf4_context* ctx = [] {
    nf4_context* c = nullptr;
    FUZZ_ASSERT(nf4_context_create(NF4_BACKEND_CPU, &c) == NF4_OK, "cannot create a cpu context");
    return c;
  }();
  const std::int64_t bytes = t.numel * static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
  std::vector<std::uint8_t> expected(bytes + 16, 0x5A), actual(bytes + 16, 0x5A);
  t.out = expected.data();
  t.out_bytes = bytes;
  cpu::oracle_dequantize(t);
  t.out = actual.data();
  const nf4_status s = nf4_dequantize_host(ctx, &t);
  FUZZ_ASSERT(s == NF4_OK, "C API failed where the oracle succeeded: %s", nf4_last_error(ctx));
  const std::int64_t at = expected == actual ? -1 : first_difference(t.out_dtype, expected.data(), actual.data(), t.numel);
  FUZZ_ASSERT(at < 0, "cpu backend differs from the oracle at element %lld of %lld", static_cast<long long>(at),
              static_cast<long long>(t.numel));
  for (std::int64_t i = bytes; i < bytes + 16; ++i) FUZZ_ASSERT(actual[i] == 0x5A, "wrote past the output");
}

// What `nf4 verify` reads: `p` in two pieces (where it has more than one granule), each read from
// the file with pread (io::read_piece), must dequantize on the oracle to the bytes of `whole` (the
// same parameter described through the mapping), piece for piece.
inline void compare_pieces(const io::SafetensorsFile& f, io::QuantizedParam p, const nf4_tensor& whole) {
  for (const io::SafetensorsFile** file : {&p.files.weight, &p.files.absmax, &p.files.quant_map, &p.files.nested_absmax,
                                           &p.files.nested_quant_map, &p.files.quant_state})
    if (!*file) *file = &f;
  const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(whole.out_dtype));
  std::vector<std::uint8_t> expected(static_cast<std::size_t>(whole.numel * es), 0x5A), got;
  nf4_tensor t = whole;
  t.out = expected.data();
  t.out_bytes = whole.numel * es;
  cpu::oracle_dequantize(t);
  const std::int64_t g = io::piece_granularity(p);
  const std::int64_t piece = g * (1 + (p.numel / g) / 2);
  io::PieceBuffers buffers;
  for (std::int64_t first = 0; first < p.numel; first += piece) {
    nf4_tensor s = io::read_piece(p, whole.out_dtype, first, std::min(piece, p.numel - first), buffers);
    got.assign(static_cast<std::size_t>(s.numel * es + 16), 0xA5);
    s.out = got.data();
    s.out_bytes = s.numel * es;
    cpu::oracle_dequantize(s);
    FUZZ_ASSERT(std::memcmp(got.data(), expected.data() + first * es, static_cast<std::size_t>(s.numel * es)) == 0,
                "'%s': the piece at element %lld read with pread differs from the whole tensor", p.name.c_str(),
                static_cast<long long>(first));
    for (std::int64_t i = s.numel * es; i < s.numel * es + 16; ++i) FUZZ_ASSERT(got[static_cast<std::size_t>(i)] == 0xA5, "wrote past a piece");
  }
}

// Every quantized parameter of an opened file, dequantized (bounded sizes) and compared.
inline void dequantize_params(const io::SafetensorsFile& f, std::int64_t max_numel) {
  std::vector<io::QuantizedParam> params;
  try {
    params = io::find_quantized_params(f);
  } catch (const Error& e) {
    FUZZ_ASSERT(e.status() == NF4_ERR_FORMAT, "find_quantized_params: status %d, expected NF4_ERR_FORMAT", e.status());
    return;
  }
  int k = 0;
  for (const auto& p : params) {
    FUZZ_ASSERT(p.weight && p.absmax && p.quant_map && p.quant_state, "parameter '%s' lacks a companion", p.name.c_str());
    FUZZ_ASSERT(p.weight->bytes() == (p.numel + 1) / 2, "weight bytes of '%s'", p.name.c_str());
    FUZZ_ASSERT(p.absmax->numel() == (p.numel + p.state.blocksize - 1) / p.state.blocksize, "absmax count of '%s'",
                p.name.c_str());
    if (p.numel > max_numel) continue;
    const nf4_tensor whole = io::describe(f, p, static_cast<nf4_dtype>(k++ % 3), nullptr, 0);
    dequantize_and_compare(whole);
    compare_pieces(f, p, whole);
  }
}

}  // namespace nf4::fuzz
