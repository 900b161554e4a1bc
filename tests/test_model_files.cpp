// SPDX-License-Identifier: MIT
// Hostile model files, in-process (docs/RELIABILITY.md, section 4): JSON nested deep and repeated
// keys in every file, no file contents in messages, only regular files opened, files resolving out
// of the model directory, size limits; config.json edited for a dense copy, and the other files of
// a model directory carried. tests/test_faults_model_dirs.cpp runs such directories through the
// nf4 binary.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/file_open.h"
#include "tools/checkpoint/json_limits.h"
#include "tools/checkpoint/model_dir.h"
#include "tools/checkpoint/safetensors.h"
#include "tools/checkpoint/sharded.h"
#include "tests/support/io.h"

using namespace nf4;
using nf4::test::contains;
using nf4::test::error_of;
using nf4::test::open_error;
using nf4::test::ScratchDir;

namespace {

std::string nested_json(std::size_t levels, const std::string& inner = "1") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

}  // namespace

TEST_CASE("deeply nested JSON is refused in every file without recursing (10^6 levels)") {
  const std::string deep = nested_json(1000000);
  const std::string deep_object = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"a\":";
    s += "1";
    s.append(100000, '}');
    return s;
  }();
  // The index's metadata, config.json, a quant state, a safetensors header (in a field of a tensor
  // entry the reader does not use; __metadata__ holds only strings).
  const std::pair<const char*, std::function<void()>> cases[] = {
      {"index", [&] { io::parse_index(R"({"metadata": {"m": )" + deep + R"(}, "weight_map": {"a": "x.safetensors"}})"); }},
      {"index (objects)", [&] { io::parse_index(R"({"metadata": )" + deep_object + R"(, "weight_map": {"a": "x.safetensors"}})"); }},
      {"config.json", [&] { io::dense_model_config(R"({"x": )" + deep + "}", "bfloat16"); }},
      {"quant state", [&] { io::parse_quant_state(R"({"quant_type": "nf4", "x": )" + nested_json(20) + "}"); }},
      {"header entry", [&] { io::parse_header(R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0], "x": )" + deep + "}}", 0); }},
  };
  for (const auto& entry : cases) {
    const auto& what = entry.first;
    const auto& run = entry.second;
    CAPTURE(what);
    const auto err = error_of(run);
    CHECK(err.first == NF4_ERR_FORMAT);
    CHECK_MESSAGE((contains(err.second, "deeper than") || contains(err.second, "quant state is not a JSON object")), err.second);
  }
  // Nesting within the limit is fine where the format allows it.
  CHECK_NOTHROW(io::parse_index(R"({"metadata": {"m": )" + nested_json(30) + R"(}, "weight_map": {"a": "x.safetensors"}})"));
}

TEST_CASE("repeated keys are refused, naming the key: header tensors, metadata, index, config") {
  const auto header_err = error_of([] {
    io::parse_header(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                        "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})", 2);
  });
  CHECK(header_err.first == NF4_ERR_FORMAT);
  CHECK_MESSAGE(contains(header_err.second, "tensor 'w' appears twice"), header_err.second);
  const auto field_err = error_of([] { io::parse_header(R"({"w": {"dtype": "U8", "dtype": "F32", "shape": [1], "data_offsets": [0, 1]}})", 1); });
  CHECK_MESSAGE(contains(field_err.second, "'dtype' appears twice"), field_err.second);
  const auto meta_err = error_of([] { io::parse_header(R"({"__metadata__": {"format": "pt", "format": "tf"}})", 0); });
  CHECK_MESSAGE(contains(meta_err.second, "'format' appears twice"), meta_err.second);
  const auto index_err = error_of([] { io::parse_index(R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})"); });
  CHECK(index_err.first == NF4_ERR_FORMAT);
  CHECK_MESSAGE(contains(index_err.second, "key 'a' appears twice"), index_err.second);
  const auto config_err = error_of([] { io::dense_model_config(R"({"quantization_config": {}, "quantization_config": {}})", ""); });
  CHECK_MESSAGE(contains(config_err.second, "'quantization_config' appears twice"), config_err.second);
}

TEST_CASE("error messages never quote file contents: a header length read from a foreign file") {
  ScratchDir dir;
  const std::string secret = "hunter2!this is not a safetensors file at all";
  test::write_bytes(dir / "secret", std::vector<std::uint8_t>(secret.begin(), secret.end()));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(secret[static_cast<std::size_t>(i)]);
  const auto err = open_error(dir / "secret");
  CHECK(err.first == NF4_ERR_FORMAT);
  CHECK_MESSAGE(contains(err.second, "not a safetensors file"), err.second);
  CHECK_MESSAGE(!contains(err.second, std::to_string(n)), err.second);
  CHECK_MESSAGE(!contains(err.second, "hunter2"), err.second);
  // Nor JSON syntax errors (whose library message would quote the text around the error).
  const auto json_err = error_of([] { io::parse_index("{\"weight_map\": {\"a\": hunter2}}"); });
  CHECK(json_err.first == NF4_ERR_FORMAT);
  CHECK_MESSAGE(!contains(json_err.second, "hunter"), json_err.second);
}

TEST_CASE("only regular files are opened, without blocking: FIFOs, directories and devices are refused") {
  ScratchDir dir;
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto err = open_error(dir / "fifo");  // no writer: a blocking open would never return
  CHECK(err.first == NF4_ERR_IO);
  CHECK_MESSAGE(contains(err.second, "a FIFO, not a regular file"), err.second);
  err = error_of([&] { io::read_index(dir / "fifo"); });
  CHECK(err.first == NF4_ERR_IO);
  CHECK_MESSAGE(contains(err.second, "FIFO"), err.second);
  err = error_of([&] { io::read_text_file("/dev/zero", 1 << 20); });  // would read without end
  CHECK(err.first == NF4_ERR_IO);
  CHECK_MESSAGE(contains(err.second, "character device"), err.second);
  err = open_error(dir.path());
  CHECK_MESSAGE(contains(err.second, "a directory"), err.second);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("files of a model directory that resolve outside it are refused unless links out are allowed") {
  ScratchDir outside, model;
  std::vector<std::uint8_t> b(4, 7);
  io::write_safetensors(outside / "real.safetensors", {{{"x", io::DType::U8, {4}}, b.data()}}, {});
  std::filesystem::create_symlink(outside / "real.safetensors", model / "model.safetensors");
  const io::InputPolicy strict{io::real_path(model.path()), false}, relaxed{io::real_path(model.path()), true};
  const auto err = error_of([&] { io::SafetensorsFile f(model / "model.safetensors", &strict); });
  CHECK(err.first == NF4_ERR_IO);
  CHECK_MESSAGE(contains(err.second, "outside the input directory"), err.second);
  CHECK_MESSAGE(contains(err.second, "--follow-symlinks"), err.second);
  CHECK_NOTHROW(io::SafetensorsFile(model / "model.safetensors", &relaxed));
  // A link that stays inside the directory is fine.
  std::filesystem::rename(outside / "real.safetensors", model / "real.bin");
  std::filesystem::remove(model / "model.safetensors");
  std::filesystem::create_symlink("real.bin", model / "model.safetensors");
  CHECK_NOTHROW(io::SafetensorsFile(model / "model.safetensors", &strict));
  // A "../" path out of the directory is the same as a link.
  test::write_bytes(outside / "secret.json", {'{', '}'});
  const auto up = error_of([&] { io::read_text_file(model.path() + "/../" + std::filesystem::path(outside.path()).filename().string() + "/secret.json", 100, &strict); });
  CHECK_MESSAGE(contains(up.second, "outside the input directory"), up.second);
}

TEST_CASE("files larger than their limit are refused before being read: index, config") {
  ScratchDir dir;
  {
    std::ofstream f(dir / "big.json", std::ios::binary);
    f << R"({"weight_map": {"a": "x.safetensors"}})";
    f << std::string(static_cast<std::size_t>(io::kMaxIndexBytes), ' ');
  }
  const auto err = error_of([&] { io::read_index(dir / "big.json"); });
  CHECK(err.first == NF4_ERR_FORMAT);
  CHECK_MESSAGE(contains(err.second, "more than the"), err.second);
  const auto cfg = error_of([&] { io::read_text_file(dir / "big.json", io::kMaxConfigBytes); });
  CHECK_MESSAGE(contains(cfg.second, "more than the"), cfg.second);
}

TEST_CASE("config.json for a dense copy: quantization_config cut out byte for byte, dtype recorded") {
  const std::string in = "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"quantization_config\": {\n    \"a\": \"}\\\"{\",\n"
                         "    \"b\": [1, {\"c\": null}]\n  },\n  \"rope_scaling\": {\"factor\": 8.0, \"x\": 1e-05},\n"
                         "  \"torch_dtype\": \"float16\",\n  \"z\": 0.1000000000000000055511151231257827\n}\n";
  const std::string out = io::dense_model_config(in, "bfloat16");
  CHECK(out ==
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"rope_scaling\": {\"factor\": 8.0, \"x\": 1e-05},\n"
        "  \"torch_dtype\": \"bfloat16\",\n  \"z\": 0.1000000000000000055511151231257827\n}\n");
  // No dtype member: torch_dtype added; "dtype" (newer transformers) updated too; only the quant config.
  CHECK(io::dense_model_config(R"({"a": 1, "quantization_config": {}})", "float16") == R"({"a": 1, "torch_dtype": "float16"})");
  CHECK(io::dense_model_config(R"({"dtype": "float16", "a": 1})", "float32") == R"({"dtype": "float32", "a": 1})");
  CHECK(io::dense_model_config(R"( { "quantization_config" : { } } )", "") == R"( {  } )");
  CHECK(io::dense_model_config("{}", "bfloat16") == R"({"torch_dtype": "bfloat16"})");
  // Escaped key spellings are the same key.
  CHECK(io::dense_model_config(R"({"quantization\u005fconfig": 1, "b": 2})", "") == R"({"b": 2})");
  // Nested quantization_config members (in a sub-config) are data, not the model's.
  CHECK(io::dense_model_config(R"({"text_config": {"quantization_config": 1}})", "") == R"({"text_config": {"quantization_config": 1}})");
  // Each member keeps the separator before it: a long separator once in the input stays once
  // (reused between every pair, a 1 MB separator and 10^5 members would make a 100 GB
  // config.json; tests/fuzz/regressions/model_json/first-separator-repeated).
  CHECK(io::dense_model_config("{\"a\": 1,  \n\"b\": 2, \"c\": 3}", "") == "{\"a\": 1,  \n\"b\": 2, \"c\": 3}");
  CHECK(io::dense_model_config("{\"a\": 1, \"quantization_config\": 0,\n \"b\": 2}", "float16") ==
        "{\"a\": 1,\n \"b\": 2,\n \"torch_dtype\": \"float16\"}");
  {
    std::string wide = "{\"a\": 0," + std::string(1 << 16, ' ');
    for (int i = 0; i < 4096; ++i) wide += fmt::format("\"m{}\": {}, ", i, i);
    wide += "\"quantization_config\": {}}";
    const std::string edited = io::dense_model_config(wide, "bfloat16");
    CHECK(edited.size() <= wide.size() + 64);
    CHECK(nlohmann::json::parse(edited).size() == 4098);
  }
  // A 20 KB config nested 10^4 levels does not become a 200 MB file: it is refused.
  const auto err = error_of([] { io::dense_model_config("{\"x\": " + nested_json(10000) + "}", "bfloat16"); });
  CHECK(err.first == NF4_ERR_FORMAT);
  CHECK(!error_of([] { io::dense_model_config("[1]", ""); }).second.empty());
}

TEST_CASE("JSON is strict where the parser alone would skip or stop: byte order mark, NUL bytes, numbers it would change") {
  const std::string bom = "\xEF\xBB\xBF";
  struct Case {
    std::string text, message;
  };
  const Case refused[] = {{bom + "{}", "byte order mark"},
                          {bom + R"({"a": 1})", "byte order mark"},
                          {std::string("{}\0", 3), "NUL byte at byte 2"},
                          {std::string("{\"a\": 1}\0{\"b\": [", 16), "NUL byte at byte 8"},
                          {std::string("{\"a\": \"x\0y\"}", 12), "NUL byte at byte 8"},
                          {R"({"a": 1} x)", "not valid JSON"},
                          {R"({"a": 1}{})", "not valid JSON"},
                          {R"({"a": 18446744073709551616})", "64-bit range"},
                          {R"({"a": -9223372036854775809})", "64-bit range"},
                          {R"({"a": 1e400})", "not valid JSON"},  // nlohmann refuses a double out of range itself
                          {R"({"a": -1e999})", "not valid JSON"},
                          {R"({"a": NaN})", "not valid JSON"}};
  for (const Case& c : refused) {
    CAPTURE(io::printable(c.text));
    for (const auto& entry : std::vector<std::pair<std::string, std::function<void()>>>{
             {"bounded", [&] { io::parse_json_bounded(c.text, "x.json", {1 << 20}); }},
             {"config", [&] { io::dense_model_config(c.text, "bfloat16", "dir/config.json"); }}}) {
      const auto& what = entry.first;
      const auto& parse = entry.second;
      CAPTURE(what);
      const auto err = error_of(parse);
      CHECK(err.first == NF4_ERR_FORMAT);
      CHECK_MESSAGE(contains(err.second, c.message), err.second);
    }
  }
  // The message names the file once.
  CHECK(error_of([&] { io::dense_model_config(bom + "{}", "", "dir/config.json"); }).second.rfind("dir/config.json: starts with", 0) == 0);
  // Whitespace after the value, and numbers a double holds as written, are fine.
  CHECK(io::parse_json_bounded(" {\"a\": [1.5e300, -0.0, 18446744073709551615, -9223372036854775808]} \r\n\t", "x", {1 << 20}).size() == 1);
  // The safetensors header: the same rules (the reference loader refuses these too).
  const std::string entry = R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})";
  CHECK(error_of([&] { io::parse_header(bom + entry, 4); }).second.find("byte order mark") != std::string::npos);
  CHECK(error_of([&] { io::parse_header(entry + std::string("\0junk", 5), 4); }).second.find("NUL byte") != std::string::npos);
  CHECK(error_of([&] { io::parse_header(entry + "   ", 4); }).first == NF4_OK);
}

TEST_CASE("carried files: every file (subfolders too) but the weights and nf4's temporaries, each skipped one named with the reason") {
  ScratchDir outside, model;
  for (const char* name : {"tokenizer.json", "README.md", "LICENSE", "generation_config.json", "chat_template.jinja", ".gitattributes",
                           "training_args.bin", "notes.nf4-readme"})
    test::write_bytes(model / name, {'x'});
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "config.json", "consolidated.pth",
                           ".dense.nf4-lock", ".dense.nf4-tmp-1-2-3-0000abcd"})
    test::write_bytes(model / name, {'w'});
  // sentence-transformers' module folders: their config.json is carried as it is.
  std::filesystem::create_directories(model / "1_Pooling");
  test::write_bytes(model / "1_Pooling/config.json", {'p'});
  std::filesystem::create_directories(model / "original/deeper");
  test::write_bytes(model / "original/deeper/params.json", {'q'});
  test::write_bytes(model / "original/consolidated.00.pth", {'w'});
  std::filesystem::create_directory(model / "empty");
  // A clone's version-control data holds the weights again, under names without a suffix.
  std::filesystem::create_directories(model / ".git/lfs/objects/ab");
  test::write_bytes(model / ".git/lfs/objects/ab/cdef0123", {'w'});
  std::filesystem::create_directory_symlink(outside.path(), model / "linked_dir");
  const io::InputPolicy policy{io::real_path(model.path()), false};
  const std::vector<std::string> own = {"model.safetensors"};
  const io::CarriedFiles c = io::carried_files(model.path(), policy, own);
  CHECK(c.files == (std::vector<std::string>{".gitattributes", "1_Pooling/config.json", "LICENSE", "README.md", "chat_template.jinja",
                                              "generation_config.json", "notes.nf4-readme", "original/deeper/params.json",
                                              "tokenizer.json", "training_args.bin"}));
  CHECK(c.dirs == (std::vector<std::string>{"1_Pooling", "original", "original/deeper"}));
  std::map<std::string, std::string> skipped(c.skipped.begin(), c.skipped.end());
  CHECK(skipped.size() == 8);
  CHECK(contains(skipped[".git/"], "hidden directory"));
  for (const char* name : {"pytorch_model.bin", "consolidated.pth", "original/consolidated.00.pth", "model.safetensors.index.json"})
    CHECK_MESSAGE(contains(skipped[name], "weights in another format"), name);
  CHECK(contains(skipped[".dense.nf4-lock"], "nf4"));
  CHECK(contains(skipped[".dense.nf4-tmp-1-2-3-0000abcd"], "nf4"));
  CHECK(contains(skipped["linked_dir"], "symbolic link to a directory"));
  REQUIRE(::mkfifo((model / "original/tokenizer.model").c_str(), 0600) == 0);
  auto err = error_of([&] { io::carried_files(model.path(), policy, own); });
  CHECK(err.first == NF4_ERR_IO);
  CHECK_MESSAGE(contains(err.second, "original/tokenizer.model"), err.second);
  std::filesystem::remove(model / "original/tokenizer.model");
  test::write_bytes(outside / "secret", {'s'});
  std::filesystem::create_symlink(outside / "secret", model / "special_tokens_map.json");
  err = error_of([&] { io::carried_files(model.path(), policy, own); });
  CHECK_MESSAGE(contains(err.second, "special_tokens_map.json"), err.second);
  CHECK_MESSAGE(contains(err.second, "outside the input directory"), err.second);
  CHECK(io::carried_files(model.path(), {policy.root, true}, own).files.size() == 11);
}
