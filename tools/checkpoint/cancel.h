// SPDX-License-Identifier: MIT
// A cancellation hook for long loops in the file code (parsing a huge header, building one,
// copying files): a tool installs a function that throws when the user asked to stop (a signal
// flag), and the loops call check_cancel() every few thousand items, so a signal is honoured in
// every phase, not only between tensors. No hook installed: check_cancel() does nothing.
#pragma once

#include <atomic>

namespace nf4::io {

using CancelCheck = void (*)();

inline std::atomic<CancelCheck>& cancel_hook() {
  static std::atomic<CancelCheck> hook{nullptr};
  return hook;
}
// Installs `check` (nullptr removes it); returns the previous one.
inline CancelCheck set_cancel_check(CancelCheck check) { return cancel_hook().exchange(check); }
inline void check_cancel() {
  if (const CancelCheck c = cancel_hook().load(std::memory_order_relaxed)) c();
}

}  // namespace nf4::io
