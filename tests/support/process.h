// SPDX-License-Identifier: MIT
// Helpers for the tests that run processes and signal them (tests/test_faults_*.cpp), and
// that look at what a process has read or mapped.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace nf4::test {

// The name of a signal that interrupts `nf4 convert` ("SIGINT"), spelled out here rather than
// taken from the tool, so that the tests check the tool's message; "?" for any other signal.
inline std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

// Bytes the process has read so far through read(2) / pread(2) (/proc/PID/io rchar); -1 if
// unreadable. Data read through a mapping does not count.
inline std::int64_t bytes_read_by(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/io");  // size 0 in stat: read it as a stream
  for (std::string line; std::getline(f, line);)
    if (line.rfind("rchar: ", 0) == 0) return std::stoll(line.substr(7));
  return -1;
}

// Whether the process has `path` memory-mapped (/proc/PID/maps).
inline bool maps_file(pid_t pid, const std::string& path) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(f, line);)
    if (line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0) return true;
  return false;
}

}  // namespace nf4::test
