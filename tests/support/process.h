// SPDX-License-Identifier: MIT
// Helpers for the tests that run processes and signal them (tests/test_faults_signals.cpp).
#pragma once

#include <signal.h>

namespace nf4::test {

// The name of a signal that interrupts `nf4 convert` ("SIGINT"), spelled out here rather than
// taken from the tool, so that the tests check the tool's message; "?" for any other signal.
inline const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGXFSZ: return "SIGXFSZ";
    default: return "?";
  }
}

}  // namespace nf4::test
