// SPDX-License-Identifier: MIT
// Fuzz target: io::parse_header on arbitrary text.
// Input: 8 bytes little-endian = the data-section size the header is checked against (any
// non-negative int64, so size arithmetic near 2^63 is exercised), then the JSON header text.
// Checks: only nf4::Error(NF4_ERR_FORMAT) escapes; every accepted header satisfies the
// invariants of fuzz::check_header (offsets inside the data, no overlap, bytes == numel * size).
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nf4::fuzz::Bytes in(data, size);
  const auto data_bytes = static_cast<std::int64_t>(in.take<std::uint64_t>() & 0x7fffffffffffffffull);
  try {
    const auto h = nf4::io::parse_header(in.rest(), data_bytes);
    nf4::fuzz::check_header(h, data_bytes);
  } catch (const nf4::Error& e) {
    FUZZ_ASSERT(e.status() == NF4_ERR_FORMAT, "status %d, expected NF4_ERR_FORMAT: %s", e.status(), e.what());
    FUZZ_ASSERT(e.what()[0] != '\0', "empty error message");
  }
  return 0;
}
