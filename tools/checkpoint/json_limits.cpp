// SPDX-License-Identifier: MIT
#include "tools/checkpoint/json_limits.h"

#include <utility>
#include <vector>

#include "core/error.h"
#include "tools/checkpoint/cancel.h"

namespace nf4::io {

namespace {

using json = nlohmann::json;

// Builds the document with an explicit stack of open containers. A pointer to a container stays
// valid while it is open: its parent only grows again after the child is closed.
class BoundedBuilder {
 public:
  BoundedBuilder(std::string_view what, int max_depth) : what_(what), max_depth_(max_depth) {}

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& text) {
    // nlohmann hands an integer past 64 bits over as a double: it would be read back (and an
    // index written back) as another value than the file holds. (A double past its range is a
    // syntax error to nlohmann already.)
    if (text.find_first_of(".eE") == json::string_t::npos)
      return error("an integer past the 64-bit range");
    return put(json(v));
  }
  bool string(json::string_t& v) { return put(json(std::move(v))); }
  bool binary(json::binary_t&) { return error("binary values are not JSON"); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    json& obj = *stack_.back();
    if (obj.contains(k)) return error("key '" + printable(k) + "' appears twice in one object");
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    return error("not valid JSON (syntax error at byte " + std::to_string(position) + ")");
  }

  json take() { return std::move(root_); }
  const std::string& error_text() const { return error_; }

 private:
  bool error(std::string text) {
    if (error_.empty()) error_ = std::move(text);
    return false;
  }
  json* place(json&& v) {
    if ((++events_ & 4095) == 0) check_cancel();
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    auto [it, fresh] = parent.get_ref<json::object_t&>().emplace(std::move(key_), std::move(v));
    return &it->second;
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& v) {
    if (static_cast<int>(stack_.size()) >= max_depth_)
      return error("nested deeper than " + std::to_string(max_depth_) + " levels");
    stack_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  std::string_view what_;
  int max_depth_;
  json root_;
  std::vector<json*> stack_;
  std::string key_, error_;
  std::size_t events_ = 0;
};

}  // namespace

void check_json_text(std::string_view text, std::string_view what) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF")
    fail(NF4_ERR_FORMAT, "{}: starts with a UTF-8 byte order mark, which JSON does not allow (Python's json and the safetensors "
         "loader refuse it too); remove the first 3 bytes", what);
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    fail(NF4_ERR_FORMAT, "{}: not valid JSON (a NUL byte at byte {}; only whitespace may follow the JSON value)", what, nul);
}

nlohmann::json parse_json_bounded(std::string_view text, std::string_view what, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    fail(NF4_ERR_FORMAT, "{}: {} bytes is more than the {} bytes accepted", what, text.size(), limits.max_bytes);
  check_json_text(text, what);
  BoundedBuilder b(what, limits.max_depth);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &b);
  } catch (const json::exception&) {
    // Only reachable through inputs nlohmann reports by exception (none with a SAX handler
    // that returns false); never quote its message, which carries part of the text.
    fail(NF4_ERR_FORMAT, "{}: not valid JSON", what);
  }
  if (!ok) fail(NF4_ERR_FORMAT, "{}: {}", what, b.error_text().empty() ? std::string("not valid JSON") : b.error_text());
  return b.take();
}

std::string printable(std::string_view s, std::size_t max_chars) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

std::string terminal_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto escape = [&](std::size_t from, std::size_t n) {
    for (std::size_t k = from; k < from + n; ++k) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[k]));
  };
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c >= 0x20 && c < 0x7f && c != '\\') out += static_cast<char>(c);
      else escape(i, 1);
      ++i;
      continue;
    }
    // One UTF-8 sequence: its length from the lead byte, continuation bytes, no overlong form, no
    // surrogate, nothing past U+10FFFF.
    const std::size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? (c <= 0xef ? 3 : 0) : c >= 0xc2 ? 2 : 0;
    std::uint32_t cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    bool ok = len != 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      ok = (b & 0xc0) == 0x80;
      cp = (cp << 6) | (b & 0x3f);
    }
    ok = ok && !(len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff));
    if (!ok) {
      escape(i, 1);
      ++i;
      continue;
    }
    // C1 controls (terminal escapes too) and the bidirectional overrides, which reorder what
    // follows on the line.
    if (cp <= 0x9f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) escape(i, len);
    else out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace nf4::io
