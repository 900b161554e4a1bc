// SPDX-License-Identifier: MIT
// Faults (docs/RELIABILITY.md, sections 3 and 4): what the library and `nf4 convert` do when the
// world goes wrong. Each case checks a clear error (status / exit code and a message naming the
// cause), that nothing partial is left behind, and that nothing crashes.
//
// Here: runs interrupted, killed or raced - `nf4 convert` interrupted by SIGINT / SIGTERM / SIGHUP /
// SIGQUIT / SIGXFSZ (single file and sharded; while converting, and while parsing a huge header
// or index), two converts to one OUT (the lock), the leftovers of
// one killed by SIGKILL, and --force replacing a model directory as a whole.
// The cases run the nf4 binary (tests/support/faults.h): $NF4_TEST_CLI instead of this build's
// when that is set.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "tools/checkpoint/safetensors.h"
#include "tools/checkpoint/sharded.h"
#include "tests/support/faults.h"
#include "tests/support/io.h"
#include "tests/support/process.h"

using namespace nf4;
using nf4::test::check_clean_failure;
using nf4::test::contains;
using nf4::test::entries_of;
using nf4::test::read_text;
using nf4::test::Run;
using nf4::test::run_bin;
using nf4::test::ScratchDir;
using nf4::test::spawn_nf4;
using nf4::test::stop_after_reading;
using nf4::test::stop_when_output_appears;
using nf4::test::write_big_checkpoint;
using nf4::test::write_text;

// ---- interrupted convert -------------------------------------------------------------------------

TEST_CASE("faults: nf4 convert interrupted by SIGINT / SIGTERM / SIGHUP / SIGQUIT / SIGXFSZ or any signal that ends a process exits with a clear error and leaves nothing") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string single = scratch / "in.safetensors";
  write_big_checkpoint(single);
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
                        {"SIGXFSZ, single file", single, false, SIGXFSZ},
                        // Every other signal whose default action ends the process: the same.
                        {"SIGPIPE, sharded", scratch / "sharded", true, SIGPIPE},
                        {"SIGUSR1, single file", single, false, SIGUSR1},
                        {"SIGALRM, sharded", scratch / "sharded", true, SIGALRM},
                        {"SIGRTMIN + 3, single file", single, false, SIGRTMIN + 3}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string outdir = scratch / "out";
    std::filesystem::create_directory(outdir);
    const std::string out = outdir + (c.sharded ? "/model" : "/out.safetensors");
    const std::string log = scratch / "convert.log";
    int st = 0;
    bool stopped = false;
    // A run that converts the whole input before this process (starved of CPU by a loaded machine)
    // sees its temporary output exercises nothing: it is run again, from an empty OUT.
    for (int attempt = 0; attempt < 5; ++attempt) {
      // 1 MiB batches: an interrupt check between each.
      const pid_t pid = spawn_nf4({"convert", c.in, out, "--backend", "cpu", "--dtype", "bf16", "--batch-mb", "1"}, log);
      REQUIRE(pid > 0);
      bool finished = false;
      stopped = stop_when_output_appears(pid, outdir, &st, &finished);
      if (stopped) {
        ::kill(pid, c.sig);  // pending until it runs on
        ::kill(pid, SIGCONT);
        // A second one (an impatient Ctrl-C) must not skip the clean-up.
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ::kill(pid, c.sig);
      }
      if (!finished) ::waitpid(pid, &st, 0);
      if (stopped || !WIFEXITED(st) || WEXITSTATUS(st) != 0) break;
      std::filesystem::remove_all(outdir);
      std::filesystem::create_directory(outdir);
    }
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

namespace {

// Header or index text whose parse takes a while (see below): 200k items (tensors,
// metadata keys, metadata values), then a repeated key at the very end. A reader that honours a
// signal while parsing exits with the interrupt; one that only looks after parsing meets the
// repeated key first and fails with a format error instead, so the test tells the two apart.
constexpr int kSlowParseItems = 200000;

std::string header_of_many_tensors() {
  std::string h = "{";
  for (int i = 0; i < kSlowParseItems; ++i) h += "\"t." + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},";
  return h + "\"__metadata__\":{\"format\":\"pt\",\"format\":\"pt\"}}";
}

std::string header_of_many_metadata_keys() {
  std::string h = "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"__metadata__\":{";
  for (int i = 0; i < kSlowParseItems; ++i) h += "\"key." + std::to_string(i) + "\":\"value of key " + std::to_string(i) + "\",";
  return h + "\"key.0\":\"again\"}}";
}

// The index of a sharded model in `model` (its weight_map kept) under metadata of 200k values.
std::string index_of_many_metadata_values(const std::string& model) {
  const nlohmann::json weight_map = nlohmann::json::parse(read_text(model + "/" + io::kIndexFileName))["weight_map"];
  std::string t = "{\"weight_map\":" + weight_map.dump() + ",\"metadata\":{";
  for (int i = 0; i < kSlowParseItems; ++i) t += "\"key." + std::to_string(i) + "\":" + std::to_string(i) + ",";
  return t + "\"key.0\":0}}";
}

}  // namespace

// Parsing a huge header or index is a phase of its own (tens of milliseconds for 200k items in a
// release build, more under a sanitizer, seconds for a 100 MB header): the reader's loops call io::check_cancel(), so a signal stops the run
// there too. The process is frozen right after it has read the text (it parses next), signalled,
// and continued; nothing has been created beside OUT yet (the lock comes after the input is read).
TEST_CASE("faults: nf4 convert interrupted while parsing a huge header or index exits at once with a clear error") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string many_tensors = scratch / "tensors.safetensors", many_keys = scratch / "keys.safetensors", model = scratch / "model";
  test::write_raw(many_tensors, header_of_many_tensors(), {});
  test::write_raw(many_keys, header_of_many_metadata_keys(), {0});
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  const std::string index = model + "/" + io::kIndexFileName;
  write_text(index, index_of_many_metadata_values(model));

  struct Case {
    std::string name, in, read_first;  // what it is, the input, and the file whose text is parsed
    int sig;
  };
  const Case cases[] = {{"200k tensors in the header, SIGINT", many_tensors, many_tensors, SIGINT},
                        {"200k metadata keys in the header, SIGTERM", many_keys, many_keys, SIGTERM},
                        {"200k metadata values in the index, SIGINT", model, index, SIGINT},
                        {"200k metadata values in the index, SIGTERM", model, index, SIGTERM}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string outdir = scratch / "out", out = outdir + "/dense", log = scratch / "convert.log";
    const std::int64_t text_end = static_cast<std::int64_t>(std::filesystem::file_size(c.read_first));
    // The parse takes tens of milliseconds in a release build, and this process needs a moment
    // to stop nf4 once it has read the text: on a loaded machine nf4 may finish parsing first
    // and fail on the repeated key. A parse that honours signals is interrupted in one of three
    // tries however loaded the machine; one that does not fails all three.
    bool stopped = false;
    int st = 0;
    std::string why;
    std::chrono::steady_clock::duration took{};
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::filesystem::create_directory(outdir);
      const pid_t pid = spawn_nf4({"convert", c.in, out, "--backend", "cpu"}, log);
      REQUIRE(pid > 0);
      bool finished = false;
      why.clear();
      stopped = stop_after_reading(pid, c.read_first, text_end, &st, &finished, &why);
      const auto continued = std::chrono::steady_clock::now();
      if (stopped) {
        ::kill(pid, c.sig);  // pending until it runs on
        ::kill(pid, SIGCONT);
      }
      if (!finished) ::waitpid(pid, &st, 0);
      took = std::chrono::steady_clock::now() - continued;
      CHECK_MESSAGE(std::filesystem::is_empty(outdir), "left behind in " << outdir);
      std::filesystem::remove_all(outdir);
      if (stopped && WIFEXITED(st) && WEXITSTATUS(st) == 128 + c.sig) break;
    }
    const std::string output = read_text(log);
    CHECK_MESSAGE(stopped, why << ": " << output);
    if (!stopped) continue;
    CHECK_MESSAGE(WIFEXITED(st), "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
    CHECK_MESSAGE(WEXITSTATUS(st) == 128 + c.sig, output);
    CHECK_MESSAGE(contains(output, std::string("interrupted by ") + test::signal_name(c.sig)), output);
    CHECK_MESSAGE(contains(output, out), output);
    // Generous for a loaded machine and a sanitizer build: the rest of the parse alone takes less.
    CHECK(took < std::chrono::seconds(10));
  }
}

// ---- one OUT, two runs --------------------------------------------------------------------------

TEST_CASE("faults: two converts to one OUT: the second fails at once, the first completes; --force too") {
  NF4_SKIP_WITHOUT_CLI();
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
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs", log = scratch / "killed.log";
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

TEST_CASE("faults: --force replaces a model directory as a whole, and refuses to delete one that is not a model") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", out = scratch / "dense";
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
