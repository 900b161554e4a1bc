// SPDX-License-Identifier: MIT
// Helpers shared by the libFuzzer targets in tests/fuzz (see docs/RELIABILITY.md).
//
// The targets abort (FUZZ_ASSERT) on any broken invariant, not only on crashes the sanitizers
// see: a fuzzer that only looks for segfaults misses a validator that accepts a bad description,
// or a backend that silently disagrees with the oracle.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cpu/oracle.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/io/safetensors.h"
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
  FUZZ_ASSERT(expected == actual, "cpu backend differs from the oracle (numel %lld)", static_cast<long long>(t.numel));
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
