// SPDX-License-Identifier: MIT
// A transformers model directory around a checkpoint: which files are weights and which come
// along unchanged into a dense copy (tokenizer files, generation config, chat templates, model
// card, license ...), and config.json edited for the dense copy without re-serialising it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/checkpoint/file_open.h"

namespace nf4::io {

inline constexpr const char* kConfigFileName = "config.json";
// transformers' configs are a few KB; multimodal ones some tens.
inline constexpr std::int64_t kMaxConfigBytes = std::int64_t{16} << 20;

// Weights in any format (and their indexes): never carried into a dense copy, whose own weights
// replace them (a copy of 4-bit weights in another format would pass for dense ones).
bool is_weight_file(std::string_view name);

// What a dense copy takes from a model directory besides its weights and config.json.
struct CarriedFiles {
  std::vector<std::string> dirs;   // subdirectories holding carried files, relative, parents first
  std::vector<std::string> files;  // relative paths ("tokenizer.json", "1_Pooling/config.json"), sorted
  // Entries not carried, each with the reason, for the tool to name them.
  std::vector<std::pair<std::string, std::string>> skipped;
};

// Walks `dir` and its subdirectories: every regular file is carried except the checkpoint's own
// files (`checkpoint_files`: its shards and index, converted), the top-level config.json
// (rewritten), weights in other formats and nf4's own temporaries and locks (skipped, with the
// reason). A symbolic link to a directory is not followed, and hidden directories (.git, .cache)
// are not entered: both skipped, with the reason. Each carried file is opened
// under `policy` first, so a FIFO, a device or a link out of the directory fails here, naming it,
// before any work is done. Throws nf4::Error(NF4_ERR_IO).
CarriedFiles carried_files(const std::string& dir, const InputPolicy& policy, const std::vector<std::string>& checkpoint_files);

// config.json for the dense copy: the same bytes minus the top-level "quantization_config"
// member, with the top-level dtype members ("torch_dtype", and "dtype" where present) set to
// `dtype` (added as "torch_dtype" if there is neither); `dtype` empty: left as they are. The text
// is validated first (size, depth, repeated keys: tools/checkpoint/json_limits.h) and must be an object.
// Throws nf4::Error(NF4_ERR_FORMAT) starting with `what`.
// `what` starts the messages (the file's path, say).
std::string dense_model_config(std::string_view text, std::string_view dtype, std::string_view what = kConfigFileName);

}  // namespace nf4::io
