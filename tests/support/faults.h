// SPDX-License-Identifier: MIT
// Helpers of the fault tests (tests/test_faults_*.cpp, docs/RELIABILITY.md), which run the nf4
// binary: the binary under test ($NF4_TEST_CLI, or this build's), run in a sandbox (a private
// tmpfs, a file-size limit) or under a watchdog, frozen when its temporary output appears, and a
// checkpoint big enough that converting it takes a while.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tools/checkpoint/safetensors.h"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"
#include "tests/support/io.h"
#include "tests/support/process.h"

namespace nf4::test {

// ---- the binary under test -------------------------------------------------------------------

// The binary under test: $NF4_TEST_CLI when set (another build's nf4, e.g. an older release's, to
// see which of these cases it fails), otherwise the one built with this suite.
#if defined(NF4_CLI_PATH)
#define NF4_BUILT_CLI NF4_CLI_PATH
#else
#define NF4_BUILT_CLI ""
#endif
inline const char* const kCli = [] {
  const char* e = std::getenv("NF4_TEST_CLI");
  return e && *e ? e : NF4_BUILT_CLI;
}();
inline const bool kHaveCli = *kCli != '\0';
// The first line of a test case that runs the tool: without one it reports the skip and returns.
#define NF4_SKIP_WITHOUT_CLI()                                                                 \
  do {                                                                                         \
    if (!::nf4::test::kHaveCli) {                                                              \
      MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF) and NF4_TEST_CLI is unset"); \
      return;                                                                                  \
    }                                                                                          \
  } while (0)

// In a forked child: stdout and stderr to `log` (created or truncated).
inline void output_to(const std::string& log) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::close(fd);
}

// In a forked child: `nf4 ARGS` in place of this process (exit status 127 if it cannot start).
[[noreturn]] inline void exec_nf4(const std::vector<std::string>& args) {
  std::vector<std::string> a = args;
  a.insert(a.begin(), kCli);
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  ::execv(kCli, argv.data());
  ::_exit(127);
}

// ---- in a sandbox: its own output file system, a file-size limit -----------------------------

// Where the child puts its output file system (a fresh tmpfs in a private mount namespace).
struct Mount {
  std::string dir;          // mount point ("" = no mount)
  bool read_only = false;
  std::int64_t bytes = 0;   // tmpfs size
};

struct Limits {
  Mount mount;
  std::int64_t max_file_bytes = -1;  // RLIMIT_FSIZE (SIGXFSZ ignored: writes fail with EFBIG)
};

// What a sandboxed run did.
struct Result {
  bool ran = false;          // false: the sandbox could not be set up (reason in `output`)
  bool exited = false;
  int code = -1, signal = 0;
  std::string output;        // stdout + stderr
  std::vector<std::string> left;  // entries of `list_dir` after the run, seen from inside
};

inline constexpr int kSetupFailed = 97;

// Enters a private mount namespace (as root directly, otherwise through a user namespace) and
// mounts a tmpfs at m.dir. Runs in the forked child only.
inline bool enter_mount(const Mount& m, std::string* why) {
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (::unshare(uid == 0 ? CLONE_NEWNS : CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    *why = std::string("unshare: ") + std::strerror(errno);
    return false;
  }
  if (uid != 0) {
    const auto put = [](const char* file, const std::string& text) {
      const int fd = ::open(file, O_WRONLY);
      const bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      if (fd >= 0) ::close(fd);
      return ok;
    };
    put("/proc/self/setgroups", "deny");
    if (!put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") || !put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
      *why = "cannot map the user namespace ids";
      return false;
    }
  }
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    *why = std::string("mount --make-rprivate /: ") + std::strerror(errno);
    return false;
  }
  const std::string opts = "size=" + std::to_string(m.bytes) + ",mode=0777";
  if (::mount("tmpfs", m.dir.c_str(), "tmpfs", m.read_only ? MS_RDONLY : 0, opts.c_str()) != 0) {
    *why = std::string("mount tmpfs: ") + std::strerror(errno);
    return false;
  }
  return true;
}

// Runs `nf4 ARGS` under `limits`; afterwards lists `list_dir` from inside the same mount namespace
// (a tmpfs in the child's namespace is invisible to this process).
inline Result run_nf4(const std::vector<std::string>& args, const Limits& limits, const std::string& list_dir, const ScratchDir& scratch) {
  const std::string log = scratch / "nf4-run.log", status_file = scratch / "nf4-run.status", listing = scratch / "nf4-run.ls";
  for (const auto& f : {log, status_file, listing}) std::filesystem::remove(f);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::string why;
    const auto write_file = [](const std::string& path, const std::string& text) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) return;
      [[maybe_unused]] const auto n = ::write(fd, text.data(), text.size());
      ::close(fd);
    };
    if (!limits.mount.dir.empty() && !enter_mount(limits.mount, &why)) {
      write_file(log, why);
      ::_exit(kSetupFailed);
    }
    const pid_t tool = ::fork();
    if (tool < 0) ::_exit(kSetupFailed);
    if (tool == 0) {
      output_to(log);
      if (limits.max_file_bytes >= 0) {
        ::signal(SIGXFSZ, SIG_IGN);  // kept across exec: the write fails with EFBIG instead
        const rlimit r{static_cast<rlim_t>(limits.max_file_bytes), static_cast<rlim_t>(limits.max_file_bytes)};
        ::setrlimit(RLIMIT_FSIZE, &r);
      }
      exec_nf4(args);
    }
    int st = 0;
    while (::waitpid(tool, &st, 0) < 0 && errno == EINTR) {
    }
    std::string names;
    for (const auto& e : std::filesystem::directory_iterator(list_dir)) names += e.path().filename().string() + "\n";
    write_file(listing, names);
    write_file(status_file, WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st)) : "signal " + std::to_string(WTERMSIG(st)));
    ::_exit(0);
  }
  int st = 0;
  while (::waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  Result r;
  r.output = read_text(log);
  if (WIFEXITED(st) && WEXITSTATUS(st) == kSetupFailed) return r;
  r.ran = true;
  const std::string status = read_text(status_file);
  r.exited = status.rfind("exit ", 0) == 0;
  if (r.exited) r.code = std::stoi(status.substr(5));
  else if (status.rfind("signal ", 0) == 0) r.signal = std::stoi(status.substr(7));
  std::string names = read_text(listing);
  for (std::size_t at = 0, nl; (nl = names.find('\n', at)) != std::string::npos; at = nl + 1) r.left.push_back(names.substr(at, nl - at));
  return r;
}

// ---- as a plain child: frozen at a chosen moment, or under a watchdog ------------------------

// How a child runs besides its arguments.
struct SpawnOptions {
  std::vector<std::string> env;     // "NAME=value", added to the environment
  long max_open_files = -1;         // RLIMIT_NOFILE
  int held_descriptors = 0;         // descriptors open in the child before nf4 starts (as a GPU driver's)
  bool stdout_to_dev_full = false;  // standard output on a full disk (/dev/full)
  bool output_to_closed_pipe = false;  // stdout and stderr into a pipe nobody reads: SIGPIPE on the first write
};

// Starts `nf4 ARGS` with stdout and stderr to `log`, SIGINT / SIGTERM at their defaults.
inline pid_t spawn_nf4(const std::vector<std::string>& args, const std::string& log, const SpawnOptions& options = {}) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  output_to(log);
  // A test runner may ignore them; convert keeps ignored signals ignored.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ, SIGPIPE, SIGUSR1, SIGALRM}) ::signal(sig, SIG_DFL);
  for (const auto& e : options.env) ::putenv(const_cast<char*>(e.c_str()));
  if (options.max_open_files >= 0) {
    const rlimit r{static_cast<rlim_t>(options.max_open_files), static_cast<rlim_t>(options.max_open_files)};
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  for (int i = 0; i < options.held_descriptors; ++i)
    if (::open("/dev/null", O_RDONLY) < 0) ::_exit(127);  // inherited: no O_CLOEXEC
  if (options.stdout_to_dev_full) {
    const int fd = ::open("/dev/full", O_WRONLY);
    ::dup2(fd, 1);
    ::close(fd);
  }
  if (options.output_to_closed_pipe) {
    int p[2];
    if (::pipe(p) != 0) ::_exit(127);
    ::close(p[0]);
    ::dup2(p[1], 1);
    ::dup2(p[1], 2);
    ::close(p[1]);
  }
  exec_nf4(args);
}

// Waits until `dir` has an entry (the conversion's temporary output: the signal handlers are
// installed before it is created), then stops the process: the caller acts on a frozen
// conversion, deterministic however fast the machine is. False if it ended (or hung) first.
// `marker`: wait for an entry whose name contains it instead (".nf4-tmp-": the lock is held then).
inline bool stop_when_output_appears(pid_t pid, const std::string& dir, int* status, bool* finished, const char* marker = "") {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  *finished = false;
  const auto appeared = [&] {
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().find(marker) != std::string::npos) return true;
    return false;
  };
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, status, WNOHANG) == pid) {
      *finished = true;
      return false;
    }
    if (appeared()) {
      ::kill(pid, SIGSTOP);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(pid, SIGKILL);
  return false;
}

// Waits until the process has read at least `bytes` (a whole header or index, for a caller that
// knows its size), or has mapped `path` (how builds before the pread reader read the header: so
// that NF4_TEST_CLI can show what they do), then stops it. The reader parses right after reading,
// so the process is usually frozen while parsing, before it reads any tensor data (a parse of tens
// of milliseconds can finish first: callers retry). False if the process ended first (or /proc/PID/io is
// unreadable: `why` says which).
inline bool stop_after_reading(pid_t pid, const std::string& path, std::int64_t bytes, int* status, bool* finished, std::string* why) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  *finished = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, status, WNOHANG) == pid) {
      *finished = true;
      *why = "the process ended before it had read the header";
      return false;
    }
    const std::int64_t n = bytes_read_by(pid);
    if (n < 0) {
      *why = "cannot read /proc/PID/io";
      break;
    }
    if (n >= bytes || maps_file(pid, path)) {
      ::kill(pid, SIGSTOP);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(pid, SIGKILL);
  if (why->empty()) *why = "timed out";
  return false;
}

// What a run under the watchdog did.
struct Run {
  bool timed_out = false;
  bool exited = false;
  int code = -1, signal = 0;
  long max_rss_kb = 0;
  std::string output;
};

// Runs `nf4 ARGS`, killing it after `seconds` (a hang is a failure, never a stuck suite).
inline Run run_bin(const std::vector<std::string>& args, const ScratchDir& scratch, int seconds = 30, const SpawnOptions& options = {}) {
  const std::string log = scratch / "bin.log";
  const pid_t pid = spawn_nf4(args, log, options);
  REQUIRE(pid > 0);
  Run r;
  int st = 0;
  rusage ru{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (::wait4(pid, &st, WNOHANG, &ru) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      ::wait4(pid, &st, 0, &ru);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  r.exited = WIFEXITED(st);
  r.code = r.exited ? WEXITSTATUS(st) : -1;
  r.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  r.max_rss_kb = ru.ru_maxrss;
  r.output = read_text(log);
  return r;
}

// `nf4 CMD IN` for inspect and verify, `nf4 convert IN OUT`: the arguments of a case run through
// every command.
inline std::vector<std::string> command_args(const std::string& cmd, const std::string& in, const std::string& out) {
  std::vector<std::string> args = {cmd, in};
  if (cmd == "convert") args.push_back(out);
  return args;
}

// A clean failure: exit 1 in time (no hang, no signal), a message naming `names`.
inline void check_clean_failure(const Run& r, const std::string& names) {
  CHECK_MESSAGE(!r.timed_out, "hung: " << r.output);
  CHECK_MESSAGE(r.exited, "killed by signal " << r.signal);
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.output, names), r.output);
}

// A clean failure naming `names` whose message says `why`, and nothing created in `outs`.
inline void check_refused(const Run& r, const std::string& names, const std::string& why, const std::string& outs) {
  check_clean_failure(r, names);
  CHECK_MESSAGE(contains(r.output, why), r.output);
  CHECK(entries_of(outs).empty());
}

// ---- inputs ----------------------------------------------------------------------------------

inline std::string golden_path() { return data_path("golden.safetensors"); }

// A single-file checkpoint big enough that converting it takes a while: 4 quantized weights of
// 4 Mi elements (flat and nested) and (`dense`) a dense tensor, 10 MiB; 34 MiB of bf16 output.
inline void write_big_checkpoint(const std::string& path, bool dense_tensor = true) {
  std::vector<cpu::QuantizedWeight> ws;
  for (int i = 0; i < 4; ++i) ws.push_back(synthetic_weight(std::int64_t{1} << 22, NF4_QUANT_NF4, 64, i % 2 == 1, 100 + i));
  std::vector<io::TensorData> ts;
  std::deque<std::string> keep;
  for (int i = 0; i < 4; ++i)
    add_param(ts, keep, "model.layers." + std::to_string(i) + ".mlp.weight", ws[i], quant_state_json(ws[i], {2048, 2048}).dump());
  std::vector<std::uint16_t> dense(std::size_t{1} << 20, 0x3f80);
  if (dense_tensor) ts.push_back({{"model.embed_tokens.weight", io::DType::BF16, {1024, 1024}}, dense.data()});
  io::write_safetensors(path, ts, {{"format", "pt"}});
}

}  // namespace nf4::test
