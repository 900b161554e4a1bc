// SPDX-License-Identifier: MIT
// Sharded checkpoints: `model.safetensors.index.json` as transformers writes it,
//   {"metadata": {"total_size": 123, ...}, "weight_map": {"tensor name": "shard file name", ...}}
// Shard names are plain .safetensors file names in the index's directory; anything with a path
// separator (or "." / "..") is rejected, so an index can never make us read or write outside it,
// and no shard takes the name of config.json or another file of the model directory.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tools/checkpoint/file_open.h"

namespace nf4::io {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
// Far above any real index (a 100k-tensor model's index is about 10 MB); the JSON depth limit
// of tools/checkpoint/json_limits.h applies too.
inline constexpr std::int64_t kMaxIndexBytes = std::int64_t{64} << 20;

struct ShardIndex {
  nlohmann::json metadata = nlohmann::json::object();  // kept as found (values need not be strings)
  std::map<std::string, std::string> weight_map;         // tensor name -> shard file name
  // The distinct shard names, sorted (transformers' names sort in shard order).
  std::vector<std::string> shard_names() const;
};

// Throws nf4::Error(NF4_ERR_FORMAT) naming the problem (repeated tensor names included).
ShardIndex parse_index(std::string_view json_text);
// Reads a file (a regular file, under `policy` when given); NF4_ERR_IO / NF4_ERR_FORMAT with the
// path in the message.
ShardIndex read_index(const std::string& path, const InputPolicy* policy = nullptr);
// The text transformers writes (2-space indent, sorted keys, trailing newline) for an index whose
// metadata values are scalars; deeper metadata values are written compactly, each on its member's
// line, so the text is at most a few times the size of the index it was read from (numbers are
// rewritten: "1e14" comes out as "100000000000000.0"), never many-fold.
std::string index_json(const ShardIndex& index);

// True for a plain file name that may appear in a weight_map.
bool is_plain_file_name(std::string_view name);

}  // namespace nf4::io
