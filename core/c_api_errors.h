// SPDX-License-Identifier: MIT
// How every C entry point reports failures: run the body, turn any exception into an nf4_status,
// and keep the message for nf4_last_error() / nf4_vulkan_last_error(). Messages are kept per
// handle and per calling thread (see the thread-safety rules in nf4.h); functions without a handle
// use one thread-local slot shared by the whole library.
#pragma once

#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "nf4/nf4.h"

namespace nf4 {

class ErrorSlots {
 public:
  void set(const std::string& message) {
    std::lock_guard lock(mutex_);
    by_thread_[std::this_thread::get_id()] = message;
  }
  // Valid until the calling thread's next failure on the same handle.
  const char* get() const {
    std::lock_guard lock(mutex_);
    const auto it = by_thread_.find(std::this_thread::get_id());
    return it == by_thread_.end() ? "" : it->second.c_str();
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::thread::id, std::string> by_thread_;
};

// The slot of functions that have no handle (nf4_last_error(NULL)).
inline std::string& thread_last_error() {
  thread_local std::string message;
  return message;
}

inline void set_last_error(ErrorSlots* slots, const std::string& message) {
  if (slots) slots->set(message);
  else thread_last_error() = message;
}

// Runs f and never lets an exception escape; `slots` may be null (no handle).
template <typename F>
nf4_status guarded(ErrorSlots* slots, F&& f) noexcept {
  try {
    f();
    return NF4_OK;
  } catch (const Error& e) {
    set_last_error(slots, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(slots, "out of host memory");
    return NF4_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(slots, std::string("internal error: ") + e.what());
    return NF4_ERR_INTERNAL;
  } catch (...) {
    set_last_error(slots, "internal error: unknown exception");
    return NF4_ERR_INTERNAL;
  }
}

}  // namespace nf4
