// SPDX-License-Identifier: MIT
// Bounded JSON parsing for everything read from a checkpoint (index, config.json, quant states):
// a size limit checked before parsing, a nesting-depth limit and duplicate-key refusal enforced
// while parsing, and a document built without recursion. Error messages give the position of a
// problem and the offending key, never a snippet of the text (it may be a file the input links
// to). The safetensors header has its own streaming parser (safetensors.cpp) on the same rules.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace nf4::io {

// Deeper than any real config or index (transformers' configs nest 3 or 4 levels).
inline constexpr int kMaxJsonDepth = 64;

struct JsonLimits {
  std::size_t max_bytes;
  int max_depth = kMaxJsonDepth;
};

// Parses `text` as one JSON value. Throws nf4::Error(NF4_ERR_FORMAT) starting with `what` when the
// text is too large, too deep, not valid JSON, or repeats a key inside one object.
nlohmann::json parse_json_bounded(std::string_view text, std::string_view what, const JsonLimits& limits);

// A string from a file, fit for an error message: printable ASCII kept, everything else escaped,
// at most `max_chars` characters (then "...").
std::string printable(std::string_view s, std::size_t max_chars = 96);

}  // namespace nf4::io
