// SPDX-License-Identifier: MIT
// Errors inside the library are nf4::Error exceptions carrying a status code and a message; the C
// API (core/api.cpp) turns them into an nf4_status plus the context's last-error text. Nothing
// throws across the C boundary.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "nf4/nf4.h"

namespace nf4 {

class Error : public std::runtime_error {
 public:
  Error(nf4_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  nf4_status status() const noexcept { return status_; }

 private:
  nf4_status status_;
};

template <typename... Args>
[[noreturn]] void fail(nf4_status status, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(status, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace nf4

// Internal invariant check: names the expression, file and line.
#define NF4_CHECK(cond)                                                                          \
  do {                                                                                           \
    if (!(cond)) ::nf4::fail(NF4_ERR_INTERNAL, "internal check failed: {} ({}:{})", #cond, __FILE__, __LINE__); \
  } while (0)
