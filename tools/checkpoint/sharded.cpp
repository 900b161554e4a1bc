// SPDX-License-Identifier: MIT
#include "tools/checkpoint/sharded.h"

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "tools/checkpoint/cancel.h"
#include "tools/checkpoint/json_limits.h"

namespace nf4::io {

bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

std::vector<std::string> ShardIndex::shard_names() const {
  std::set<std::string> s;
  for (const auto& [tensor, shard] : weight_map) s.insert(shard);
  return {s.begin(), s.end()};
}

ShardIndex parse_index(std::string_view text) {
  nlohmann::json j = parse_json_bounded(text, "index", {kMaxIndexBytes});
  if (!j.is_object()) fail(NF4_ERR_FORMAT, "index is not a JSON object");
  ShardIndex index;
  if (const auto m = j.find("metadata"); m != j.end() && !m->is_null()) {
    if (!m->is_object()) fail(NF4_ERR_FORMAT, "index: 'metadata' is not an object");
    index.metadata = std::move(*m);
  }
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) fail(NF4_ERR_FORMAT, "index: 'weight_map' missing or not an object");
  if (wm->empty()) fail(NF4_ERR_FORMAT, "index: 'weight_map' is empty");
  std::size_t n = 0;
  for (auto& [tensor, shard] : wm->get_ref<nlohmann::json::object_t&>()) {
    if (!shard.is_string()) fail(NF4_ERR_FORMAT, "index: weight_map['{}'] is not a string", printable(tensor));
    auto& name = shard.get_ref<std::string&>();
    if (!is_plain_file_name(name))
      fail(NF4_ERR_FORMAT, "index: weight_map['{}'] = '{}' is not a plain file name in the index's directory", printable(tensor),
           printable(name));
    // A shard is a .safetensors file: so no shard can take the name of a file a dense copy
    // writes or carries (config.json, tokenizer.json, the index).
    if (name.size() <= 12 || name.compare(name.size() - 12, 12, ".safetensors") != 0)
      fail(NF4_ERR_FORMAT, "index: weight_map['{}'] = '{}' is not a .safetensors file name", printable(tensor), printable(name));
    index.weight_map.emplace_hint(index.weight_map.end(), tensor, std::move(name));
    if ((++n & 4095) == 0) check_cancel();
  }
  return index;
}

ShardIndex read_index(const std::string& path, const InputPolicy* policy) {
  const std::string text = read_text_file(path, kMaxIndexBytes, policy);
  try {
    return parse_index(text);
  } catch (const Error& e) {
    if (e.status() == NF4_ERR_INTERRUPTED) throw;
    throw Error(e.status(), path + ": " + e.what());
  }
}

std::string index_json(const ShardIndex& index) {
  using json = nlohmann::json;
  // transformers' layout (2-space indent, sorted keys) for the two levels it uses: one line per
  // metadata member and per weight_map entry. Each metadata value is written compactly whatever
  // its depth: indenting it would add two spaces per level to each of its lines, so metadata
  // nested 60 levels (the reader allows 64) would come out many times larger than it went in.
  const auto text = [](const auto& value) {  // a metadata value as is, a shard name as a JSON string
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, json>) return value.dump();
    else return json(value).dump();
  };
  const auto object = [&](const auto& members) {
    if (members.begin() == members.end()) return std::string("{}");
    std::string out;
    const char* sep = "{\n";
    for (const auto& [key, value] : members) {
      out += sep + std::string("    ") + json(key).dump() + ": " + text(value);
      sep = ",\n";
    }
    return out + "\n  }";
  };
  std::string out = "{\n  \"metadata\": ";
  out += index.metadata.is_object() ? object(index.metadata.items()) : index.metadata.dump();
  out += ",\n  \"weight_map\": " + object(index.weight_map);
  return out + "\n}\n";
}

}  // namespace nf4::io
