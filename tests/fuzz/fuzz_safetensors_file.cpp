// SPDX-License-Identifier: MIT
// Fuzz target: a whole safetensors file through the reader, as `nf4 verify` reads it.
// Input: the file's bytes. They are put in an in-memory file (memfd) opened by path, so the real
// open/fstat/pread/mmap code runs. Then every quantized parameter is found and checked
// (find_quantized_params), and each one of bounded size is dequantized by the oracle and by the
// cpu backend through the C API, which must agree bit for bit, and in pieces read with pread
// (io::read_piece, as verify reads), which must give the same bytes.
// Checks: only NF4_ERR_FORMAT escapes the reader; accepted headers satisfy fuzz::check_header;
// accepted parameters have consistent sizes; no sanitizer report.
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nf4::fuzz::MemFile mem(std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const nf4::io::SafetensorsFile f(mem.path());
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    FUZZ_ASSERT(size >= 8 && n <= size - 8, "accepted a header length %llu past the end", static_cast<unsigned long long>(n));
    const auto data_bytes = static_cast<std::int64_t>(size - 8 - n);
    nf4::fuzz::check_header(f.header(), data_bytes);
    nf4::fuzz::dequantize_params(f, 1 << 16);
  } catch (const nf4::Error& e) {
    FUZZ_ASSERT(e.status() == NF4_ERR_FORMAT, "status %d, expected NF4_ERR_FORMAT: %s", e.status(), e.what());
  }
  return 0;
}
