// SPDX-License-Identifier: MIT
// The nf4 side of the JSON differential (tests/fuzz/json_differential.py): reads fuzz inputs in
// the formats of fuzz_model_json (1 control byte, then the text) or fuzz_safetensors_header (8
// bytes of data-section size, then the header) and prints, one JSON line per input, what nf4's
// readers made of it; the Python script compares that with Python's own json module, so an input
// nf4 accepts but reads differently is a finding, not only a crash.
//   json_oracle model_json FILE...   {"file", "json": value | null, "config": text | null,
//                                     "index": {"metadata", "weight_map"} | null, "errors": {...}}
//   json_oracle header FILE...       {"file", "data_bytes", "header": {"tensors": [[name, dtype,
//                                     shape, begin, end], ...], "metadata": {...}} | null, "error"}
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tools/checkpoint/json_limits.h"
#include "tools/checkpoint/model_dir.h"
#include "tools/checkpoint/safetensors.h"
#include "tools/checkpoint/sharded.h"

namespace {

using nlohmann::json;

// The error of f() as text, or null; the value f() returns through `out` otherwise.
template <typename F>
json attempt(F&& f, json& out) {
  try {
    out = f();
    return nullptr;
  } catch (const nf4::Error& e) {
    out = nullptr;
    return e.what();
  }
}

json model_json(const std::string& bytes) {
  const std::string text = bytes.empty() ? std::string() : bytes.substr(1);
  static const char* const kDtypes[] = {"", "float16", "bfloat16", "float32"};
  const std::string dtype = bytes.empty() ? "" : kDtypes[static_cast<unsigned char>(bytes[0]) & 3];
  json r = json::object(), value, config, index;
  r["dtype"] = dtype;
  r["errors"] = {
      {"json", attempt([&] { return nf4::io::parse_json_bounded(text, "text", {std::size_t{64} << 20}); }, value)},
      {"config", attempt([&] { return json(nf4::io::dense_model_config(text, dtype)); }, config)},
      {"index", attempt(
                    [&] {
                      const nf4::io::ShardIndex i = nf4::io::parse_index(text);
                      return json{{"metadata", i.metadata}, {"weight_map", i.weight_map}};
                    },
                    index)}};
  r["json"] = value;
  r["config"] = config;
  r["index"] = index;
  return r;
}

json header(const std::string& bytes) {
  std::uint64_t size = 0;
  for (std::size_t i = 0; i < 8 && i < bytes.size(); ++i) size |= std::uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  const auto data_bytes = static_cast<std::int64_t>(size & 0x7fffffffffffffffull);
  const std::string text = bytes.size() > 8 ? bytes.substr(8) : std::string();
  json r = json::object(), h;
  r["data_bytes"] = data_bytes;
  r["error"] = attempt(
      [&] {
        const nf4::io::Header parsed = nf4::io::parse_header(text, data_bytes);
        json tensors = json::array();
        for (const auto& t : parsed.tensors) tensors.push_back({t.name, nf4::io::dtype_name(t.dtype), t.shape, t.begin, t.end});
        return json{{"tensors", tensors}, {"metadata", parsed.metadata}};
      },
      h);
  r["header"] = h;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (std::string(argv[1]) != "model_json" && std::string(argv[1]) != "header")) {
    std::fprintf(stderr, "usage: json_oracle model_json|header FILE...\n");
    return 2;
  }
  const bool headers = std::string(argv[1]) == "header";
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "json_oracle: cannot read %s\n", argv[i]);
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json r = headers ? header(bytes) : model_json(bytes);
    r["file"] = argv[i];
    // Everything nf4 accepted came from valid UTF-8; messages and paths are escaped if not.
    std::printf("%s\n", r.dump(-1, ' ', true, json::error_handler_t::replace).c_str());
  }
  return 0;
}
