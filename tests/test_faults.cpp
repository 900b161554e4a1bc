// SPDX-License-Identifier: MIT
// Faults (docs/RELIABILITY.md): what the library and `nf4 convert` do when the world goes wrong.
// Each case checks a clear error (status / exit code and a message naming the cause), that
// nothing partial is left behind, and that nothing crashes. The cases that run the nf4 binary run
// $NF4_TEST_CLI instead of this build's when that is set.
//
// Runs here:   inputs the fuzzers once broke (regressions), a read-only output location and a
//              full disk (a small tmpfs in a private mount namespace, and RLIMIT_FSIZE),
//              checkpoints truncated at every kind of place, `nf4 convert` interrupted by
//              SIGINT / SIGTERM (single file and sharded).
// GPU machine: NF4_TEST_DEVICE_OOM=1 - a tensor larger than the CUDA device (plain cudaMalloc);
//              NF4_TEST_LARGE=1 - more than 2^31 elements on every available backend, checked
//              against the oracle at the start, around 2^30 / 2^31 and at the last elements.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#if defined(NF4_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "core/io/safetensors.h"
#include "core/io/checkpoint.h"
#include "core/io/sharded.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/faults.h"
#include "tests/support/io.h"
#include "tests/support/process.h"

using namespace nf4;
using nf4::test::check_clean_failure;
using nf4::test::contains;
using nf4::test::entries_of;
using nf4::test::golden_path;
using nf4::test::kHaveCli;
using nf4::test::Limits;
using nf4::test::read_text;
using nf4::test::Result;
using nf4::test::Run;
using nf4::test::run_bin;
using nf4::test::run_nf4;
using nf4::test::ScratchDir;
using nf4::test::spawn_nf4;
using nf4::test::stop_when_output_appears;
using nf4::test::write_big_checkpoint;
using nf4::test::write_text;

namespace {

// Anonymous memory that is only backed where touched (MAP_NORESERVE): huge host buffers for
// tests that must describe more memory than they use.
class LazyBuffer {
 public:
  explicit LazyBuffer(std::size_t bytes) : bytes_(bytes) {
    p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p_ == MAP_FAILED) p_ = nullptr;
  }
  ~LazyBuffer() {
    if (p_) ::munmap(p_, bytes_);
  }
  LazyBuffer(const LazyBuffer&) = delete;
  LazyBuffer& operator=(const LazyBuffer&) = delete;
  std::uint8_t* get() const { return static_cast<std::uint8_t*>(p_); }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

}  // namespace

// ---- regressions from fuzzing (tests/fuzz/regressions/*: also replayed as files by ctest) ------

TEST_CASE("faults: enum fields outside their range are rejected (fuzz_capi: enum-out-of-range)") {
  const auto w = test::random_weight(100, NF4_QUANT_NF4, 64, true, 1);
  std::vector<std::uint16_t> out(100, 0x1234);
  for (std::int32_t bad : {3, 7, -1, 16318463, INT32_MIN}) {
    CAPTURE(bad);
    nf4_tensor t = w.describe(NF4_DTYPE_F16, out.data(), 200);
    if (bad != 3) {  // 0 and 1 are the quant types; 3 is merely out of range for out_dtype
      std::memcpy(&t.quant_type, &bad, sizeof bad);  // what a C caller can store there
      CHECK(nf4_validate(&t) == NF4_ERR_QUANT_TYPE);
      CHECK(contains(nf4_last_error(nullptr), "quant_type"));
      CHECK(contains(nf4_last_error(nullptr), std::to_string(bad)));
    }
    t = w.describe(NF4_DTYPE_F16, out.data(), 200);
    std::memcpy(&t.out_dtype, &bad, sizeof bad);
    CHECK(nf4_validate(&t) == NF4_ERR_DTYPE);
    CHECK(contains(nf4_last_error(nullptr), "out_dtype"));
    CHECK(contains(nf4_last_error(nullptr), std::to_string(bad)));
  }
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint16_t v) { return v == 0x1234; }));
}

TEST_CASE("faults: an output overlapping quant_map, nested_code or the offset is rejected (fuzz_capi: out-overlaps-nested-code)") {
  const auto w = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 2);
  // One arena holding the tables, with the output placed over each in turn.
  std::vector<float> arena(16 + 256 + 1 + 4000, 0.0f);
  std::memcpy(arena.data(), w.quant_map.data(), 16 * 4);
  std::memcpy(arena.data() + 16, w.nested_code.data(), 256 * 4);
  arena[272] = w.nested_offset;
  Context ctx(NF4_BACKEND_CPU);
  for (std::size_t at : {std::size_t{0}, std::size_t{16}, std::size_t{200}, std::size_t{272}}) {
    CAPTURE(at);
    nf4_tensor t = w.describe(NF4_DTYPE_F32, arena.data() + at, 4000);
    t.quant_map = arena.data();
    t.nested_code = arena.data() + 16;
    t.nested_offset_ptr = arena.data() + 272;
    const std::vector<float> before = arena;
    CHECK(nf4_validate(&t) == NF4_ERR_ALIASING);
    CHECK(contains(nf4_last_error(nullptr), "overlaps"));
    CHECK(nf4_dequantize_host(ctx.get(), &t) == NF4_ERR_ALIASING);
    CHECK(std::memcmp(before.data(), arena.data(), arena.size() * 4) == 0);
  }
  // Placed after all of them, the same description is fine.
  nf4_tensor t = w.describe(NF4_DTYPE_F32, arena.data() + 273, 4000);
  t.quant_map = arena.data();
  t.nested_code = arena.data() + 16;
  t.nested_offset_ptr = arena.data() + 272;
  CHECK(nf4_dequantize_host(ctx.get(), &t) == NF4_OK);
}

// ---- output faults -------------------------------------------------------------------------

TEST_CASE("faults: convert to a read-only location fails clearly and creates nothing") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string ro = scratch / "ro";
  std::filesystem::create_directory(ro);
  Limits l;
  l.mount = {ro, /*read_only=*/true, 1 << 20};
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    std::string in = golden_path();
    if (sharded) {
      std::filesystem::create_directory(scratch / "sharded");
      test::write_sharded_golden(scratch / "sharded", 6, /*with_expected=*/false);
      in = scratch / "sharded";
    }
    const std::string out = ro + (sharded ? "/outdir" : "/out.safetensors");
    Result r = run_nf4({"convert", in, out, "--backend", "cpu"}, l, ro, scratch);
    if (!r.ran && ::geteuid() != 0) {
      // No namespaces here: an unwritable directory stands in for the read-only file system.
      MESSAGE("no private mount namespace (" << r.output << "): using a mode-0555 directory instead");
      l.mount = {};
      ::chmod(ro.c_str(), 0555);
      r = run_nf4({"convert", in, out, "--backend", "cpu"}, l, ro, scratch);
    }
    if (!r.ran) {
      MESSAGE("skipped: cannot make a read-only location here: " << r.output);
      return;
    }
    CHECK(r.exited);
    CHECK(r.code == 1);
    CHECK_MESSAGE(contains(r.output, out), r.output);
    CHECK_MESSAGE((contains(r.output, "Read-only file system") || contains(r.output, "Permission denied")), r.output);
    // The first thing convert creates beside OUT is its lock file.
    CHECK_MESSAGE(contains(r.output, "cannot create its lock file"), r.output);
    CHECK(r.left.empty());
  }
}

TEST_CASE("faults: convert onto a full disk fails clearly and leaves no partial output") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string small = scratch / "small";
  std::filesystem::create_directory(small);
  std::filesystem::create_directory(scratch / "sharded");
  test::write_sharded_golden(scratch / "sharded", 116, /*with_expected=*/false);

  SUBCASE("a 1 MiB file system (ENOSPC)") {
    for (const bool sharded : {false, true}) {
      CAPTURE(sharded);
      Limits l;
      l.mount = {small, false, 1 << 20};
      const std::string out = small + (sharded ? "/outdir" : "/out.safetensors");
      const Result r = run_nf4({"convert", sharded ? scratch / "sharded" : golden_path(), out, "--backend", "cpu"}, l, small, scratch);
      if (!r.ran) {
        MESSAGE("skipped: no private mount namespace for a small tmpfs here (" << r.output << "); RLIMIT_FSIZE below still runs");
        break;
      }
      CHECK(r.exited);
      CHECK(r.code == 1);
      CHECK_MESSAGE(contains(r.output, "No space left on device"), r.output);
      CHECK_MESSAGE(contains(r.output, out), r.output);
      CHECK_MESSAGE(r.left.empty(), "left behind: " << r.left.size() << " entries, first " << (r.left.empty() ? "" : r.left[0]));
    }
  }
  SUBCASE("a 1 MiB file-size limit (RLIMIT_FSIZE: EFBIG)") {
    Limits l;
    l.max_file_bytes = 1 << 20;
    const std::string out = small + "/out.safetensors";
    const Result r = run_nf4({"convert", golden_path(), out, "--backend", "cpu"}, l, small, scratch);
    REQUIRE(r.ran);
    CHECK(r.exited);
    CHECK(r.code == 1);
    CHECK_MESSAGE(contains(r.output, "File too large"), r.output);
    CHECK_MESSAGE(contains(r.output, out), r.output);
    CHECK(r.left.empty());
  }
}

// ---- input faults ----------------------------------------------------------------------------

TEST_CASE("faults: checkpoints truncated anywhere fail cleanly in convert, inspect and verify") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const auto bytes = test::read_bytes(golden_path());
  REQUIRE(bytes.size() > 1000);
  // Cut points: inside the length field, inside the header, at the end of the header, in the
  // middle of a quantized weight's packed data, of an absmax, of the last tensor.
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[static_cast<std::size_t>(i)];
  const auto& c = test::golden_cases().at(3);
  const std::size_t data0 = 8 + static_cast<std::size_t>(header_len);
  const std::vector<std::size_t> cuts = {4,
                                         8 + static_cast<std::size_t>(header_len) / 2,
                                         data0,
                                         data0 + static_cast<std::size_t>(c.param.weight->begin + c.param.weight->bytes() / 2),
                                         data0 + static_cast<std::size_t>(c.param.absmax->begin + 1),
                                         bytes.size() - 1};
  const std::string cut = scratch / "cut.safetensors", outdir = scratch / "out";
  std::filesystem::create_directory(outdir);
  for (std::size_t at : cuts) {
    CAPTURE(at);
    test::write_bytes(cut, std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(at)));
    for (const char* cmd : {"convert", "inspect", "verify"}) {
      CAPTURE(cmd);
      std::vector<std::string> args = {cmd, cut};
      if (std::string(cmd) == "convert") args.push_back(outdir + "/out.safetensors");
      const Result r = run_nf4(args, {}, outdir, scratch);
      REQUIRE(r.ran);
      CHECK_MESSAGE(r.exited, "killed by signal " << r.signal);
      CHECK(r.code == 1);
      CHECK_MESSAGE(contains(r.output, "nf4: error: "), r.output);
      CHECK_MESSAGE(contains(r.output, cut), r.output);
      CHECK(r.left.empty());
    }
  }
}

// ---- interrupted convert -------------------------------------------------------------------------

TEST_CASE("faults: nf4 convert interrupted by SIGINT / SIGTERM / SIGHUP / SIGQUIT / SIGXFSZ exits with a clear error and leaves nothing") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string single = scratch / "in.safetensors";
  write_big_checkpoint(single);
  std::filesystem::create_directory(scratch / "sharded");
  test::write_sharded_golden(scratch / "sharded", 116, /*with_expected=*/false);

  struct Case {
    const char* name;
    std::string in;
    bool sharded;
    int sig;
  };
  const Case cases[] = {{"SIGINT, single file", single, false, SIGINT},
                        {"SIGTERM, single file", single, false, SIGTERM},
                        {"SIGINT, sharded", scratch / "sharded", true, SIGINT},
                        {"SIGTERM, sharded", scratch / "sharded", true, SIGTERM},
                        {"SIGHUP (terminal closed), single file", single, false, SIGHUP},
                        {"SIGQUIT, sharded", scratch / "sharded", true, SIGQUIT},
                        {"SIGXFSZ, single file", single, false, SIGXFSZ}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string outdir = scratch / "out";
    std::filesystem::create_directory(outdir);
    const std::string out = outdir + (c.sharded ? "/model" : "/out.safetensors");
    const std::string log = scratch / "convert.log";
    // 1 MiB batches: an interrupt check between each.
    const pid_t pid = spawn_nf4({"convert", c.in, out, "--backend", "cpu", "--dtype", "bf16", "--batch-mb", "1"}, log);
    REQUIRE(pid > 0);
    int st = 0;
    bool finished = false;
    const bool stopped = stop_when_output_appears(pid, outdir, &st, &finished);
    if (stopped) {
      ::kill(pid, c.sig);  // pending until it runs on
      ::kill(pid, SIGCONT);
      // A second one (an impatient Ctrl-C) must not skip the clean-up.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ::kill(pid, c.sig);
    }
    if (!finished) ::waitpid(pid, &st, 0);
    const std::string output = read_text(log);
    CHECK_MESSAGE(stopped, "convert finished (or hung) before its temporary output appeared: " << output);
    CHECK_MESSAGE(WIFEXITED(st), "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
    CHECK(WEXITSTATUS(st) == 128 + c.sig);
    CHECK_MESSAGE(contains(output, std::string("interrupted by ") + test::signal_name(c.sig)), output);
    CHECK_MESSAGE(contains(output, out), output);
    CHECK_MESSAGE(std::filesystem::is_empty(outdir), "left behind in " << outdir);
    std::filesystem::remove_all(outdir);
  }
}

// The input is read with pread, never through a mapping: a checkpoint truncated by another
// process while it is being converted is a clean I/O error naming it (no SIGBUS), and the
// temporary output is removed.
TEST_CASE("faults: the input truncated while nf4 convert reads it is a clean I/O error, not SIGBUS") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string in = scratch / "in.safetensors", outdir = scratch / "out", log = scratch / "convert.log";
  write_big_checkpoint(in, /*dense_tensor=*/false);
  std::filesystem::create_directory(outdir);
  const pid_t pid = spawn_nf4({"convert", in, outdir + "/out.safetensors", "--backend", "cpu", "--batch-mb", "1"}, log);
  REQUIRE(pid > 0);
  int st = 0;
  bool finished = false;
  const bool stopped = stop_when_output_appears(pid, outdir, &st, &finished);
  if (stopped) {
    REQUIRE(::truncate(in.c_str(), 1 << 20) == 0);
    ::kill(pid, SIGCONT);
  }
  if (!finished) ::waitpid(pid, &st, 0);
  const std::string output = read_text(log);
  REQUIRE_MESSAGE(stopped, output);
  CHECK_MESSAGE(WIFEXITED(st), "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
  CHECK(WEXITSTATUS(st) == 1);
  CHECK_MESSAGE(contains(output, in), output);
  CHECK_MESSAGE(contains(output, "truncated while being read"), output);
  CHECK_MESSAGE(std::filesystem::is_empty(outdir), "left behind in " << outdir);
}

// ---- hostile checkpoints (issue-style cases, each through the real binary) ------------------------

namespace {

// Bytes the process has read so far through read(2) / pread(2) (/proc/PID/io rchar); -1 if
// unreadable. Data read through a mapping does not count.
std::int64_t bytes_read_by(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/io");  // size 0 in stat: read it as a stream
  for (std::string line; std::getline(f, line);)
    if (line.rfind("rchar: ", 0) == 0) return std::stoll(line.substr(7));
  return -1;
}

// Whether the process has `path` memory-mapped (/proc/PID/maps).
bool maps_file(pid_t pid, const std::string& path) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(f, line);)
    if (line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0) return true;
  return false;
}

// Waits until the process has read at least `bytes` (its whole header, for a caller that knows
// the header's size), or has mapped `path` (how builds before the pread reader read the header:
// so that NF4_TEST_CLI can show what they do), then stops it. With a header that takes a good
// fraction of a second to parse, the process is frozen while parsing, before it reads any tensor
// data: the caller truncates the file then, and every later read of the data meets the
// truncation. False if the process ended first (or /proc/PID/io is unreadable: `why` says which).
bool stop_after_reading(pid_t pid, const std::string& path, std::int64_t bytes, int* status, bool* finished, std::string* why) {
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

// Where the parts of a checkpoint written by write_slow_header_checkpoint lie.
struct Layout {
  std::int64_t header_end = 0;        // 8 + the header length: where the data section starts
  std::int64_t quant_states_end = 0;  // the end of the last quant-state tensor
  std::int64_t size = 0;
};

// write_big_checkpoint's 4 weights (10 MiB) under a header of 200k metadata keys (a few MB, a
// good fraction of a second to parse), the data ordered so that the F32 statistics and the quant
// states come first and the packed weights last.
Layout write_slow_header_checkpoint(const std::string& path) {
  std::vector<cpu::QuantizedWeight> ws;
  for (int i = 0; i < 4; ++i) ws.push_back(test::synthetic_weight(std::int64_t{1} << 22, NF4_QUANT_NF4, 64, i % 2 == 1, 200 + i));
  std::vector<io::TensorData> ts;
  std::deque<std::string> keep;
  for (int i = 0; i < 4; ++i)
    test::add_param(ts, keep, "model.layers." + std::to_string(i) + ".mlp.weight", ws[i], test::quant_state_json(ws[i], {2048, 2048}).dump());
  // The writer orders by element size, stably: F32 first, then the U8 tensors in this order.
  std::stable_partition(ts.begin(), ts.end(), [](const io::TensorData& t) { return contains(t.spec.name, ".quant_state."); });
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  for (int i = 0; i < 200000; ++i) metadata["key." + std::to_string(i)] = "value of key " + std::to_string(i);
  io::write_safetensors(path, ts, metadata);
  const io::SafetensorsFile f(path);  // the header only: nothing is mapped
  Layout l;
  l.size = static_cast<std::int64_t>(std::filesystem::file_size(path));
  std::int64_t data_bytes = 0, qs_end = 0;
  for (const auto& t : f.tensors()) {
    data_bytes = std::max(data_bytes, t.end);
    if (contains(t.name, ".quant_state.")) qs_end = std::max(qs_end, t.end);
  }
  l.header_end = l.size - data_bytes;
  l.quant_states_end = l.header_end + qs_end;
  return l;
}

}  // namespace

// inspect and verify read with pread too (tensor data piece by piece, never through a mapping):
// a checkpoint truncated while they read it is a clean I/O error naming it, not SIGBUS, and
// nothing is written. inspect reads the quant states after the header, so the cut is right after
// the header; verify reads the quant states, then the packed weights, so the cut keeps every
// quant state and takes the weights.
TEST_CASE("faults: the input truncated while nf4 inspect or verify reads it is a clean I/O error, not SIGBUS") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string dir = scratch / "in", in = dir + "/in.safetensors", log = scratch / "run.log";
  std::filesystem::create_directory(dir);
  const std::string original = scratch / "original.safetensors";
  const Layout l = write_slow_header_checkpoint(original);
  REQUIRE(l.quant_states_end > l.header_end);
  REQUIRE(l.quant_states_end + (1 << 20) < l.size);
  struct Case {
    std::vector<std::string> args;
    std::int64_t cut;
  };
  const Case cases[] = {{{"inspect", in}, l.header_end},
                        {{"verify", in, "--backend", "cpu", "--dtype", "bf16"}, l.quant_states_end},
                        {{"inspect", "--json", in}, l.header_end},
                        {{"verify", "--json", in, "--backend", "cpu"}, l.quant_states_end}};
  for (const Case& c : cases) {
    CAPTURE(c.args[0]);
    CAPTURE(c.args[1]);
    std::filesystem::copy_file(original, in, std::filesystem::copy_options::overwrite_existing);
    const pid_t pid = spawn_nf4(c.args, log);
    REQUIRE(pid > 0);
    int st = 0;
    bool finished = false;
    std::string why;
    const bool stopped = stop_after_reading(pid, in, l.header_end, &st, &finished, &why);
    if (stopped) {
      REQUIRE(::truncate(in.c_str(), c.cut) == 0);
      ::kill(pid, SIGCONT);
    }
    if (!finished) ::waitpid(pid, &st, 0);
    const std::string output = read_text(log);
    CHECK_MESSAGE(stopped, why << ": " << output);
    if (!stopped) continue;
    CHECK_MESSAGE(WIFEXITED(st), "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
    CHECK(WEXITSTATUS(st) == 1);
    CHECK_MESSAGE(contains(output, "nf4: error: "), output);
    CHECK_MESSAGE(contains(output, in), output);
    CHECK_MESSAGE(contains(output, "truncated while being read"), output);
    CHECK(entries_of(dir) == std::vector<std::string>{"in.safetensors"});
  }
}

TEST_CASE("faults: a FIFO as config.json, shard or index fails at once in every command (no hang)") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs";
  std::filesystem::create_directory(outs);
  for (const std::string which : {"config.json", "model-00002-of-00003.safetensors", io::kIndexFileName}) {
    CAPTURE(which);
    std::filesystem::remove_all(model);
    std::filesystem::create_directory(model);
    test::write_sharded_golden(model, 6, /*with_expected=*/false);
    std::filesystem::remove(model + "/" + which);
    REQUIRE(::mkfifo((model + "/" + which).c_str(), 0600) == 0);
    for (const char* cmd : {"convert", "inspect", "verify"}) {
      CAPTURE(cmd);
      std::vector<std::string> args = {cmd, model};
      if (std::string(cmd) == "convert") args.push_back(outs + "/dense");
      const Run r = run_bin(args, scratch, 20);
      if (std::string(cmd) != "convert" && which == "config.json") {  // inspect and verify do not read it
        CHECK_MESSAGE(r.code == 0, r.output);
        continue;
      }
      check_clean_failure(r, which);
      CHECK_MESSAGE(contains(r.output, "FIFO"), r.output);
      CHECK(entries_of(outs).empty());
    }
  }
}

TEST_CASE("faults: files symlinked out of the model directory are refused unless --follow-symlinks; contents never echoed") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs", secret = scratch / "secret.txt";
  std::filesystem::create_directory(model);
  std::filesystem::create_directory(outs);
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  write_text(secret, "{\"token\": \"hunter2-SECRET\"}");
  for (const std::string which : {"config.json", "tokenizer.json", "model-00001-of-00003.safetensors"}) {
    CAPTURE(which);
    const std::string link = model + "/" + which, moved = scratch / ("moved-" + which);
    if (which.find(".safetensors") != std::string::npos) {
      std::filesystem::rename(link, moved);
      std::filesystem::create_symlink(moved, link);
    } else {
      std::filesystem::create_symlink(secret, link);
    }
    Run r = run_bin({"convert", model, outs + "/dense", "--dtype", "bf16"}, scratch);
    check_clean_failure(r, which);
    CHECK_MESSAGE(contains(r.output, "--follow-symlinks"), r.output);
    CHECK_MESSAGE(!contains(r.output, "hunter2"), r.output);
    CHECK(entries_of(outs).empty());
    if (which.find(".safetensors") != std::string::npos) {
      r = run_bin({"inspect", model}, scratch);
      check_clean_failure(r, which);
    }
    r = run_bin({"convert", model, outs + "/dense", "--dtype", "bf16", "--follow-symlinks"}, scratch);
    CHECK_MESSAGE(r.code == 0, r.output);
    CHECK(std::filesystem::exists(outs + "/dense/" + which));
    std::filesystem::remove_all(outs + "/dense");
    std::filesystem::remove(link);
    if (which.find(".safetensors") != std::string::npos) std::filesystem::rename(moved, link);
  }
}

TEST_CASE("faults: JSON nested 10^6 levels (index metadata, config.json) fails cleanly in every command") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs";
  std::filesystem::create_directory(model);
  std::filesystem::create_directory(outs);
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  const std::string index_text = read_text(model + "/" + io::kIndexFileName);
  // The index's metadata nested deep.
  write_text(model + "/" + io::kIndexFileName, R"({"metadata": {"x": )" + deep + R"(}, "weight_map": )" +
                                                   nlohmann::json::parse(index_text)["weight_map"].dump() + "}");
  for (const char* cmd : {"convert", "inspect", "verify"}) {
    CAPTURE(cmd);
    std::vector<std::string> args = {cmd, model};
    if (std::string(cmd) == "convert") args.push_back(outs + "/dense");
    const Run r = run_bin(args, scratch);
    check_clean_failure(r, io::kIndexFileName);
    CHECK_MESSAGE(contains(r.output, "deeper than"), r.output);
    CHECK(entries_of(outs).empty());
  }
  // config.json nested deep.
  write_text(model + "/" + io::kIndexFileName, index_text);
  write_text(model + "/config.json", R"({"x": )" + deep + "}");
  const Run r = run_bin({"convert", model, outs + "/dense"}, scratch);
  check_clean_failure(r, "config.json");
  CHECK_MESSAGE(contains(r.output, "deeper than"), r.output);
  CHECK(entries_of(outs).empty());
}

TEST_CASE("faults: two converts to one OUT: the second fails at once, the first completes; --force too") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs", log = scratch / "first.log";
  std::filesystem::create_directory(model);
  std::filesystem::create_directory(outs);
  write_big_checkpoint(model + "/model.safetensors");
  const std::string out = outs + "/dense";
  for (const bool force : {false, true}) {
    CAPTURE(force);
    std::vector<std::string> first = {"convert", model, out, "--backend", "cpu", "--dtype", "bf16", "--batch-mb", "1"};
    if (force) first.push_back("--force");
    const pid_t pid = spawn_nf4(first, log);
    int st = 0;
    bool finished = false;
    const bool stopped = stop_when_output_appears(pid, outs, &st, &finished, ".nf4-tmp-");
    REQUIRE_MESSAGE(stopped, read_text(log));
    std::vector<std::string> second = {"convert", model, out, "--backend", "cpu", "--dtype", "fp16"};
    if (force) second.push_back("--force");
    const auto t0 = std::chrono::steady_clock::now();
    const Run r = run_bin(second, scratch);
    check_clean_failure(r, "another nf4 process is writing it");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    ::kill(pid, SIGCONT);
    ::waitpid(pid, &st, 0);
    CHECK_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 0), read_text(log));
    CHECK(entries_of(outs) == std::vector<std::string>{"dense"});
    const io::SafetensorsFile f(out + "/model.safetensors");
    for (const auto& t : f.tensors()) CHECK(t.dtype == io::DType::BF16);
  }
}

TEST_CASE("faults: leftovers of a convert killed by SIGKILL are removed by the next run to that OUT") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs", log = scratch / "killed.log";
  std::filesystem::create_directory(model);
  std::filesystem::create_directory(outs);
  test::write_sharded_golden(model, 116, /*with_expected=*/false);
  write_text(model + "/tokenizer.json", "{}");
  const std::string out = outs + "/dense";
  const pid_t pid = spawn_nf4({"convert", model, out, "--backend", "cpu", "--batch-mb", "1"}, log);
  int st = 0;
  bool finished = false;
  REQUIRE(stop_when_output_appears(pid, outs, &st, &finished, ".nf4-tmp-"));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
  CHECK(entries_of(outs).size() == 2);  // the lock file and the temporary directory
  const Run r = run_bin({"convert", model, out, "--backend", "cpu"}, scratch);
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(entries_of(outs) == std::vector<std::string>{"dense"});
}

TEST_CASE("faults: --batch-mb bounds memory with nested blocksize 2^20 (one nested block of 32 Mi elements)") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  // 32 Mi + 4 Ki elements, blocksize 32, nested blocksize 2^20: 64 MiB of bf16 output in two
  // nested blocks, the first 64 MiB of output by itself.
  const std::int64_t n = (std::int64_t{1} << 25) + 4096;
  {
    cpu::QuantizedWeight w = test::synthetic_weight(n, NF4_QUANT_NF4, 64, /*nested=*/true, 5);
    w.blocksize = 32;
    w.nested_blocksize = 1 << 20;
    const std::int64_t blocks = n / 32;
    w.absmax_u8.resize(static_cast<std::size_t>(blocks));
    for (std::size_t i = 0; i < w.absmax_u8.size(); ++i) w.absmax_u8[i] = static_cast<std::uint8_t>(i * 2654435761u >> 24);
    w.nested_absmax.assign(static_cast<std::size_t>((blocks + (1 << 20) - 1) >> 20), 0.02f);
    std::vector<io::TensorData> ts;
    std::deque<std::string> keep;
    test::add_param(ts, keep, "w.weight", w, test::quant_state_json(w, {n}).dump());
    io::write_safetensors(scratch / "in.safetensors", ts, {});
  }
  // A child's peak includes what it shared with this process before exec, and a backend's set-up
  // (a Vulkan driver on the CPU is large): both measured by converting a small checkpoint, and
  // subtracted.
  const Run base = run_bin({"convert", golden_path(), scratch / "small.safetensors", "--backend", "cpu", "--batch-mb", "4"}, scratch);
  REQUIRE(base.code == 0);
  const Run r = run_bin({"convert", scratch / "in.safetensors", scratch / "out.safetensors", "--backend", "cpu", "--batch-mb", "4"}, scratch, 120);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const long extra_mib = (r.max_rss_kb - base.max_rss_kb) / 1024;
  MESSAGE("peak resident memory with --batch-mb 4: " << r.max_rss_kb / 1024 << " MiB (" << extra_mib << " MiB above a small conversion)");
  CHECK(extra_mib < 32);  // one whole nested block is 64 MiB of output alone
  // The bytes are the oracle's, across the pieces cut inside the nested block.
  const io::SafetensorsFile in(scratch / "in.safetensors"), out(scratch / "out.safetensors");
  const auto params = io::find_quantized_params(in);
  REQUIRE(params.size() == 1);
  const io::TensorInfo* dense = out.find("w.weight");
  REQUIRE(dense != nullptr);
  const std::int64_t starts[] = {0, (std::int64_t{1} << 21) - 7, std::int64_t{1} << 24, n - 5000};
  for (std::int64_t first : starts) {
    std::vector<std::uint16_t> expected(5000);
    const nf4_tensor t = io::describe(params[0], NF4_DTYPE_BF16, expected.data() - first, n * 2);
    cpu::oracle_dequantize_range(t, first, 5000);
    CHECK_MESSAGE(std::memcmp(expected.data(), out.data(*dense) + first * 2, 10000) == 0, "at " << first);
  }
}

TEST_CASE("model directories: one model.safetensors or shards in, a loadable model directory out, trailing slashes or not") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::map<std::string, std::string> extra = {
      {"tokenizer.json", "{\"version\": \"1.0\"}"},      {"tokenizer_config.json", "{\"a\": 1}"},
      {"special_tokens_map.json", "{}"},                 {"generation_config.json", "{\"do_sample\": true}"},
      {"chat_template.jinja", "{{ messages }}"},         {"README.md", "# model card\n"},
      {"LICENSE", "MIT\n"},                              {"tokenizer.model", std::string("\x00\x01\x02", 3)}};
  const std::string config = "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"quantization_config\": {\"load_in_4bit\": true},\n"
                             "  \"torch_dtype\": \"float16\"\n}\n";
  const auto make_model = [&](const std::string& dir, bool sharded) {
    std::filesystem::create_directory(dir);
    if (sharded) test::write_sharded_golden(dir, 12, /*with_expected=*/false);
    else test::write_bytes(dir + "/model.safetensors", test::read_bytes(golden_path()));
    for (const auto& [name, text] : extra) write_text(dir + "/" + name, text);
    write_text(dir + "/config.json", config);
    std::filesystem::create_directory(dir + "/original");  // e.g. another format's weights: not carried
    write_text(dir + "/original/consolidated.pth", "x");
    write_text(dir + "/pytorch_model.bin", "4-bit weights in another format");
  };
  make_model(scratch / "single", false);
  make_model(scratch / "sharded", true);
  for (const bool sharded : {false, true}) {
    for (const bool slashes : {false, true}) {
      CAPTURE(sharded);
      CAPTURE(slashes);
      const std::string in = scratch / (sharded ? "sharded" : "single"), out = scratch / "dense";
      const Run r = run_bin({"convert", in + (slashes ? "/" : ""), out + (slashes ? "/" : ""), "--backend", "cpu", "--dtype", "bf16"}, scratch);
      REQUIRE_MESSAGE(r.code == 0, r.output);
      std::vector<std::string> expected;
      for (const auto& [name, text] : extra) {
        expected.push_back(name);
        CHECK_MESSAGE(read_text(out + "/" + name) == text, name);
      }
      expected.push_back("config.json");
      if (sharded) {
        for (int i = 1; i <= 3; ++i) expected.push_back("model-0000" + std::to_string(i) + "-of-00003.safetensors");
        expected.push_back(io::kIndexFileName);
      } else {
        expected.push_back("model.safetensors");
      }
      std::sort(expected.begin(), expected.end());
      CHECK(entries_of(out) == expected);
      CHECK(read_text(out + "/config.json") == "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"torch_dtype\": \"bfloat16\"\n}\n");
      const io::Checkpoint ck(out);
      CHECK(ck.sharded() == sharded);
      CHECK(io::find_quantized_params(ck).empty());
      const Run v = run_bin({"verify", out, "--reference", in}, scratch, 120);
      CHECK_MESSAGE(v.code == 0, v.output);
      std::filesystem::remove_all(out);
      for (const auto& e : entries_of(scratch.path())) CHECK_MESSAGE(!contains(e, ".nf4-"), "left behind: " << e);
    }
  }
  // A .safetensors file named alone still gives a file.
  const Run r = run_bin({"convert", scratch / "single/model.safetensors", scratch / "alone.safetensors", "--backend", "cpu"}, scratch);
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(std::filesystem::is_regular_file(scratch / "alone.safetensors"));
}

TEST_CASE("faults: --force replaces a model directory as a whole, and refuses to delete one that is not a model") {
  if (!kHaveCli) {
    MESSAGE("skipped: the nf4 tool is not built (NF4_BUILD_TOOLS=OFF)");
    return;
  }
  ScratchDir scratch;
  const std::string model = scratch / "model", out = scratch / "dense";
  std::filesystem::create_directory(model);
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  Run r = run_bin({"convert", model, out, "--dtype", "fp16"}, scratch);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  write_text(out + "/stale-from-an-old-run.safetensors", "x");
  r = run_bin({"convert", model, out, "--dtype", "bf16", "--force"}, scratch);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(!std::filesystem::exists(out + "/stale-from-an-old-run.safetensors"));
  // Not a model directory: holds a subdirectory, or nothing that looks like a model.
  const std::string home = scratch / "home";
  std::filesystem::create_directories(home + "/Documents");
  write_text(home + "/notes.txt", "keep me");
  r = run_bin({"convert", model, home, "--force"}, scratch);
  check_clean_failure(r, "refusing to delete it");
  std::filesystem::remove_all(home + "/Documents");
  r = run_bin({"convert", model, home, "--force"}, scratch);
  check_clean_failure(r, "refusing to delete it");
  CHECK(read_text(home + "/notes.txt") == "keep me");
}

// ---- GPU machine ------------------------------------------------------------------------------

TEST_CASE("faults: a tensor larger than the CUDA device fails with NF4_ERR_OUT_OF_MEMORY and frees everything (NF4_TEST_DEVICE_OOM=1)") {
  if (!test::env_on("NF4_TEST_DEVICE_OOM")) {
    MESSAGE("skipped: set NF4_TEST_DEVICE_OOM=1 (GPU machine)");
    return;
  }
#if defined(NF4_HAVE_CUDA)
  const RegisteredBackend* b = find_backend(NF4_BACKEND_CUDA);
  REQUIRE(b != nullptr);
  if (!b->available) {
    MESSAGE("skipped: cuda unavailable: " << b->device_or_reason);
    return;
  }
  Context ctx(NF4_BACKEND_CUDA);
  std::size_t free0 = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free0, &total) == cudaSuccess);
  MESSAGE("device " << ctx.device_name() << ": " << total / (1 << 20) << " MiB, " << free0 / (1 << 20) << " MiB free");
  // Just over the device's memory in fp32 output alone, then far over it. The host side is
  // described, not backed: lazily mapped memory that the failed call must never touch.
  const std::int64_t sizes[] = {static_cast<std::int64_t>(total / 4 + total / 64) / 4096 * 4096, std::int64_t{1} << 36};
  for (std::int64_t n : sizes) {
    CAPTURE(n);
    LazyBuffer packed(static_cast<std::size_t>(n / 2)), out(static_cast<std::size_t>(n) * 4);
    if (!packed.get() || !out.get()) {  // e.g. vm.overcommit_memory=2
      MESSAGE("size " << n << " skipped: cannot map " << n * 4 / (1 << 20) << " MiB of lazy host memory");
      continue;
    }
    std::vector<float> absmax(static_cast<std::size_t>(n / 4096), 1.0f);
    const auto qmap = cpu::saved_quant_map(NF4_QUANT_NF4);
    nf4_tensor t{};
    t.quant_type = NF4_QUANT_NF4;
    t.out_dtype = NF4_DTYPE_F32;
    t.numel = n;
    t.blocksize = 4096;
    t.packed = packed.get();
    t.packed_bytes = n / 2;
    t.absmax = absmax.data();
    t.absmax_count = static_cast<std::int64_t>(absmax.size());
    t.quant_map = qmap.data();
    t.quant_map_count = 16;
    t.out = out.get();
    t.out_bytes = n * 4;
    std::memset(out.get(), 0xAB, 64);
    std::memset(out.get() + n * 4 - 64, 0xAB, 64);
    const nf4_status s = nf4_dequantize_host(ctx.get(), &t);
    CHECK(s == NF4_ERR_OUT_OF_MEMORY);
    CHECK_MESSAGE(contains(nf4_last_error(ctx.get()), "out of device memory"), nf4_last_error(ctx.get()));
    for (int i = 0; i < 64; ++i) {
      CHECK(out.get()[i] == 0xAB);
      CHECK(out.get()[n * 4 - 64 + i] == 0xAB);
    }
    std::size_t free1 = 0;
    REQUIRE(cudaMemGetInfo(&free1, &total) == cudaSuccess);
    CHECK_MESSAGE(free1 + (std::size_t{64} << 20) >= free0, "device memory not freed: " << free0 << " -> " << free1);
  }
  // The context still works.
  const auto w = test::random_weight(100000, NF4_QUANT_NF4, 64, true, 9);
  std::vector<std::uint16_t> got(100000), expected(100000);
  ctx.dequantize_host(w.describe(NF4_DTYPE_BF16, got.data(), 200000));
  cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, expected.data(), 200000));
  CHECK(got == expected);
#else
  MESSAGE("skipped: the cuda backend is not compiled in");
#endif
}

TEST_CASE("faults: more than 2^31 elements on every available backend, checked at the start, 2^30, 2^31 and the end (NF4_TEST_LARGE=1)") {
  if (!test::env_on("NF4_TEST_LARGE")) {
    MESSAGE("skipped: set NF4_TEST_LARGE=1 (GPU machine; about 6 GB of host memory)");
    return;
  }
  // Past 2^31 by more than a window, odd: a half-used last packed byte.
  const std::int64_t n = (std::int64_t{1} << 31) + (1 << 17) + 4099;
  for (const bool nested : {true, false}) {
    const cpu::QuantizedWeight w = test::synthetic_weight(n, NF4_QUANT_NF4, 64, nested, nested ? 7 : 8);
    const nf4_dtype dtype = nested ? NF4_DTYPE_F16 : NF4_DTYPE_BF16;  // 4 GiB of output: byte offsets past 2^32
    std::vector<std::uint16_t> got(static_cast<std::size_t>(n));
    LazyBuffer expected(static_cast<std::size_t>(n) * 2);  // the oracle writes only the windows
    REQUIRE(expected.get() != nullptr);
    const nf4_tensor oracle_t = w.describe(dtype, expected.get(), n * 2);
    // Windows: the first elements, around 2^30 and 2^31, and the last blocks (oracle only there).
    const std::int64_t win = 1 << 16;
    const std::int64_t starts[] = {0, (std::int64_t{1} << 30) - win / 2, (std::int64_t{1} << 31) - win / 2, n - win};
    for (std::int64_t first : starts) {
      REQUIRE(first + win <= n);
      cpu::oracle_dequantize_range(oracle_t, first, win);
    }
    for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
      nf4_backend_info info{};
      REQUIRE(nf4_backend_get_info(i, &info) == NF4_OK);
      if (!info.available) {
        MESSAGE("backend '" << std::string(info.name) << "' skipped: " << std::string(info.device_name));
        continue;
      }
      CAPTURE(std::string(info.name));
      CAPTURE(nested);
      std::fill(got.begin(), got.end(), std::uint16_t{0x7777});
      Context ctx(info.kind);
      const auto t0 = std::chrono::steady_clock::now();
      ctx.dequantize_host(w.describe(dtype, got.data(), n * 2));
      MESSAGE(std::string(info.name) << ": " << n << " elements in "
                                     << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
      for (std::int64_t first : starts)
        CHECK_MESSAGE(std::memcmp(got.data() + first, expected.get() + first * 2, static_cast<std::size_t>(win) * 2) == 0,
                      "window at " << first);
      CHECK(got.back() != 0x7777);
    }
  }
}
