// SPDX-License-Identifier: MIT
// Sharded checkpoints: `model.safetensors.index.json` as transformers writes it,
//   {"metadata": {"total_size": 123, ...}, "weight_map": {"tensor name": "shard file name", ...}}
// Shard names are plain file names in the index's directory; anything with a path separator
// (or "." / "..") is rejected, so an index can never make us read or write outside it.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace nf4::io {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

struct ShardIndex {
  nlohmann::json metadata = nlohmann::json::object();  // kept as found (values need not be strings)
  std::map<std::string, std::string> weight_map;         // tensor name -> shard file name
  // The distinct shard names, sorted (transformers' names sort in shard order).
  std::vector<std::string> shard_names() const;
};

// Throws nf4::Error(NF4_ERR_FORMAT) naming the problem.
ShardIndex parse_index(std::string_view json_text);
// Reads a file; NF4_ERR_IO / NF4_ERR_FORMAT with the path in the message.
ShardIndex read_index(const std::string& path);
// The text transformers would write (2-space indent, sorted keys, trailing newline).
std::string index_json(const ShardIndex& index);

// True for a plain file name that may appear in a weight_map.
bool is_plain_file_name(std::string_view name);

}  // namespace nf4::io
