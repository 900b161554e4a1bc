// SPDX-License-Identifier: MIT
// The library's diagnostics (validation-layer messages, device checks) go through one sink: the
// application's callback (nf4_set_log_callback), else stderr when NF4_LOG asks for the level, else
// nowhere. A library never prints on its own.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include "nf4/nf4.h"

namespace nf4 {

// Whether a message of `level` reaches anyone (so callers can skip formatting it).
bool log_enabled(nf4_log_level level);
void log_message(nf4_log_level level, std::string_view message);

template <typename... Args>
void log(nf4_log_level level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_message(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace nf4
