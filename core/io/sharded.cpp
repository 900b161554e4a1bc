// SPDX-License-Identifier: MIT
#include "core/io/sharded.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"

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
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(NF4_ERR_FORMAT, "index is not valid JSON");
  if (!j.is_object()) fail(NF4_ERR_FORMAT, "index is not a JSON object");
  ShardIndex index;
  if (const auto m = j.find("metadata"); m != j.end() && !m->is_null()) {
    if (!m->is_object()) fail(NF4_ERR_FORMAT, "index: 'metadata' is not an object");
    index.metadata = *m;
  }
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) fail(NF4_ERR_FORMAT, "index: 'weight_map' missing or not an object");
  if (wm->empty()) fail(NF4_ERR_FORMAT, "index: 'weight_map' is empty");
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) fail(NF4_ERR_FORMAT, "index: weight_map['{}'] is not a string", tensor);
    const auto name = shard.get<std::string>();
    if (!is_plain_file_name(name))
      fail(NF4_ERR_FORMAT, "index: weight_map['{}'] = '{}' is not a plain file name in the index's directory", tensor, name);
    index.weight_map[tensor] = name;
  }
  return index;
}

ShardIndex read_index(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(NF4_ERR_IO, "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(NF4_ERR_IO, "{}: read failed", path);
  try {
    return parse_index(ss.str());
  } catch (const Error& e) {
    throw Error(e.status(), path + ": " + e.what());
  }
}

std::string index_json(const ShardIndex& index) {
  nlohmann::json j = nlohmann::json::object();
  j["metadata"] = index.metadata;
  j["weight_map"] = index.weight_map;
  return j.dump(2) + "\n";
}

}  // namespace nf4::io
