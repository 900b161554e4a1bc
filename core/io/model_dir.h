// SPDX-License-Identifier: MIT
// A transformers model directory around a checkpoint: which files are weights and which come
// along unchanged into a dense copy (tokenizer files, generation config, chat templates, model
// card, license ...), and config.json edited for the dense copy without re-serialising it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/io/file_open.h"

namespace nf4::io {

inline constexpr const char* kConfigFileName = "config.json";
// transformers' configs are a few KB; multimodal ones some tens.
inline constexpr std::int64_t kMaxConfigBytes = std::int64_t{16} << 20;

// Weights in any format (and their indexes): never carried into a dense copy, whose own weights
// replace them.
bool is_weight_file(std::string_view name);

// The regular files of `dir` that a dense copy carries unchanged, sorted: every entry except
// weight files, config.json (rewritten), subdirectories (skipped) and nf4's own temporaries.
// Each one is opened under `policy` first, so a FIFO, a device or a link out of the directory
// fails here, naming it, before any work is done. Throws nf4::Error(NF4_ERR_IO).
std::vector<std::string> carried_files(const std::string& dir, const InputPolicy& policy);

// config.json for the dense copy: the same bytes minus the top-level "quantization_config"
// member, with the top-level dtype members ("torch_dtype", and "dtype" where present) set to
// `dtype` (added as "torch_dtype" if there is neither); `dtype` empty: left as they are. The text
// is validated first (size, depth, repeated keys: core/io/json_limits.h) and must be an object.
// Throws nf4::Error(NF4_ERR_FORMAT) starting with "config.json".
std::string dense_model_config(std::string_view text, std::string_view dtype);

}  // namespace nf4::io
