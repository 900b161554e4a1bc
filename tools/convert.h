// SPDX-License-Identifier: MIT
// `nf4 convert`: a bitsandbytes 4-bit checkpoint to a dense safetensors checkpoint that
// transformers loads. Exposed as a function (not only a subcommand) so tests can drive it and
// observe it between pieces of work.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nf4/nf4.h"

namespace nf4::cli {

struct ConvertProgress {
  std::size_t tensor = 0, tensors = 0;     // tensors written so far / in total (all shards)
  std::int64_t bytes = 0, total_bytes = 0;  // data bytes written so far / in total
};

struct ConvertOptions {
  std::string in, out;
  std::optional<nf4_dtype> dtype;  // default: each parameter's quant-state dtype
  nf4_backend_kind backend = NF4_BACKEND_AUTO;
  bool force = false;     // replace an existing OUT (never IN)
  bool follow_symlinks = false;  // read files of a model directory that link outside it
  bool progress = false;  // progress on stderr even when it is not a terminal
  std::int64_t batch_bytes = std::int64_t{256} << 20;  // output bytes dequantized per call (RAM bound)
  // Called after each piece of work, before the next interrupt check (tests raise signals here).
  std::function<void(const ConvertProgress&)> on_progress;
};

struct ConvertResult {
  std::string backend_device;
  std::size_t quantized = 0, dense = 0, dropped = 0, shards = 0;
  std::size_t carried = 0;  // non-weight files of a model directory written alongside (config.json included)
  // Files of a model directory not carried into OUT, each with the reason (weights in another
  // format, nf4's own temporaries, links to directories), for the tool to name them.
  std::vector<std::pair<std::string, std::string>> skipped;
  std::int64_t data_bytes = 0;
};

// Runs the conversion. Throws nf4::Error; NF4_ERR_INTERRUPTED when SIGINT, SIGTERM, SIGHUP,
// SIGQUIT, SIGPIPE, SIGXFSZ or another signal whose default action ends the process arrived
// (handlers are installed for the duration of the call; SIGKILL and the faults a program raises
// on itself, such as SIGSEGV, excepted). On any error
// OUT is left as it was and no temporary file remains; a second call for the same OUT while one
// runs (in any process) fails at once with NF4_ERR_IO.
ConvertResult convert_checkpoint(const ConvertOptions& options);

// The signal that interrupted the last convert_checkpoint (0 if none).
int last_interrupt_signal();

}  // namespace nf4::cli
