// SPDX-License-Identifier: MIT
// Faults (docs/RELIABILITY.md section 4): hostile checkpoints and unlucky runs, each case through
// the nf4 binary as a user would meet it (tests/support/faults.h; $NF4_TEST_CLI runs another
// build's binary instead). Every case here is one class of docs/RELIABILITY.md's table: a weight
// that looks quantized without a quant state, JSON with a byte order mark or text after a NUL,
// names with terminal escapes, model-directory files that are not weights, write errors on
// standard output, --force onto nodes convert never writes, two sources in one directory, the
// product check's memory, syncing many carried files, many shards, and the messages.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/sharded.h"
#include "tests/support/faults.h"
#include "tests/support/io.h"

using namespace nf4;
using nf4::test::check_clean_failure;
using nf4::test::contains;
using nf4::test::entries_of;
using nf4::test::golden_path;
using nf4::test::read_text;
using nf4::test::Run;
using nf4::test::run_bin;
using nf4::test::ScratchDir;
using nf4::test::SpawnOptions;
using nf4::test::write_text;

namespace {

// Occurrences of `part` in `s`.
std::size_t count_of(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size())) ++n;
  return n;
}

// A checkpoint of `layers` small quantized weights "model.layers.I.mlp.weight" (NF4, blocksize
// 64; odd layers nested) whose quant-state keys `rename` may change ("" drops the key's tensor).
void write_layers(const std::string& path, int layers, const std::function<std::string(int, const std::string&)>& rename) {
  std::vector<cpu::QuantizedWeight> ws;
  for (int i = 0; i < layers; ++i) ws.push_back(test::synthetic_weight(4096, NF4_QUANT_NF4, 64, i % 2 == 1, 40 + i));
  std::vector<io::TensorData> ts;
  std::deque<std::string> keep;
  for (int i = 0; i < layers; ++i)
    test::add_param(ts, keep, "model.layers." + std::to_string(i) + ".mlp.weight", ws[i], test::quant_state_json(ws[i], {64, 64}).dump());
  std::vector<io::TensorData> out;
  std::deque<std::string> names;
  for (auto& t : ts) {
    const std::size_t at = t.spec.name.find(".mlp.");
    const int layer = std::stoi(t.spec.name.substr(13, at - 13));
    names.push_back(t.spec.name.find(".quant_state.") != std::string::npos ? rename(layer, t.spec.name) : t.spec.name);
    if (names.back().empty()) continue;
    t.spec.name = names.back();
    out.push_back(t);
  }
  io::write_safetensors(path, out, {{"format", "pt"}});
}

// The output of a finished run of `nf4 ARGS` with `options`.
Run run_with(const std::vector<std::string>& args, const ScratchDir& scratch, const SpawnOptions& options) {
  return run_bin(args, scratch, 60, options);
}

}  // namespace

// ---- a weight that looks quantized but has no usable quant state ---------------------------------

TEST_CASE("faults: a U8 weight with absmax and quant_map but no usable quant state is refused naming it (missing, __NF4, __nf5; one layer or all)") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string outs = scratch / "outs";
  std::filesystem::create_directory(outs);
  struct Case {
    const char* what;
    std::function<std::string(int, const std::string&)> rename;
    const char* named;  // the parameter the message must name
  };
  const auto swap_suffix = [](const std::string& key, const std::string& suffix) {
    return key.substr(0, key.rfind("__") + 2) + suffix;
  };
  const Case cases[] = {
      {"quant state missing in layer 1", [](int l, const std::string& k) { return l == 1 ? "" : k; }, "model.layers.1.mlp.weight"},
      {"__NF4 in layer 2", [&](int l, const std::string& k) { return l == 2 ? swap_suffix(k, "NF4") : k; }, "model.layers.2.mlp.weight"},
      {"__nf5 in every layer", [&](int, const std::string& k) { return swap_suffix(k, "nf5"); }, "model.layers.0.mlp.weight"},
      {"missing in every layer", [](int, const std::string&) { return std::string(); }, "model.layers.0.mlp.weight"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string in = scratch / "in.safetensors";
    write_layers(in, 4, c.rename);
    for (const char* cmd : {"convert", "inspect", "verify"}) {
      CAPTURE(cmd);
      const std::vector<std::string> args = test::command_args(cmd, in, outs + "/dense.safetensors");
      const Run r = run_bin(args, scratch);
      check_refused(r, c.named, "quant state", outs);
    }
  }
}

// ---- JSON: a byte order mark, text after a NUL --------------------------------------------------

TEST_CASE("faults: config.json or a header with a byte order mark, or text after a NUL, is refused with a true message, never read out of bounds") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs";
  std::filesystem::create_directory(outs);
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  const std::string bom = "\xEF\xBB\xBF";
  struct Case {
    std::string config, message;
  };
  const Case cases[] = {{bom + "{}", "byte order mark"},
                        {bom + "{\"architectures\": [\"LlamaForCausalLM\"], \"quantization_config\": {}}", "byte order mark"},
                        {std::string("{\"a\": 1}\0junk", 13), "NUL byte at byte 8"},
                        {std::string("{\"a\": 1}\0{\"b\": [", 16), "NUL byte"}};
  for (const Case& c : cases) {
    CAPTURE(c.message);
    write_text(model + "/config.json", c.config);
    const Run r = run_bin({"convert", model, outs + "/dense", "--backend", "cpu"}, scratch);
    check_clean_failure(r, "config.json");
    CHECK_MESSAGE(contains(r.output, c.message), r.output);
    CHECK_MESSAGE(count_of(r.output, "config.json") == 1, "the path printed more than once: " << r.output);
    CHECK(entries_of(outs).empty());
  }
  // The same in a safetensors header: the reference loader refuses both.
  const std::string entry = R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})";
  for (const auto& c : std::vector<std::pair<std::string, std::string>>{
           {bom + entry, "byte order mark"}, {entry + std::string("\0junk after the JSON!!", 22), "NUL byte"}}) {
    const std::string& header = c.first;
    const std::string& message = c.second;
    CAPTURE(message);
    const std::string file = scratch / "bad.safetensors";
    test::write_raw(file, header, {1, 2, 3, 4});
    for (const char* cmd : {"inspect", "convert"}) {
      const std::vector<std::string> args = test::command_args(cmd, file, outs + "/dense.safetensors");
      const Run r = run_bin(args, scratch);
      check_clean_failure(r, "bad.safetensors");
      CHECK_MESSAGE(contains(r.output, message), r.output);
    }
    CHECK(entries_of(outs).empty());
  }
}

// ---- SIGPIPE -------------------------------------------------------------------------------------

TEST_CASE("faults: convert --progress into a pipe nobody reads stops on SIGPIPE: exit 141, no lock, no temporary, no OUT") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  test::write_sharded_golden(scratch / "sharded", 116, /*with_expected=*/false);
  for (const std::string& in : {golden_path(), scratch / "sharded"}) {
    CAPTURE(in);
    const std::string outs = scratch / "outs";
    std::filesystem::create_directory(outs);
    SpawnOptions options;
    options.output_to_closed_pipe = true;
    const Run r = run_with({"convert", "--progress", in, outs + "/dense", "--backend", "cpu", "--batch-mb", "1"}, scratch, options);
    // Exit 141 after the clean-up, or killed by SIGPIPE while saying so on the same closed pipe
    // (the shell sees 141 either way); what matters is that nothing is left.
    CHECK_MESSAGE(((r.exited && r.code == 128 + SIGPIPE) || r.signal == SIGPIPE), "exit " << r.code << ", signal " << r.signal);
    CHECK_MESSAGE(entries_of(outs).empty(), "left behind: " << entries_of(outs).front());
    std::filesystem::remove_all(outs);
  }
}

// ---- names with terminal escapes -----------------------------------------------------------------

TEST_CASE("faults: tensor names and metadata with terminal escapes are printed escaped by inspect and verify") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string file = scratch / "escapes.safetensors";
  const cpu::QuantizedWeight w = test::synthetic_weight(4096, NF4_QUANT_NF4, 64, false, 7);
  std::vector<io::TensorData> ts;
  std::deque<std::string> keep;
  // Retitles the window, clears the screen, moves the cursor up over earlier lines (C0 and C1).
  const std::string evil = "\x1b]0;pwned\x07\x1b[2J\x1b[3A\xc2\x9b" "1A";
  test::add_param(ts, keep, "layer" + evil + ".weight", w, test::quant_state_json(w, {64, 64}).dump());
  const std::vector<std::uint16_t> dense(4, 0x3f80);
  ts.push_back({{"dense" + evil, io::DType::BF16, {4}}, dense.data()});
  // An expected output that disagrees, so that verify names the parameter in its report.
  const std::vector<float> wrong(4096, 0.0f);
  ts.push_back({{io::expected_tensor_name("layer" + evil + ".weight", NF4_DTYPE_F32), io::DType::F32, {64, 64}}, wrong.data()});
  io::write_safetensors(file, ts, {{"format", "pt"}, {"note" + evil, "value" + evil}});
  const auto check_clean = [](const std::string& out) {
    for (const char c : {'\x1b', '\x07'}) CHECK_MESSAGE(out.find(c) == std::string::npos, out);
    CHECK_MESSAGE(out.find("\xc2\x9b") == std::string::npos, out);
    CHECK_MESSAGE(contains(out, "\\x1b]0;pwned\\x07"), out);
  };
  Run r = run_bin({"inspect", file}, scratch);
  CHECK_MESSAGE(r.code == 0, r.output);
  check_clean(r.output);
  CHECK(contains(r.output, "\\xc2\\x9b1A"));
  // A difference report names the parameter too: the file's expected tensor disagrees.
  r = run_bin({"verify", file, "--backend", "cpu", "--dtype", "fp32"}, scratch, 60);
  CHECK_MESSAGE(r.code == 1, r.output);
  check_clean(r.output);
  // --json escapes through JSON itself.
  r = run_bin({"inspect", file, "--json"}, scratch);
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.find('\x1b') == std::string::npos);
  bool listed = false;
  const nlohmann::json report = nlohmann::json::parse(r.output);
  for (const auto& d : report["dense"]) listed = listed || d["name"] == "dense" + evil;
  CHECK_MESSAGE(listed, r.output);
}

// ---- files of a model directory that are not weights ---------------------------------------------

TEST_CASE("faults: every file of a model directory is carried (subfolders too) or named with the reason it is not") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", out = scratch / "dense";
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  const std::map<std::string, std::string> carried = {{"1_Pooling/config.json", "{\"pooling_mode_mean_tokens\": true}"},
                                                      {"2_Normalize/.keep", ""},
                                                      {"training_args.bin", "pickled arguments"},
                                                      {"notes.nf4-readme", "a user's file"},
                                                      {"modules.json", "[]"}};
  const std::vector<std::string> skipped = {"optimizer.pt", "extra.pth", "original/consolidated.00.pth", "pytorch_model.bin"};
  for (const auto& [name, text] : carried) {
    std::filesystem::create_directories(std::filesystem::path(model + "/" + name).parent_path());
    write_text(model + "/" + name, text);
  }
  for (const auto& name : skipped) {
    std::filesystem::create_directories(std::filesystem::path(model + "/" + name).parent_path());
    write_text(model + "/" + name, "weights");
  }
  // A clone's version-control data: the 4-bit weights again, under a hashed name.
  std::filesystem::create_directories(model + "/.git/lfs/objects/ab");
  test::write_bytes(model + "/.git/lfs/objects/ab/cdef0123", test::read_bytes(model + "/model-00001-of-00003.safetensors"));
  const Run r = run_bin({"convert", model, out, "--backend", "cpu"}, scratch);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_FALSE(std::filesystem::exists(out + "/.git"));
  CHECK_MESSAGE(contains(r.output, "not carried: .git/ (a hidden directory"), r.output);
  for (const auto& entry : carried) {
    const std::string& name = entry.first;
    const std::string& text = entry.second;
    CAPTURE(name);
    REQUIRE(std::filesystem::is_regular_file(out + "/" + name));
    CHECK(read_text(out + "/" + name) == text);
  }
  for (const auto& name : skipped) {
    CAPTURE(name);
    CHECK_FALSE(std::filesystem::exists(out + "/" + name));
    CHECK_MESSAGE(contains(r.output, "not carried: " + name + " (weights in another format"), r.output);
  }
  CHECK_FALSE(std::filesystem::exists(out + "/original"));  // nothing carried into it
}

// ---- write errors on standard output and reports -------------------------------------------------

TEST_CASE("faults: inspect, verify and bench fail when their output cannot be written (stdout or the report on a full disk)") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  SpawnOptions full;
  full.stdout_to_dev_full = true;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"inspect", golden_path()}, {"inspect", golden_path(), "--json"}, {"verify", golden_path(), "--backend", "cpu", "--json"},
           {"verify", golden_path(), "--backend", "cpu"}, {"convert", "--help"}}) {
    CAPTURE(fmt::format("{}", fmt::join(args, " ")));
    const Run r = run_with(args, scratch, full);
    CHECK(r.code == 1);
    CHECK_MESSAGE(contains(r.output, "writing to standard output failed"), r.output);
  }
  const Run r = run_bin({"bench", "--backend", "cpu", "--shapes", "64x64", "--dtypes", "bf16", "--mlp", "", "--iters", "1", "--copy-mib",
                         "1", "--json", "/dev/full"},
                        scratch, 120);
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.output, "/dev/full"), r.output);
  CHECK_MESSAGE(contains(r.output, "No space left on device"), r.output);
}

// ---- --force onto nodes convert never writes -------------------------------------------------------

TEST_CASE("faults: --force replaces only a regular file or a directory: a FIFO, a device, a symbolic link (dangling or not) stay") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string target = scratch / "target.safetensors";
  write_text(target, "keep me");
  struct Case {
    const char* what;
    std::function<bool(const std::string&)> make;  // false: cannot be made here (skipped)
    std::function<bool(const std::string&)> intact;
    const char* message;
  };
  const auto is = [](const std::string& p, unsigned kind) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == kind;
  };
  const Case cases[] = {
      {"a FIFO", [](const std::string& p) { return ::mkfifo(p.c_str(), 0600) == 0; }, [&](const std::string& p) { return is(p, S_IFIFO); },
       "a FIFO"},
      {"a character device (like /dev/null)", [](const std::string& p) { return ::mknod(p.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0; },
       [&](const std::string& p) { return is(p, S_IFCHR); }, "a character device"},
      {"a dangling symbolic link", [&](const std::string& p) { return ::symlink((scratch / "nowhere").c_str(), p.c_str()) == 0; },
       [&](const std::string& p) { return is(p, S_IFLNK) && !std::filesystem::exists(scratch / "nowhere"); }, "symbolic link"},
      {"a symbolic link to a file", [&](const std::string& p) { return ::symlink(target.c_str(), p.c_str()) == 0; },
       [&](const std::string& p) { return is(p, S_IFLNK) && read_text(target) == "keep me"; }, "symbolic link"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string out = scratch / "out.safetensors";
    std::filesystem::remove(out);
    if (!c.make(out)) {
      MESSAGE("skipped: cannot make " << c.what << " here: " << std::strerror(errno));
      continue;
    }
    for (const bool force : {false, true}) {
      CAPTURE(force);
      std::vector<std::string> args = {"convert", golden_path(), out, "--backend", "cpu"};
      if (force) args.push_back("--force");
      const Run r = run_bin(args, scratch);
      check_clean_failure(r, "out.safetensors");
      CHECK_MESSAGE(contains(r.output, c.message), r.output);
      CHECK(c.intact(out));
    }
    for (const auto& e : entries_of(scratch.path())) CHECK_MESSAGE(!contains(e, ".nf4-"), "left behind: " << e);
  }
}

// ---- two sources in one directory ----------------------------------------------------------------

TEST_CASE("faults: a directory with model.safetensors beside an index of other shards is refused naming both") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs";
  std::filesystem::create_directory(outs);
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  test::write_bytes(model + "/model.safetensors", test::read_bytes(golden_path()));
  for (const char* cmd : {"convert", "inspect", "verify"}) {
    CAPTURE(cmd);
    const std::vector<std::string> args = test::command_args(cmd, model, outs + "/dense");
    const Run r = run_bin(args, scratch, 60);
    check_refused(r, "model.safetensors.index.json", "and model.safetensors", outs);
  }
  // Naming one of them is not ambiguous.
  const Run r = run_bin({"inspect", model + "/" + io::kIndexFileName}, scratch);
  CHECK_MESSAGE(r.code == 0, r.output);
}

// ---- verify's memory ------------------------------------------------------------------------------

TEST_CASE("faults: verify's product check of an [N, 1] weight stays within the batch budget (memory follows the file, not 128 x it)") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  constexpr std::int64_t n = std::int64_t{1} << 21;  // 1 MiB of packed codes
  const cpu::QuantizedWeight w = test::synthetic_weight(n, NF4_QUANT_NF4, 64, false, 11);
  const auto write_shaped = [&](const std::string& path, std::vector<std::int64_t> shape) {
    std::vector<io::TensorData> ts;
    std::deque<std::string> keep;
    test::add_param(ts, keep, "w.weight", w, test::quant_state_json(w, shape).dump());
    io::write_safetensors(path, ts, {{"format", "pt"}});
  };
  write_shaped(scratch / "tall.safetensors", {n, 1});
  write_shaped(scratch / "square.safetensors", {1024, n / 1024});
  const Run square = run_bin({"verify", scratch / "square.safetensors", "--backend", "cpu", "--dtype", "fp32"}, scratch, 120);
  const Run tall = run_bin({"verify", scratch / "tall.safetensors", "--backend", "cpu", "--dtype", "fp32"}, scratch, 120);
  REQUIRE_MESSAGE(square.code == 0, square.output);
  REQUIRE_MESSAGE(tall.code == 0, tall.output);
  // The whole product at once would add 2 x 8 x N x 4 bytes = 128 MiB over the square shape.
  MESSAGE("peak RSS: square " << square.max_rss_kb / 1024 << " MiB, [N, 1] " << tall.max_rss_kb / 1024 << " MiB");
  CHECK(tall.max_rss_kb - square.max_rss_kb < 40 * 1024);
}

// ---- syncing many carried files ------------------------------------------------------------------

TEST_CASE("faults: 400 carried files are synced once per directory, not one fsync each") {
  NF4_SKIP_WITHOUT_CLI();
#if !defined(NF4_COUNT_SYNCS_PATH)
  MESSAGE("skipped: the sync counter is not built");
#else
  ScratchDir scratch;
  const std::string model = scratch / "model";
  std::filesystem::create_directories(model + "/extra");
  test::write_bytes(model + "/model.safetensors", test::read_bytes(golden_path()));
  for (int i = 0; i < 200; ++i) {
    write_text(model + "/file" + std::to_string(i) + ".txt", "x");
    write_text(model + "/extra/file" + std::to_string(i) + ".txt", "y");
  }
  const std::string counts = scratch / "syncs.txt";
  SpawnOptions options;
  const char* asan = std::getenv("ASAN_OPTIONS");
  // A preloaded library comes before the sanitizer's runtime in the list of libraries.
  options.env = {std::string("LD_PRELOAD=") + NF4_COUNT_SYNCS_PATH, "NF4_COUNT_SYNCS_OUT=" + counts,
                 std::string("ASAN_OPTIONS=") + (asan ? asan : "") + ":verify_asan_link_order=0"};
  const Run r = run_with({"convert", model, scratch / "dense", "--backend", "cpu"}, scratch, options);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(entries_of(scratch / "dense/extra").size() == 200);
  const std::string text = read_text(counts);
  REQUIRE_MESSAGE(!text.empty(), "the sync counter did not report: " << r.output);
  const long fsyncs = std::strtol(text.c_str() + text.find("fsync ") + 6, nullptr, 10);
  MESSAGE(text);
  CHECK(fsyncs <= 8);
#endif
}

// ---- many shards ---------------------------------------------------------------------------------

TEST_CASE("faults: 300 shards under an open-file limit: inspect and convert open them a few at a time, however many descriptors others hold") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model";
  std::filesystem::create_directory(model);
  io::ShardIndex index;
  const float one = 1.0f;
  for (int i = 0; i < 300; ++i) {
    const std::string shard = fmt::format("model-{:05d}-of-00300.safetensors", i + 1), name = fmt::format("t{}", i);
    io::write_safetensors(model + "/" + shard, {{{name, io::DType::F32, {1}}, &one}}, {{"format", "pt"}});
    index.weight_map[name] = shard;
  }
  write_text(model + "/" + io::kIndexFileName, io::index_json(index));
  // A limit of 64 with 40 descriptors taken before nf4 runs (a GPU driver holds some dozens), and
  // a limit of 16: the shard cache sizes itself from the limit and gives way when an open fails.
  struct Case {
    long limit;
    int held;
  };
  for (const Case& c : {Case{64, 40}, Case{16, 0}}) {
    CAPTURE(c.limit);
    CAPTURE(c.held);
    SpawnOptions options;
    options.max_open_files = c.limit;
    options.held_descriptors = c.held;
    Run r = run_with({"inspect", model}, scratch, options);
    CHECK_MESSAGE(r.code == 0, r.output);
    const std::string out = scratch / fmt::format("dense-{}", c.limit);
    r = run_with({"convert", model, out, "--backend", "cpu"}, scratch, options);
    CHECK_MESSAGE(r.code == 0, r.output);
    CHECK(entries_of(out).size() == 301);
  }
}

// ---- messages ------------------------------------------------------------------------------------

TEST_CASE("faults: messages name the option or the file: bench sizes, shard names, non-UTF-8 names") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  // Sizes no machine can allocate, a negative blocksize: usage errors naming the option.
  for (const auto& c : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"bench", "--shapes", "9223372036854775807x2"}, "--shapes"},
           {{"bench", "--shapes", "4096x"}, "--shapes"},
           {{"bench", "--gemv", "--gemv-shapes", "100000000x100000000"}, "--gemv-shapes"},
           {{"bench", "--blocksize", "-64"}, "--blocksize"},
           {{"bench", "--blocksize", "48"}, "--blocksize"}}) {
    const std::vector<std::string>& args = c.first;
    const std::string& option = c.second;
    CAPTURE(option);
    const Run r = run_bin(args, scratch);
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.output, option), r.output);
    CHECK_FALSE(contains(r.output, "bad_alloc"));
  }
  // A shard named like a file a dense copy writes or carries.
  for (const std::string shard : {"tokenizer.json", "config.json"}) {
    CAPTURE(shard);
    const std::string model = scratch / "model";
    std::filesystem::remove_all(model);
    std::filesystem::create_directory(model);
    test::write_bytes(model + "/" + shard, test::read_bytes(golden_path()));
    io::ShardIndex index;
    const io::SafetensorsFile golden(golden_path());
    for (const auto& t : golden.tensors()) index.weight_map[t.name] = shard;
    write_text(model + "/" + io::kIndexFileName, io::index_json(index));
    const Run r = run_bin({"convert", model, scratch / "dense", "--backend", "cpu"}, scratch);
    check_clean_failure(r, "'" + shard + "' is not a .safetensors file name");
    CHECK_FALSE(contains(r.output, "File exists"));
  }
  // A file name that is not UTF-8: JSON output still written, the table escapes it.
  const std::string model = scratch / "latin1";
  std::filesystem::create_directory(model);
  test::write_bytes(model + "/mod\xe8le.safetensors", test::read_bytes(golden_path()));
  Run r = run_bin({"inspect", model, "--json"}, scratch);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_FALSE(contains(r.output, "json.exception"));
  CHECK(nlohmann::json::parse(r.output)["shards"][0]["name"] == "mod\xef\xbf\xbdle.safetensors");
  r = run_bin({"inspect", model}, scratch);
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "mod\\xe8le.safetensors"), r.output);
}
