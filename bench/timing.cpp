// SPDX-License-Identifier: MIT
#include "bench/timing.h"

#include <cstdlib>

#include "core/error.h"

namespace nf4::bench {

Timing parse_timing(std::string_view text, std::string_view source) {
  if (text.empty() || text == "batch") return Timing::kBatch;
  if (text == "graph") return Timing::kGraph;
  if (text == "events") return Timing::kEvents;
  fail(NF4_ERR_INVALID_ARGUMENT, "{}='{}': expected batch, graph or events", source, text);
}

Timing timing_from_env() {
  const char* t = std::getenv("NF4_BENCH_TIMING");
  return parse_timing(t ? t : "");
}

}  // namespace nf4::bench
