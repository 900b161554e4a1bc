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
// text is too large, too deep, not valid JSON (a byte order mark, a NUL byte or anything but
// whitespace after the value included), repeats a key inside one object, or holds an integer
// past the 64-bit range (nlohmann would read it as a rounded double: another value).
nlohmann::json parse_json_bounded(std::string_view text, std::string_view what, const JsonLimits& limits);

// Refuses what nlohmann's parser would silently skip or stop at: a UTF-8 byte order mark before the
// text (JSON forbids one; Python's json and the safetensors loader refuse it) and a NUL byte
// anywhere (the parser takes it for the end of the input, so "{}\0junk" would pass as "{}").
// Throws nf4::Error(NF4_ERR_FORMAT) starting with `what`.
void check_json_text(std::string_view text, std::string_view what);

// A string from a file, fit for an error message: printable ASCII kept, everything else escaped,
// at most `max_chars` characters (then "...").
std::string printable(std::string_view s, std::size_t max_chars = 96);

// A name or value from a file, fit for a terminal: valid UTF-8 text kept whole (no truncation),
// control characters (C0, DEL, C1: terminal escapes), backslashes and bytes that are not UTF-8
// written as \xNN, so a checkpoint can neither move the cursor nor retitle the window.
std::string terminal_text(std::string_view s);

}  // namespace nf4::io
