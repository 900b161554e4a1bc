// SPDX-License-Identifier: MIT
#include "core/env.h"
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace nf4 {
namespace {

struct Sink {
  std::mutex mutex;  // serializes callback replacement against delivery
  nf4_log_fn fn = nullptr;
  void* user = nullptr;
};

Sink& sink() {
  static Sink s;
  return s;
}

std::atomic<bool> g_has_callback{false};

// NF4_LOG=error|warning|info|debug: the most verbose level printed on stderr without a callback;
// unset or anything else: nothing.
int stderr_level() {
  static const int level = [] {
    const char* v = env_value(EnvVar::kLog);
    if (!v) return -1;
    static constexpr const char* kNames[] = {"error", "warning", "info", "debug"};
    for (int i = 0; i < 4; ++i)
      if (std::strcmp(v, kNames[i]) == 0) return i;
    return -1;
  }();
  return level;
}

const char* level_name(nf4_log_level level) {
  switch (level) {
    case NF4_LOG_ERROR: return "error";
    case NF4_LOG_WARNING: return "warning";
    case NF4_LOG_INFO: return "info";
    case NF4_LOG_DEBUG: return "debug";
  }
  return "?";
}

}  // namespace

bool log_enabled(nf4_log_level level) { return g_has_callback.load(std::memory_order_acquire) || static_cast<int>(level) <= stderr_level(); }

void log_message(nf4_log_level level, std::string_view message) {
  Sink& s = sink();
  std::lock_guard lock(s.mutex);
  if (s.fn) {
    const std::string text(message);
    s.fn(level, text.c_str(), s.user);
  } else if (static_cast<int>(level) <= stderr_level()) {
    std::fprintf(stderr, "nf4 %s: %.*s\n", level_name(level), static_cast<int>(message.size()), message.data());
  }
}

}  // namespace nf4

extern "C" void nf4_set_log_callback(nf4_log_fn fn, void* user) {
  nf4::Sink& s = nf4::sink();
  std::lock_guard lock(s.mutex);
  s.fn = fn;
  s.user = user;
  nf4::g_has_callback.store(fn != nullptr, std::memory_order_release);
}
