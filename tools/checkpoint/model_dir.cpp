// SPDX-License-Identifier: MIT
#include "tools/checkpoint/model_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <filesystem>

#include "core/error.h"
#include "tools/checkpoint/json_limits.h"

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
      m.key = parse_json_bounded(t_.substr(p, key_end - p), "a key", {key_end - p}).get<std::string>();
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
  // The Trainer's pickled arguments, not weights, whatever the suffix says.
  if (name == "training_args.bin") return false;
  static constexpr std::array<std::string_view, 12> kSuffixes = {
      ".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pt", ".pth",
      ".ckpt",        ".h5",                     ".msgpack", ".msgpack.index.json", ".gguf", ".h5.index.json"};
  return std::any_of(kSuffixes.begin(), kSuffixes.end(), [&](std::string_view s) { return ends_with(name, s); });
}

namespace {

// nf4's own temporaries and locks (tools/checkpoint/output.h): ".NAME.nf4-tmp-...", ".NAME.nf4-old-...",
// ".NAME.nf4-lock". Other names that merely contain ".nf4-" are ordinary files.
bool is_nf4_temporary(std::string_view name) {
  return !name.empty() && name[0] == '.' &&
         (name.find(".nf4-tmp-") != std::string_view::npos || name.find(".nf4-old-") != std::string_view::npos ||
          ends_with(name, ".nf4-lock"));
}

}  // namespace

CarriedFiles carried_files(const std::string& dir, const InputPolicy& policy, const std::vector<std::string>& checkpoint_files) {
  namespace fs = std::filesystem;
  CarriedFiles out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string rel = it->path().lexically_relative(dir).string();
    const std::string name = it->path().filename().string();
    const bool top = it.depth() == 0;
    if (top && (name == kConfigFileName || std::find(checkpoint_files.begin(), checkpoint_files.end(), name) != checkpoint_files.end()))
      continue;
    struct stat lst {}, st {};
    if (::lstat(it->path().c_str(), &lst) == 0 && S_ISDIR(lst.st_mode)) {
      // A clone's .git (whose LFS objects are the 4-bit weights again, under hashed names) or a
      // download cache's .cache: not part of the model.
      if (!name.empty() && name[0] == '.') {
        it.disable_recursion_pending();
        out.skipped.emplace_back(rel + "/", "a hidden directory (version control or cache data)");
      }
      continue;  // otherwise walked into
    }
    if (S_ISLNK(lst.st_mode) && ::stat(it->path().c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      out.skipped.emplace_back(rel, "a symbolic link to a directory, not followed");
      continue;
    }
    if (is_nf4_temporary(name)) {
      out.skipped.emplace_back(rel, "a temporary or lock file of nf4");
      continue;
    }
    if (is_weight_file(name)) {
      out.skipped.emplace_back(rel, "weights in another format; the dense copy's own weights replace them");
      continue;
    }
    InputFile::open(it->path().string(), &policy);  // throws for FIFOs, devices, links out of the directory
    out.files.push_back(rel);
  }
  if (ec) fail(NF4_ERR_IO, "{}: cannot list the directory: {}", dir, ec.message());
  std::sort(out.files.begin(), out.files.end());
  std::sort(out.skipped.begin(), out.skipped.end());
  for (const auto& f : out.files)
    for (auto slash = f.find('/'); slash != std::string::npos; slash = f.find('/', slash + 1)) out.dirs.push_back(f.substr(0, slash));
  std::sort(out.dirs.begin(), out.dirs.end());  // a parent sorts before its children
  out.dirs.erase(std::unique(out.dirs.begin(), out.dirs.end()), out.dirs.end());
  return out;
}

std::string dense_model_config(std::string_view text, std::string_view dtype, std::string_view what) {
  if (!parse_json_bounded(text, what, {static_cast<std::size_t>(kMaxConfigBytes)}).is_object())
    fail(NF4_ERR_FORMAT, "{}: not a JSON object", what);
  std::size_t open = 0, close = 0;
  const std::vector<TopLevel::Member> members = TopLevel(text).members(&open, &close);
  const std::string dtype_value = fmt::format("\"{}\"", dtype);
  // The text around the members is the input's: each kept member comes after the separator that
  // came before it in the input (the first kept one after none), an added torch_dtype after the
  // input's last separator. So the output is the input less what was cut, plus at most one entry
  // and one separator: one separator reused between every pair would multiply a long one by the
  // number of members (a config.json within the size limit could ask for terabytes).
  const auto separator_before = [&](std::size_t j) {
    return text.substr(members[j - 1].value_end, members[j].key_begin - members[j - 1].value_end);
  };
  std::string out(text.substr(0, members.empty() ? open + 1 : members[0].key_begin));
  bool first = true, has_dtype = false;
  for (std::size_t j = 0; j < members.size(); ++j) {
    const auto& m = members[j];
    if (m.key == "quantization_config") continue;
    if (!first) out += separator_before(j);
    first = false;
    if (!dtype.empty() && (m.key == "torch_dtype" || m.key == "dtype")) {
      has_dtype = true;
      out += text.substr(m.key_begin, m.value_begin - m.key_begin);
      out += dtype_value;
    } else {
      out += text.substr(m.key_begin, m.value_end - m.key_begin);
    }
  }
  if (!dtype.empty() && !has_dtype) {
    if (!first) out += members.size() >= 2 ? separator_before(members.size() - 1) : std::string_view(", ");
    out += "\"torch_dtype\": " + dtype_value;
  }
  out += text.substr(members.empty() ? close : members.back().value_end);
  return out;
}

}  // namespace nf4::io
