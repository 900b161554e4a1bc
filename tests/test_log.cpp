// SPDX-License-Identifier: MIT
// The log sink: the application's callback receives the library's diagnostics; without one
// nothing is printed unless NF4_LOG asks for it.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/log.h"
#include "nf4/nf4.h"

namespace {
struct Seen {
  std::vector<std::pair<nf4_log_level, std::string>> messages;
};
void collect(nf4_log_level level, const char* message, void* user) { static_cast<Seen*>(user)->messages.emplace_back(level, message); }
}  // namespace

TEST_CASE("log: the callback receives every level with its text; NULL restores the default") {
  Seen seen;
  nf4_set_log_callback(collect, &seen);
  CHECK(nf4::log_enabled(NF4_LOG_DEBUG));
  nf4::log(NF4_LOG_WARNING, "device {} said {}", 3, "hello");
  nf4::log(NF4_LOG_DEBUG, "detail");
  nf4_set_log_callback(nullptr, nullptr);
  nf4::log(NF4_LOG_ERROR, "not delivered to the old callback");
  REQUIRE(seen.messages.size() == 2);
  CHECK(seen.messages[0].first == NF4_LOG_WARNING);
  CHECK(seen.messages[0].second == "device 3 said hello");
  CHECK(seen.messages[1].first == NF4_LOG_DEBUG);
}
