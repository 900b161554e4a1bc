// SPDX-License-Identifier: MIT
// Faults (docs/RELIABILITY.md, sections 3 and 4): what the library and `nf4 convert` do when the
// world goes wrong. Each case checks a clear error (status / exit code and a message naming the
// cause), that nothing partial is left behind, and that nothing crashes.
//
// Here: hostile model directories - a FIFO as config.json, a shard or the index, files symlinked
// out of the directory, JSON nested 10^6 levels - and the layout of a model directory in and out
// (one model.safetensors or shards, config.json edited, the other files carried).
// The cases run the nf4 binary (tests/support/faults.h): $NF4_TEST_CLI instead of this build's
// when that is set.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
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
using nf4::test::write_text;

// ---- hostile model directories ------------------------------------------------------------------

TEST_CASE("faults: a FIFO as config.json, shard or index fails at once in every command (no hang)") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs";
  std::filesystem::create_directory(outs);
  for (const std::string which : {"config.json", "model-00002-of-00003.safetensors", io::kIndexFileName}) {
    CAPTURE(which);
    std::filesystem::remove_all(model);
    test::write_sharded_golden(model, 6, /*with_expected=*/false);
    std::filesystem::remove(model + "/" + which);
    REQUIRE(::mkfifo((model + "/" + which).c_str(), 0600) == 0);
    for (const char* cmd : {"convert", "inspect", "verify"}) {
      CAPTURE(cmd);
      const std::vector<std::string> args = test::command_args(cmd, model, outs + "/dense");
      const Run r = run_bin(args, scratch, 20);
      if (std::string(cmd) != "convert" && which == "config.json") {  // inspect and verify do not read it
        CHECK_MESSAGE(r.code == 0, r.output);
        continue;
      }
      check_refused(r, which, "FIFO", outs);
    }
  }
}

TEST_CASE("faults: files symlinked out of the model directory are refused unless --follow-symlinks; contents never echoed") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs", secret = scratch / "secret.txt";
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
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", outs = scratch / "outs";
  std::filesystem::create_directory(outs);
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  const std::string index_text = read_text(model + "/" + io::kIndexFileName);
  // The index's metadata nested deep.
  write_text(model + "/" + io::kIndexFileName, R"({"metadata": {"x": )" + deep + R"(}, "weight_map": )" +
                                                   nlohmann::json::parse(index_text)["weight_map"].dump() + "}");
  for (const char* cmd : {"convert", "inspect", "verify"}) {
    CAPTURE(cmd);
    const std::vector<std::string> args = test::command_args(cmd, model, outs + "/dense");
    const Run r = run_bin(args, scratch);
    check_refused(r, io::kIndexFileName, "deeper than", outs);
  }
  // config.json nested deep.
  write_text(model + "/" + io::kIndexFileName, index_text);
  write_text(model + "/config.json", R"({"x": )" + deep + "}");
  const Run r = run_bin({"convert", model, outs + "/dense"}, scratch);
  check_refused(r, "config.json", "deeper than", outs);
}

// The index is written with transformers' indentation for its two levels only: deeper metadata
// values, compact in the input, would otherwise come out with two spaces per level on each line.
TEST_CASE("faults: an index whose metadata is nested 60 levels and wide is written about as large as it was read") {
  NF4_SKIP_WITHOUT_CLI();
  ScratchDir scratch;
  const std::string model = scratch / "model", out = scratch / "dense";
  test::write_sharded_golden(model, 6, /*with_expected=*/false);
  const std::string index = model + "/" + io::kIndexFileName;
  const nlohmann::json weight_map = nlohmann::json::parse(read_text(index))["weight_map"];
  // 60 levels (the index's own two make 62 of the 64 allowed), each a wide array of small
  // values and an object; compact, as any writer may produce it.
  std::string wide;
  for (int i = 0; i < 200; ++i) wide += "0,";
  std::string deep = "{\"leaf\":[1,2,3]}";
  for (int level = 0; level < 29; ++level) deep = "[" + wide + "{\"k\":" + deep + ",\"w\":[" + wide + "0]}]";
  const std::string metadata = "{\"total_size\":0,\"producer\":\"nf4 tests\",\"deep\":" + deep + "}";
  const std::string input = "{\"metadata\":" + metadata + ",\"weight_map\":" + weight_map.dump() + "}";
  write_text(index, input);

  const Run r = run_bin({"convert", model, out, "--backend", "cpu"}, scratch);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string written = read_text(out + "/" + io::kIndexFileName);
  CAPTURE(input.size());
  CAPTURE(written.size());
  // The dense weight_map is smaller than the input's (the quant-state companions go); its lines
  // are indented, which a weight_map of this size cannot double.
  CHECK(written.size() <= 2 * input.size());
  const io::ShardIndex back = io::read_index(out + "/" + io::kIndexFileName);  // the bounded reader: depth kept under 64
  CHECK(back.metadata["deep"] == nlohmann::json::parse(metadata)["deep"]);
  CHECK(back.metadata["producer"] == "nf4 tests");
  CHECK(back.metadata["total_size"].get<std::int64_t>() > 0);
  CHECK(!back.weight_map.empty());
  for (const auto& [tensor, shard] : back.weight_map) CHECK(weight_map.at(tensor) == shard);
}

// ---- the layout of a model directory -----------------------------------------------------------

TEST_CASE("model directories: one model.safetensors or shards in, a loadable model directory out, trailing slashes or not") {
  NF4_SKIP_WITHOUT_CLI();
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
    std::filesystem::create_directory(dir + "/original");  // e.g. another format's weights: not carried, named
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
      // Weights in another format are not carried, and the output says so.
      for (const char* name : {"pytorch_model.bin", "original/consolidated.pth"})
        CHECK_MESSAGE(contains(r.output, std::string("not carried: ") + name + " (weights in another format"), r.output);
      std::vector<std::string> expected;
      for (const auto& entry : extra) {
        const std::string& name = entry.first;
        const std::string& text = entry.second;
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
