// SPDX-License-Identifier: MIT
// Faults (docs/RELIABILITY.md, sections 3 and 4): what the library and `nf4 convert` do when the
// world goes wrong. Each case checks a clear error (status / exit code and a message naming the
// cause), that nothing partial is left behind, and that nothing crashes.
//
// Here: the disk - a read-only output location and a full disk (a small tmpfs in a private mount
// namespace, and RLIMIT_FSIZE), checkpoints truncated at every kind of place, and inputs
// truncated while convert, inspect or verify reads them (a clean I/O error, not SIGBUS).
// The cases run the nf4 binary (tests/support/faults.h): $NF4_TEST_CLI instead of this build's
// when that is set.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tools/checkpoint/safetensors.h"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"
#include "tests/support/faults.h"
#include "tests/support/io.h"

using namespace nf4;
using nf4::test::contains;
using nf4::test::entries_of;
using nf4::test::golden_path;
using nf4::test::Limits;
using nf4::test::read_text;
using nf4::test::Result;
using nf4::test::run_nf4;
using nf4::test::ScratchDir;
using nf4::test::spawn_nf4;
using nf4::test::stop_after_reading;
using nf4::test::stop_when_output_appears;
using nf4::test::write_big_checkpoint;

// ---- output faults -------------------------------------------------------------------------

TEST_CASE("faults: convert to a read-only location fails clearly and creates nothing") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string ro = scratch / "ro";
  std::filesystem::create_directory(ro);
  Limits l;
  l.mount = {ro, /*read_only=*/true, 1 << 20};
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    std::string in = golden_path();
    if (sharded) {
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
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string small = scratch / "small";
  std::filesystem::create_directory(small);
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
  NF4_SKIP_WITHOUT_CLI();
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
      const std::vector<std::string> args = test::command_args(cmd, cut, outdir + "/out.safetensors");
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

// The input is read with pread, never through a mapping: a checkpoint truncated by another
// process while it is being converted is a clean I/O error naming it (no SIGBUS), and the
// temporary output is removed.
TEST_CASE("faults: the input truncated while nf4 convert reads it is a clean I/O error, not SIGBUS") {
  NF4_SKIP_WITHOUT_CLI();
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

// ---- inputs truncated while inspect or verify reads them ---------------------------------------

namespace {

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
  NF4_SKIP_WITHOUT_CLI();
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
