// SPDX-License-Identifier: MIT
#include "core/io/model_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <filesystem>

#include "core/error.h"
#include "core/io/json_limits.h"

namespace nf4::io {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The text of a JSON document that has already been validated, walked at the top level only.
class TopLevel {
 public:
  struct Member {
    std::size_t key_begin, value_begin, value_end;
    std::string key;
  };
  explicit TopLevel(std::string_view t) : t_(t) {}

  // Members of the top-level object, in order; `open` / `close`: positions of its braces.
  std::vector<Member> members(std::size_t* open, std::size_t* close) {
    std::vector<Member> out;
    std::size_t p = skip_ws(0);
    *open = p;
    p = skip_ws(p + 1);
    while (t_[p] != '}') {
      Member m{};
      m.key_begin = p;
      const std::size_t key_end = skip_string(p);
      m.key = parse_json_bounded(t_.substr(p, key_end - p), "config.json", {key_end - p}).get<std::string>();
      p = skip_ws(key_end);
      p = skip_ws(p + 1);  // ':'
      m.value_begin = p;
      m.value_end = skip_value(p);
      out.push_back(std::move(m));
      p = skip_ws(out.back().value_end);
      if (t_[p] == ',') p = skip_ws(p + 1);
    }
    *close = p;
    return out;
  }

 private:
  std::size_t skip_ws(std::size_t p) const {
    while (p < t_.size() && (t_[p] == ' ' || t_[p] == '\t' || t_[p] == '\n' || t_[p] == '\r')) ++p;
    return p;
  }
  // From an opening quote to just past the closing one.
  std::size_t skip_string(std::size_t p) const {
    for (++p; t_[p] != '"'; ++p)
      if (t_[p] == '\\') ++p;
    return p + 1;
  }
  // Past one value; containers by counting brackets (the text is valid JSON), no recursion.
  std::size_t skip_value(std::size_t p) const {
    if (t_[p] == '"') return skip_string(p);
    if (t_[p] == '{' || t_[p] == '[') {
      std::size_t depth = 0;
      do {
        if (t_[p] == '"') {
          p = skip_string(p);
          continue;
        }
        if (t_[p] == '{' || t_[p] == '[') ++depth;
        else if (t_[p] == '}' || t_[p] == ']') --depth;
        ++p;
      } while (depth > 0);
      return p;
    }
    while (p < t_.size() && t_[p] != ',' && t_[p] != '}' && t_[p] != ']' && t_[p] != ' ' && t_[p] != '\t' && t_[p] != '\n' &&
           t_[p] != '\r')
      ++p;
    return p;
  }

  std::string_view t_;
};

}  // namespace

bool is_weight_file(std::string_view name) {
  static constexpr std::array<std::string_view, 12> kSuffixes = {
      ".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pt", ".pth",
      ".ckpt",        ".h5",                     ".msgpack", ".msgpack.index.json", ".gguf", ".h5.index.json"};
  return std::any_of(kSuffixes.begin(), kSuffixes.end(), [&](std::string_view s) { return ends_with(name, s); });
}

std::vector<std::string> carried_files(const std::string& dir, const InputPolicy& policy) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_weight_file(name) || name == kConfigFileName || name.find(".nf4-") != std::string::npos) continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;  // subdirectories are not part of the model
    InputFile::open(path, &policy);  // throws for FIFOs, devices, links out of the directory
    names.push_back(name);
  }
  if (ec) fail(NF4_ERR_IO, "{}: cannot list the directory: {}", dir, ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

std::string dense_model_config(std::string_view text, std::string_view dtype) {
  if (!parse_json_bounded(text, "config.json", {static_cast<std::size_t>(kMaxConfigBytes)}).is_object())
    fail(NF4_ERR_FORMAT, "config.json: not a JSON object");
  std::size_t open = 0, close = 0;
  const std::vector<TopLevel::Member> members = TopLevel(text).members(&open, &close);
  const std::string dtype_value = fmt::format("\"{}\"", dtype);
  std::vector<std::string> kept;
  bool has_dtype = false;
  for (const auto& m : members) {
    if (m.key == "quantization_config") continue;
    if (!dtype.empty() && (m.key == "torch_dtype" || m.key == "dtype")) {
      has_dtype = true;
      kept.push_back(std::string(text.substr(m.key_begin, m.value_begin - m.key_begin)) + dtype_value);
      continue;
    }
    kept.push_back(std::string(text.substr(m.key_begin, m.value_end - m.key_begin)));
  }
  if (!dtype.empty() && !has_dtype) kept.push_back("\"torch_dtype\": " + dtype_value);
  // The separators and the text around the members are the original ones.
  std::string sep = ", ";
  if (members.size() >= 2) sep = std::string(text.substr(members[0].value_end, members[1].key_begin - members[0].value_end));
  std::string out(text.substr(0, members.empty() ? open + 1 : members[0].key_begin));
  for (std::size_t i = 0; i < kept.size(); ++i) {
    if (i > 0) out += sep;
    out += kept[i];
  }
  out += text.substr(members.empty() ? close : members.back().value_end);
  return out;
}

}  // namespace nf4::io
