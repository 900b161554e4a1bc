// SPDX-License-Identifier: MIT
// Fuzz target: the JSON files of a model directory other than the safetensors headers.
// Input: 1 control byte, then the text.
//  1. io::parse_index(text): only NF4_ERR_FORMAT may escape; an accepted index has a non-empty
//     weight_map of plain file names, and index_json() of it parses back to the same index.
//  2. io::dense_model_config(text, dtype) (dtype from the control byte: none, float16, bfloat16,
//     float32): only NF4_ERR_FORMAT may escape; an accepted text was a JSON object, and the
//     result is one too, without a top-level quantization_config, with the dtype members set
//     (added as torch_dtype if absent), and every other top-level member equal to the input's.
// Checks: the invariants above; no sanitizer report (deep or huge inputs must be refused, not
// recursed into).
#include "tools/checkpoint/json_limits.h"
#include "tools/checkpoint/model_dir.h"
#include "tools/checkpoint/sharded.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void expect_format_error(const nf4::Error& e) {
  FUZZ_ASSERT(e.status() == NF4_ERR_FORMAT, "status %d, expected NF4_ERR_FORMAT: %s", e.status(), e.what());
  FUZZ_ASSERT(e.what()[0] != '\0', "empty error message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nf4::fuzz::Bytes in(data, size);
  const auto control = in.take<std::uint8_t>();
  const std::string text(in.rest());

  try {
    const nf4::io::ShardIndex idx = nf4::io::parse_index(text);
    FUZZ_ASSERT(!idx.weight_map.empty(), "empty weight_map accepted");
    for (const auto& [tensor, shard] : idx.weight_map) FUZZ_ASSERT(nf4::io::is_plain_file_name(shard), "shard name with a path");
    const nf4::io::ShardIndex back = nf4::io::parse_index(nf4::io::index_json(idx));
    FUZZ_ASSERT(back.weight_map == idx.weight_map && back.metadata == idx.metadata, "index does not round-trip");
  } catch (const nf4::Error& e) {
    expect_format_error(e);
  }

  static const char* const kDtypes[] = {"", "float16", "bfloat16", "float32"};
  const std::string dtype = kDtypes[control & 3];
  std::string out;
  try {
    out = nf4::io::dense_model_config(text, dtype);
  } catch (const nf4::Error& e) {
    expect_format_error(e);
    return 0;
  }
  const nlohmann::json before = nf4::io::parse_json_bounded(text, "input", nf4::io::JsonLimits{text.size() + 64});
  // The edit removes quantization_config and sets or adds one dtype entry, joined with the input's
  // own separator (which may be as long as the input): the output stays within twice the input
  // plus the entry.
  FUZZ_ASSERT(out.size() <= 2 * text.size() + 64, "the edited config.json grew from %zu to %zu bytes", text.size(), out.size());
  nlohmann::json after;
  try {
    after = nf4::io::parse_json_bounded(out, "output", nf4::io::JsonLimits{2 * text.size() + 64});
  } catch (const nf4::Error& e) {
    FUZZ_ASSERT(false, "the edited config.json does not parse: %s", e.what());
  }
  FUZZ_ASSERT(before.is_object() && after.is_object(), "not an object");
  FUZZ_ASSERT(!after.contains("quantization_config"), "quantization_config kept");
  for (const auto& [k, v] : before.items()) {
    if (k == "quantization_config") continue;
    if (!dtype.empty() && (k == "torch_dtype" || k == "dtype")) {
      FUZZ_ASSERT(after.contains(k) && after[k] == dtype, "dtype member '%s' not set", k.c_str());
      continue;
    }
    FUZZ_ASSERT(after.contains(k) && after[k] == v, "member '%s' changed or lost", k.c_str());
  }
  for (const auto& [k, v] : after.items())
    FUZZ_ASSERT(before.contains(k) || (k == "torch_dtype" && !dtype.empty()), "member '%s' appeared", k.c_str());
  if (!dtype.empty()) FUZZ_ASSERT(after.contains("torch_dtype") || after.contains("dtype"), "no dtype recorded");
  return 0;
}
