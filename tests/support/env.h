// SPDX-License-Identifier: MIT
// The environment of a test: variables set for a scope, flags read from it, and whether a backend
// can run here (skipping visibly where it cannot).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/backend.h"

namespace nf4::test {

inline bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// Sets an environment variable for a scope, then restores what was there: the GPU sweep runs the
// suite with NF4_VULKAN_TUNE set from outside to prove a configuration, and later tests must
// still see it.
struct ScopedEnv {
  std::string name, saved;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) had = true, saved = v;
    setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), saved.c_str(), 1);
    else unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// True when the backend can run here; otherwise says why (once per call) and returns false, or
// fails where NF4_TEST_REQUIRE_<NAME> (e.g. NF4_TEST_REQUIRE_VULKAN) is set.
inline bool backend_ready(nf4_backend_kind kind) {
  const RegisteredBackend* b = find_backend(kind);
  const std::string name = backend_name(kind);
  if (b && b->available) return true;
  MESSAGE(name << " tests skipped: " << (b ? b->device_or_reason : name + " backend not registered"));
  std::string require = "NF4_TEST_REQUIRE_";
  for (char c : name) require += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (std::getenv(require.c_str())) FAIL(require << " is set but the " << name << " backend is unavailable");
  return false;
}

// The backends that can run here, each one that cannot reported (with why) as a visible skip.
inline std::vector<nf4_backend_kind> available_backends() {
  std::vector<nf4_backend_kind> kinds;
  for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
    nf4_backend_info info{};
    REQUIRE(nf4_backend_get_info(i, &info) == NF4_OK);
    if (info.available) kinds.push_back(info.kind);
    else MESSAGE("backend '" << std::string(info.name) << "' skipped: " << std::string(info.device_name));
  }
  return kinds;
}

}  // namespace nf4::test
