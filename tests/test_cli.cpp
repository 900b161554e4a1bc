// SPDX-License-Identifier: MIT
// The convert / inspect / verify commands, driven in-process through CLI11 as `nf4` would run
// them (and convert_checkpoint directly where a test needs to act between pieces of work).
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstring>

#include "core/error.h"
#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/output.h"
#include "tests/support/io.h"
#include "tests/support/common.h"
#include "tools/cli_main.h"
#include "tools/commands.h"
#include "tools/convert.h"

using namespace nf4;
using nf4::test::ScratchDir;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct CliResult {
  int code = 0;
  std::string out;  // stdout and stderr together
};

// Runs `nf4 ARGS...` in-process through tools/main.cpp's own run_app, capturing what it prints.
CliResult run_cli(std::vector<std::string> args) {
  ScratchDir capture_dir;
  const std::string capture = capture_dir / "out.txt";
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved_out = ::dup(1), saved_err = ::dup(2);
  const int fd = ::open(capture.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::close(fd);
  CliResult r;
  {
    CLI::App app{"nf4"};
    app.require_subcommand(1);
    cli::add_convert_command(app);
    cli::add_inspect_command(app);
    cli::add_verify_command(app);
    cli::plain_help(app);
    args.insert(args.begin(), "nf4");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    r.code = cli::run_app(app, static_cast<int>(argv.size()), argv.data());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  const auto bytes = test::read_bytes(capture);
  r.out.assign(bytes.begin(), bytes.end());
  return r;
}

const std::string& golden_path() {
  static const std::string p = test::data_path("golden.safetensors");
  return p;
}

// Every cNNN.weight of a converted golden file equals the expected tensor of its dtype, with the
// original shape, and nothing of the quant state is left.
void check_converted_golden(const std::string& path, std::optional<nf4_dtype> forced) {
  io::Checkpoint out(path);
  const auto& g = test::golden_file();
  CHECK(io::find_quantized_params(out).empty());
  for (std::size_t i = 0; i < out.shard_count(); ++i) {
    CHECK(out.shard(i).metadata().at("format") == "pt");
    for (const auto& t : out.shard(i).tensors()) CHECK_MESSAGE(!contains(t.name, "absmax"), t.name);
  }
  std::size_t checked = 0;
  for (const auto& c : test::golden_cases()) {
    CAPTURE(c.case_name);
    nf4_dtype d;
    if (forced) d = *forced;
    else REQUIRE(io::parse_torch_dtype(c.param.state.dtype, &d));
    const io::TensorRef w = out.find(c.param.name);
    REQUIRE(w);
    CHECK(w->dtype == io::to_safetensors_dtype(d));
    CHECK(w->shape == c.param.state.shape);
    const io::TensorInfo* exp = c.expected[d];
    REQUIRE(exp != nullptr);
    REQUIRE(w->bytes() == exp->bytes());
    CHECK(std::memcmp(w.data(), g.data(*exp), static_cast<std::size_t>(exp->bytes())) == 0);
    // The expected tensors are dense: passed through byte for byte.
    const io::TensorRef passed = out.find(exp->name);
    REQUIRE(passed);
    CHECK(std::memcmp(passed.data(), g.data(*exp), static_cast<std::size_t>(exp->bytes())) == 0);
    ++checked;
  }
  CHECK(checked == 116);
}

// Flips one bit of `tensor`'s first byte in a copy of `from`.
void copy_with_flipped_bit(const std::string& from, const std::string& to, const std::string& tensor) {
  std::int64_t offset = 0;  // within the data section
  {
    io::SafetensorsFile f(from);
    const io::TensorInfo* t = f.find(tensor);
    REQUIRE(t != nullptr);
    offset = t->begin;
  }
  auto bytes = test::read_bytes(from);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  bytes[8 + n + static_cast<std::uint64_t>(offset)] ^= 0x01;
  test::write_bytes(to, bytes);
}

}  // namespace

TEST_CASE("convert golden: every cNNN.weight equals bitsandbytes' output, per --dtype and by default") {
  ScratchDir dir;
  for (const char* d : {"fp16", "bf16", "fp32"}) {
    CAPTURE(d);
    const std::string out = dir / (std::string(d) + ".safetensors");
    const CliResult r = run_cli({"convert", golden_path(), out, "--dtype", d, "--backend", "cpu"});
    REQUIRE_MESSAGE(r.code == 0, r.out);
    nf4_dtype dt;
    REQUIRE(io::parse_torch_dtype(d, &dt));
    check_converted_golden(out, dt);
  }
  const std::string out = dir / "default.safetensors";
  const CliResult r = run_cli({"convert", golden_path(), out});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  check_converted_golden(out, std::nullopt);
  // Nothing but the outputs in the directory: no temporary left behind.
  CHECK(dir.entries() == std::vector<std::string>{"bf16.safetensors", "default.safetensors", "fp16.safetensors", "fp32.safetensors"});
}

TEST_CASE("convert in tiny batches (tensors split at block boundaries) writes the same bytes") {
  ScratchDir dir;
  cli::ConvertOptions o;
  o.in = golden_path();
  o.out = dir / "a.safetensors";
  o.dtype = NF4_DTYPE_BF16;
  o.backend = NF4_BACKEND_CPU;
  const auto r = cli::convert_checkpoint(o);
  CHECK(r.quantized == 116);
  o.out = dir / "b.safetensors";
  o.batch_bytes = 1;  // every piece one slice granularity: many slices and one call each
  std::size_t calls = 0;
  o.on_progress = [&](const cli::ConvertProgress&) { ++calls; };
  cli::convert_checkpoint(o);
  CHECK(calls > 116);
  CHECK(test::read_bytes(dir / "a.safetensors") == test::read_bytes(dir / "b.safetensors"));
}

TEST_CASE("convert refuses to overwrite IN, however it is named, even with --force") {
  ScratchDir dir;
  const std::string in = dir / "in.safetensors";
  test::write_bytes(in, test::read_bytes(golden_path()));
  const auto before = test::read_bytes(in);
  std::filesystem::create_symlink(in, dir / "link.safetensors");
  std::filesystem::create_hard_link(in, dir / "hard.safetensors");
  for (const std::string& out : {in, dir.path() + "/./in.safetensors", dir / "link.safetensors", dir / "hard.safetensors"}) {
    CAPTURE(out);
    for (bool force : {false, true}) {
      std::vector<std::string> args = {"convert", in, out};
      if (force) args.push_back("--force");
      const CliResult r = run_cli(args);
      CHECK(r.code == 1);
      CHECK_MESSAGE(contains(r.out, "refusing to overwrite"), r.out);
    }
  }
  CHECK(test::read_bytes(in) == before);
  CHECK(dir.entries() == std::vector<std::string>{"hard.safetensors", "in.safetensors", "link.safetensors"});
}

TEST_CASE("convert refuses an existing OUT unless --force, which replaces it atomically") {
  ScratchDir dir;
  const std::string out = dir / "out.safetensors";
  test::write_bytes(out, {'o', 'l', 'd'});
  CliResult r = run_cli({"convert", golden_path(), out, "--dtype", "fp16"});
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.out, "--force"), r.out);
  CHECK(test::read_bytes(out) == std::vector<std::uint8_t>{'o', 'l', 'd'});
  r = run_cli({"convert", golden_path(), out, "--dtype", "fp16", "--force"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  check_converted_golden(out, NF4_DTYPE_F16);
  CHECK(dir.entries() == std::vector<std::string>{"out.safetensors"});
  // A directory is not a file to replace.
  std::filesystem::create_directory(dir / "d");
  r = run_cli({"convert", golden_path(), dir / "d", "--force"});
  CHECK(r.code == 1);
  CHECK(contains(r.out, "is a directory"));
}

TEST_CASE("convert leaves no OUT and no temporary file when it fails or is interrupted") {
  ScratchDir dir;
  const std::string out = dir / "out.safetensors";

  SUBCASE("SIGINT between tensors") {
    cli::ConvertOptions o;
    o.in = golden_path();
    o.out = out;
    o.backend = NF4_BACKEND_CPU;
    int seen = 0;
    o.on_progress = [&](const cli::ConvertProgress& p) {
      CHECK(p.tensors == 464);
      if (++seen == 3) std::raise(SIGINT);  // the handler installed by convert only sets a flag
    };
    try {
      cli::convert_checkpoint(o);
      FAIL("not interrupted");
    } catch (const Error& e) {
      CHECK(e.status() == NF4_ERR_INTERRUPTED);
      CHECK(contains(e.what(), "SIGINT"));
    }
    CHECK(seen == 3);
    CHECK(cli::last_interrupt_signal() == SIGINT);
  }
  SUBCASE("SIGTERM, sharded output") {
    ScratchDir in;
    test::write_sharded_golden(in.path(), 20);
    cli::ConvertOptions o;
    o.in = in.path();
    o.out = dir / "outdir";
    bool raised = false;
    o.on_progress = [&](const cli::ConvertProgress& p) {
      if (p.tensor >= 30 && !raised) {
        raised = true;
        std::raise(SIGTERM);
      }
    };
    try {
      cli::convert_checkpoint(o);
      FAIL("not interrupted");
    } catch (const Error& e) {
      CHECK(e.status() == NF4_ERR_INTERRUPTED);
    }
  }
  SUBCASE("an error in the middle of writing") {
    cli::ConvertOptions o;
    o.in = golden_path();
    o.out = out;
    o.on_progress = [&](const cli::ConvertProgress& p) {
      if (p.tensor >= 100) fail(NF4_ERR_IO, "simulated failure");
    };
    CHECK_THROWS_AS(cli::convert_checkpoint(o), Error);
  }
  SUBCASE("a checkpoint truncated mid-tensor") {
    const auto bytes = test::read_bytes(golden_path());
    test::write_bytes(dir / "cut.safetensors", std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 3)));
    const CliResult r = run_cli({"convert", dir / "cut.safetensors", out});
    CHECK(r.code == 1);
    CHECK_MESSAGE(contains(r.out, "outside the data section"), r.out);
    std::filesystem::remove(dir / "cut.safetensors");
  }
  SUBCASE("a quant state whose dtype is unknown, no --dtype") {
    const auto w = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 3);
    std::vector<io::TensorData> ts;
    std::deque<std::string> keep;
    test::add_param(ts, keep, "x.weight", w, test::quant_state_json(w, {1000}, "float8").dump());
    io::write_safetensors(dir / "in.safetensors", ts, {});
    CliResult r = run_cli({"convert", dir / "in.safetensors", out});
    CHECK(r.code == 1);
    CHECK_MESSAGE(contains(r.out, "pass --dtype"), r.out);
    r = run_cli({"convert", dir / "in.safetensors", out, "--dtype", "fp32"});  // fine with one
    CHECK(r.code == 0);
    std::filesystem::remove(out);
    std::filesystem::remove(dir / "in.safetensors");
  }
  SUBCASE("an unknown backend") {
    const CliResult r = run_cli({"convert", golden_path(), out, "--backend", "nonsense"});
    CHECK(r.code == 2);  // a usage error
  }
  CHECK(dir.entries().empty());
}

TEST_CASE("convert a sharded checkpoint into a sharded one with the same shard names and a new index") {
  ScratchDir in, outs;
  test::write_sharded_golden(in.path(), 116);
  const std::string out = outs / "dense";
  CliResult r = run_cli({"convert", in.path(), out, "--dtype", "bf16", "--progress"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(contains(r.out, "nf4 convert: tensor 464/464"));
  CHECK(outs.entries() == std::vector<std::string>{"dense"});
  CHECK(outs.entries("dense") == (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                                           "model-00003-of-00003.safetensors", io::kIndexFileName}));
  check_converted_golden(out, NF4_DTYPE_BF16);
  const io::ShardIndex index = io::read_index(out + "/" + io::kIndexFileName);
  CHECK(index.metadata["producer"] == "nf4 tests");
  io::Checkpoint ck(out);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < ck.shard_count(); ++i)
    for (const auto& t : ck.shard(i).tensors()) total += t.bytes();
  CHECK(index.metadata["total_size"] == total);
  CHECK(index.weight_map.size() == 464);

  // The same through the index path, and the result verified against its source.
  r = run_cli({"verify", out, "--reference", in / io::kIndexFileName});
  CHECK_MESSAGE(r.code == 0, r.out);

  // --force into the existing directory: replaced as a whole (the file placed there goes with the
  // old directory: OUT is never a mix of two runs).
  test::write_bytes(out + "/config.json", {'{', '}'});
  r = run_cli({"convert", in / io::kIndexFileName, out, "--dtype", "fp16"});
  CHECK(r.code == 1);
  r = run_cli({"convert", in / io::kIndexFileName, out, "--dtype", "fp16", "--force"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  check_converted_golden(out, NF4_DTYPE_F16);
  CHECK(outs.entries("dense").size() == 4);
  CHECK(!std::filesystem::exists(out + "/config.json"));
  CHECK(outs.entries() == std::vector<std::string>{"dense"});
  // Converting a sharded checkpoint onto its own directory is refused.
  r = run_cli({"convert", in.path(), in.path(), "--force"});
  CHECK(r.code == 1);
  CHECK(contains(r.out, "refusing to overwrite"));
}

TEST_CASE("convert carries a model directory's config.json without its quantization_config") {
  ScratchDir in, outs;
  test::write_sharded_golden(in.path(), 5);
  const std::string config = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "torch_dtype": "float16",
    "quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "quant_method": "bitsandbytes"}})";
  test::write_bytes(in / "config.json", std::vector<unsigned char>(config.begin(), config.end()));
  CliResult r = run_cli({"convert", in.path(), outs / "dense", "--dtype", "bf16"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  std::ifstream f(outs / "dense/config.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  CHECK(!j.contains("quantization_config"));
  CHECK(j["torch_dtype"] == "bfloat16");
  CHECK(j["hidden_size"] == 64);
  CHECK(j["architectures"][0] == "LlamaForCausalLM");

  // A config.json that is not JSON fails the conversion and leaves nothing behind.
  test::write_bytes(in / "config.json", {'{', 'x'});
  r = run_cli({"convert", in.path(), outs / "dense2", "--dtype", "bf16"});
  CHECK(r.code == 1);
  CHECK(contains(r.out, "config.json"));
  CHECK(outs.entries() == std::vector<std::string>{"dense"});
}

TEST_CASE("verify: 0 on golden, 1 on a flipped expected bit, and dense conversions against their source") {
  ScratchDir dir;
  CliResult r = run_cli({"verify", golden_path()});
  CHECK_MESSAGE(r.code == 0, r.out);
  CHECK(contains(r.out, "oracle vs expected"));
  CHECK(contains(r.out, "cpu vs oracle"));
  CHECK(contains(r.out, "gemv cpu vs oracle"));
  CHECK(contains(r.out, "fast cpu vs bound"));
  CHECK(contains(r.out, "result: OK"));

  copy_with_flipped_bit(golden_path(), dir / "flipped.safetensors", "c000.expected.float16");
  r = run_cli({"verify", dir / "flipped.safetensors"});
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.out, "c000.weight fp16"), r.out);
  CHECK(contains(r.out, "result: FAILED"));
  r = run_cli({"verify", dir / "flipped.safetensors", "--dtype", "bf16", "--backend", "cpu"});  // that tensor not checked
  CHECK_MESSAGE(r.code == 0, r.out);

  r = run_cli({"convert", golden_path(), dir / "dense.safetensors", "--dtype", "fp32"});
  REQUIRE(r.code == 0);
  r = run_cli({"verify", dir / "dense.safetensors", "--reference", golden_path()});
  CHECK_MESSAGE(r.code == 0, r.out);
  copy_with_flipped_bit(dir / "dense.safetensors", dir / "dense-bad.safetensors", "c057.weight");
  r = run_cli({"verify", dir / "dense-bad.safetensors", "--reference", golden_path()});
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.out, "c057.weight"), r.out);
  copy_with_flipped_bit(dir / "dense.safetensors", dir / "dense-bad2.safetensors", "c003.expected.bfloat16");
  r = run_cli({"verify", dir / "dense-bad2.safetensors", "--reference", golden_path()});
  CHECK(r.code == 1);
  // A dense file on its own has nothing to verify.
  r = run_cli({"verify", dir / "dense.safetensors"});
  CHECK(r.code == 1);
  CHECK(contains(r.out, "--reference"));
  // A quantized file as its own "conversion": every weight is the wrong dtype.
  r = run_cli({"verify", golden_path(), "--reference", golden_path(), "--dtype", "fp16"});
  CHECK(r.code == 1);
}

TEST_CASE("inspect lists quantized parameters and dense tensors") {
  CliResult r = run_cli({"inspect", golden_path()});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(contains(r.out, "quantized parameters (116)"));
  CHECK(contains(r.out, "dense tensors (348)"));
  CHECK(contains(r.out, "c000.weight"));
  CHECK(contains(r.out, "[64, 200]"));
  CHECK(contains(r.out, "B2=256"));
  ScratchDir dir;
  test::write_sharded_golden(dir.path(), 5);
  r = run_cli({"inspect", dir.path()});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(contains(r.out, "3 shards"));
  r = run_cli({"inspect", dir / "missing.safetensors"});
  CHECK(r.code == 1);
}

// ---- exit statuses, --json, progress (tools/cli_main.h, docs/CLI.md) ---------------------------

TEST_CASE("usage errors exit 2 with the command's usage line; --help exits 0") {
  ScratchDir dir;
  const std::string out = dir / "out.safetensors";
  struct Case {
    std::vector<std::string> args;
    std::string usage;  // the usage line expected in the output
  };
  const std::vector<Case> cases = {
      {{}, "Usage: nf4 [OPTIONS] SUBCOMMAND"},
      {{"bogus"}, "Usage: nf4 [OPTIONS] SUBCOMMAND"},
      {{"convert"}, "Usage: nf4 convert [OPTIONS] IN OUT"},
      {{"convert", golden_path()}, "Usage: nf4 convert [OPTIONS] IN OUT"},
      {{"convert", golden_path(), out, "--nonsense"}, "Usage: nf4 convert [OPTIONS] IN OUT"},
      {{"convert", golden_path(), out, "--batch-mb", "0"}, "Usage: nf4 convert [OPTIONS] IN OUT"},
      {{"convert", golden_path(), out, "--dtype", "fp8"}, "Usage: nf4 convert [OPTIONS] IN OUT"},
      {{"convert", golden_path(), out, "--backend", "tpu"}, "Usage: nf4 convert [OPTIONS] IN OUT"},
      {{"inspect"}, "Usage: nf4 inspect [OPTIONS] FILE"},
      {{"inspect", golden_path(), golden_path()}, "Usage: nf4 inspect [OPTIONS] FILE"},
      {{"verify", golden_path(), "--dtype", "int4"}, "Usage: nf4 verify [OPTIONS] FILE"},
      {{"verify", golden_path(), "--backend", "tpu", "--json"}, "Usage: nf4 verify [OPTIONS] FILE"},
      {{"verify", golden_path(), "--json=maybe"}, "Usage: nf4 verify [OPTIONS] FILE"},
      {{"verify", golden_path(), "--backend", "cpu", "--device", "1"}, "Usage: nf4 verify [OPTIONS] FILE"},
      {{"verify", golden_path(), "--device", "0"}, "Usage: nf4 verify [OPTIONS] FILE"},  // needs --backend
      {{"verify", golden_path(), "--backend", "cpu", "--device", "-1"}, "Usage: nf4 verify [OPTIONS] FILE"},
  };
  for (const auto& c : cases) {
    CAPTURE(fmt::format("{}", fmt::join(c.args, " ")));
    const CliResult r = run_cli(c.args);
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.out, "nf4: error: "), r.out);
    CHECK_MESSAGE(contains(r.out, c.usage), r.out);
    CHECK(contains(r.out, "Run with --help for more information."));
  }
  CHECK(dir.entries().empty());  // nothing was converted
  // A device that does not exist is named with the devices there are.
  CliResult r = run_cli({"verify", golden_path(), "--backend", "cpu", "--device", "1"});
  CHECK_MESSAGE(contains(r.out, "--device 1 does not exist: the cpu backend has 1 device (0: "), r.out);
  r = run_cli({"verify", golden_path(), "--backend", "cpu", "--device", "0", "--no-gemv"});
  CHECK_MESSAGE(r.code == 0, r.out);
  r = run_cli({"convert", "--help"});
  CHECK(r.code == 0);
  CHECK_MESSAGE(contains(r.out, "Usage: nf4 convert [OPTIONS] IN OUT"), r.out);
  // Not usage errors: a missing file and a failed check exit 1.
  r = run_cli({"inspect", dir / "missing.safetensors"});
  CHECK(r.code == 1);
  CHECK_FALSE(contains(r.out, "Usage:"));
}

TEST_CASE("the command line says what is wrong: unknown commands and options named, OUT/ for a file refused, not a safetensors file, help in plain words") {
  ScratchDir dir;
  CliResult r = run_cli({"convrt", "x", "y"});
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.out, "unknown command 'convrt' (did you mean 'convert'?)"), r.out);
  CHECK_MESSAGE(contains(r.out, "Usage: nf4 [OPTIONS] SUBCOMMAND"), r.out);
  r = run_cli({"--bogus"});
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.out, "unknown option '--bogus'"), r.out);
  r = run_cli({"frobnicate"});
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.out, "unknown command 'frobnicate'; the commands are convert, inspect and verify"), r.out);

  // OUT/ names a directory; a single file converts to a file: refused, nothing written.
  r = run_cli({"convert", golden_path(), dir / "out/"});
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.out, "ends with '/'"), r.out);
  CHECK(dir.entries().empty());

  // Some other kind of file: said as such, whatever its first bytes make of the length field.
  test::write_text(dir / "README.md", "# A model card\n\nThis is not a checkpoint, only its description.\n");
  test::write_text(dir / "short.txt", "{\"a\"}\n");
  std::vector<std::uint8_t> small_length = {16, 0, 0, 0, 0, 0, 0, 0};
  for (char c : std::string("not json at all, really")) small_length.push_back(static_cast<std::uint8_t>(c));
  test::write_bytes(dir / "lying.bin", small_length);
  for (const char* name : {"README.md", "short.txt", "lying.bin"}) {
    CAPTURE(name);
    for (const char* cmd : {"inspect", "verify"}) {
      r = run_cli({cmd, dir / name});
      CHECK(r.code == 1);
      CHECK_MESSAGE(contains(r.out, std::string(name) + ": not a safetensors file"), r.out);
    }
  }

  // Help in plain words: no raw CLI11 rendering of types, validators or defaults.
  for (const char* cmd : {"convert", "inspect", "verify"}) {
    CAPTURE(cmd);
    r = run_cli({cmd, "--help"});
    CHECK(r.code == 0);
    for (const char* raw : {"TEXT", "FLOAT", "INT", "BOOLEAN", "e+06", " in [", "REQUIRED", ":{", "=256", "=auto"})
      CHECK_MESSAGE(!contains(r.out, raw), raw << " in\n" << r.out);
  }
  r = run_cli({"convert", "--help"});
  CHECK_MESSAGE(contains(r.out, "--batch-mb MIB"), r.out);
  CHECK_MESSAGE(contains(r.out, "1 to 1048576"), r.out);
  CHECK_MESSAGE(contains(r.out, "(default: 256)"), r.out);
  CHECK_MESSAGE(contains(r.out, "(default: auto)"), r.out);
}

TEST_CASE("inspect --json: one JSON document with the documented keys") {
  CliResult r = run_cli({"inspect", golden_path(), "--json"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  const nlohmann::json j = nlohmann::json::parse(r.out);  // stdout holds nothing else
  for (const char* key : {"path", "sharded", "tensor_count", "shards", "quantized", "dense", "totals"}) CHECK_MESSAGE(j.contains(key), key);
  CHECK(j["path"] == golden_path());
  CHECK(j["sharded"] == false);
  REQUIRE(j["quantized"].size() == 116);
  REQUIRE(j["dense"].size() == 348);
  REQUIRE(j["shards"].size() == 1);
  CHECK(j["tensor_count"] == j["shards"][0]["tensors"]);
  CHECK(j["shards"][0]["metadata"].is_object());
  const auto& q = j["quantized"][0];
  for (const char* key : {"name", "quant_type", "shape", "numel", "dtype", "blocksize", "nested", "nested_blocksize", "stored_bytes", "shard"})
    CHECK_MESSAGE(q.contains(key), key);
  CHECK(q["name"] == "c000.weight");
  CHECK(q["shape"] == nlohmann::json::array({64, 200}));
  CHECK(q["numel"] == 64 * 200);
  CHECK(q["shard"].is_null());
  const auto& d = j["dense"][0];
  for (const char* key : {"name", "dtype", "shape", "bytes", "shard"}) CHECK_MESSAGE(d.contains(key), key);
  const auto& t = j["totals"];
  for (const char* key : {"quantized_parameters", "quantized_elements", "quantized_stored_bytes", "dense_tensors", "dense_bytes",
                          "converted_bytes", "dequantized_bytes_by_dtype"})
    CHECK_MESSAGE(t.contains(key), key);
  CHECK(t["quantized_parameters"] == 116);
  CHECK(t["dense_tensors"] == 348);
  std::int64_t elements = 0, by_dtype = 0;
  for (const auto& p : j["quantized"]) elements += p["numel"].get<std::int64_t>();
  for (const auto& [name, bytes] : t["dequantized_bytes_by_dtype"].items()) by_dtype += bytes.get<std::int64_t>();
  CHECK(t["quantized_elements"] == elements);
  CHECK(t["converted_bytes"] == t["dense_bytes"].get<std::int64_t>() + by_dtype);

  ScratchDir dir;
  test::write_sharded_golden(dir.path(), 5);
  r = run_cli({"inspect", dir.path(), "--json"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  const nlohmann::json s = nlohmann::json::parse(r.out);
  CHECK(s["sharded"] == true);
  CHECK(s["shards"].size() == 3);
  CHECK(s["quantized"].size() == 5);
  CHECK(s["quantized"][0]["shard"].is_string());
}

TEST_CASE("verify --json: the result and every check as JSON, exit status unchanged") {
  ScratchDir dir;
  CliResult r = run_cli({"verify", golden_path(), "--json", "--backend", "cpu"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"file", "reference", "quantized_parameters", "dtypes", "checks", "problems", "problems_not_shown", "totals", "result"})
    CHECK_MESSAGE(j.contains(key), key);
  CHECK(j["result"] == "ok");
  CHECK(j["reference"].is_null());
  CHECK(j["quantized_parameters"] == 116);
  CHECK(j["dtypes"] == nlohmann::json::array({"fp16", "bf16", "fp32"}));
  CHECK(j["problems"].empty());
  REQUIRE(j["checks"].size() == 4);  // the dequantization on the file's data and on cpu, the product's two contracts on cpu
  for (const auto& c : j["checks"]) {
    for (const char* key : {"check", "device", "skipped", "tensors", "elements", "diff_elements", "diff_bits", "errors", "ok"})
      CHECK_MESSAGE(c.contains(key), key);
    CHECK(c["ok"] == true);
    CHECK(c["skipped"].is_null());
    CHECK(c["elements"].get<std::int64_t>() > 0);
  }
  CHECK(j["checks"][0]["check"] == "oracle vs expected");
  CHECK(j["checks"][1]["check"] == "cpu vs oracle");
  CHECK(j["checks"][2]["check"] == "gemv cpu vs oracle");
  CHECK(j["checks"][3]["check"] == "fast cpu vs bound");
  CHECK(j["totals"]["diff_bits"] == 0);
  CHECK(j["totals"]["compared_elements"] == j["checks"][0]["elements"].get<std::int64_t>() + j["checks"][1]["elements"].get<std::int64_t>() +
                                                 j["checks"][2]["elements"].get<std::int64_t>() + j["checks"][3]["elements"].get<std::int64_t>());

  // Every backend: unavailable ones are listed as skipped, with the reason.
  r = run_cli({"verify", golden_path(), "--json", "--dtype", "bf16"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  j = nlohmann::json::parse(r.out);
  CHECK(j["checks"].size() == 1 + 3 * nf4_backend_count());  // the file's data, then per backend the dequantization and the two products
  for (const auto& c : j["checks"])
    if (!c["skipped"].is_null()) CHECK(c["ok"] == false);

  copy_with_flipped_bit(golden_path(), dir / "flipped.safetensors", "c000.expected.float16");
  r = run_cli({"verify", dir / "flipped.safetensors", "--json", "--backend", "cpu", "--dtype", "fp16"});
  CHECK(r.code == 1);
  j = nlohmann::json::parse(r.out);
  CHECK(j["result"] == "failed");
  CHECK(j["totals"]["diff_elements"].get<std::int64_t>() > 0);
  REQUIRE(!j["problems"].empty());
  CHECK(contains(j["problems"][0].get<std::string>(), "c000.weight fp16"));
  CHECK(j["checks"][0]["ok"] == false);
  CHECK(j["checks"][1]["ok"] == true);

  r = run_cli({"convert", golden_path(), dir / "dense.safetensors", "--dtype", "fp32"});
  REQUIRE(r.code == 0);
  r = run_cli({"verify", dir / "dense.safetensors", "--reference", golden_path(), "--json"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  j = nlohmann::json::parse(r.out);
  CHECK(j["reference"] == golden_path());
  CHECK(j["quantized_parameters"] == 0);
  REQUIRE(j["checks"].size() == 2);
  CHECK(j["checks"][0]["check"] == "dequantized vs oracle");
  CHECK(j["checks"][1]["check"] == "pass-through tensors");
}

TEST_CASE("convert --progress reports the rate and the time left, and the total time at the end") {
  ScratchDir dir;
  const CliResult r = run_cli({"convert", golden_path(), dir / "out.safetensors", "--dtype", "bf16", "--progress", "--batch-mb", "1"});
  REQUIRE_MESSAGE(r.code == 0, r.out);
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < r.out.size();) {
    const std::size_t nl = r.out.find('\n', at);
    const std::string line = r.out.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if (line.rfind("nf4 convert: tensor ", 0) == 0) lines.push_back(line);
    at = nl == std::string::npos ? r.out.size() : nl + 1;
  }
  REQUIRE_MESSAGE(lines.size() >= 2, r.out);  // the first piece's line, then the final one
  CHECK_MESSAGE(contains(lines.front(), " MB/s, "), lines.front());
  CHECK_MESSAGE((contains(lines.front(), "s left") || contains(lines.front(), "m left")), lines.front());
  CHECK_MESSAGE(contains(lines.back(), "tensor 464/464"), lines.back());
  CHECK_MESSAGE(contains(lines.back(), "(100%)"), lines.back());
  CHECK_MESSAGE(contains(lines.back(), " MB/s, done in "), lines.back());
}
