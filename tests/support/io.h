// SPDX-License-Identifier: MIT
// Helpers for the file tests: a scratch directory, file contents and listings, the status and
// message of a failed call, raw safetensors bytes, quantized parameters laid out as transformers
// saves them, and a sharded copy of the golden file.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/checkpoint/safetensors.h"
#include "tools/checkpoint/sharded.h"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"

namespace nf4::test {

// The names of the entries of `dir`, sorted.
inline std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// A fresh directory under $TMPDIR, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string t = (std::filesystem::temp_directory_path() / "nf4-io-test-XXXXXX").string();
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Every entry in the directory (names), to check that no temporary file was left behind.
  std::vector<std::string> entries(const std::string& sub = "") const { return entries_of(sub.empty() ? path_ : path_ + "/" + sub); }

 private:
  std::string path_;
};

inline std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  std::vector<std::uint8_t> b(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return b;
}

inline void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_text(const std::string& path) {
  const auto b = read_bytes(path);
  return std::string(b.begin(), b.end());
}

inline void write_text(const std::string& path, const std::string& text) { write_bytes(path, std::vector<std::uint8_t>(text.begin(), text.end())); }

// The status and message of the nf4::Error that f() throws ({NF4_OK, ""} if it returns).
template <typename F>
std::pair<nf4_status, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {NF4_OK, ""};
}

// Opens `path` expecting failure; returns the status and message.
inline std::pair<nf4_status, std::string> open_error(const std::string& path) {
  return error_of([&] { io::SafetensorsFile f(path); });
}

// A safetensors file from a header text and data bytes, the header length field set to
// `declared_length` if non-negative (to build lying files).
inline void write_raw(const std::string& path, const std::string& header, const std::vector<std::uint8_t>& data,
                      std::int64_t declared_length = -1) {
  std::vector<std::uint8_t> b(8);
  const std::uint64_t n = declared_length >= 0 ? static_cast<std::uint64_t>(declared_length) : header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(n >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  write_bytes(path, b);
}

// The tensors transformers saves for a quantized parameter `name` (e.g. "layer.weight"), pointing
// into `w` (which must outlive the result). `state` is the quant-state JSON (default: what
// bitsandbytes writes for `w` with the given shape and dtype).
struct ParamTensors {
  std::string state_text;
  std::vector<io::TensorData> tensors;
};

inline nlohmann::json quant_state_json(const cpu::QuantizedWeight& w, const std::vector<std::int64_t>& shape,
                                       const std::string& dtype = "bfloat16") {
  nlohmann::json j = {{"quant_type", w.quant_type == NF4_QUANT_NF4 ? "nf4" : "fp4"},
                      {"blocksize", w.blocksize},
                      {"dtype", dtype},
                      {"shape", shape}};
  if (w.nested) {
    j["nested_blocksize"] = w.nested_blocksize;
    j["nested_dtype"] = "float32";
    j["nested_offset"] = w.nested_offset;
  }
  return j;
}

// Appends the parameter's tensors to `out`; `keep` holds the JSON text alive.
inline void add_param(std::vector<io::TensorData>& out, std::deque<std::string>& keep, const std::string& name,
                      const cpu::QuantizedWeight& w, const std::string& state_text) {
  using io::DType;
  const auto n = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  out.push_back({{name, DType::U8, {n(w.packed.size()), 1}}, w.packed.data()});
  if (w.nested) {
    out.push_back({{name + ".absmax", DType::U8, {n(w.absmax_u8.size())}}, w.absmax_u8.data()});
    out.push_back({{name + ".nested_absmax", DType::F32, {n(w.nested_absmax.size())}}, w.nested_absmax.data()});
    out.push_back({{name + ".nested_quant_map", DType::F32, {n(w.nested_code.size())}}, w.nested_code.data()});
  } else {
    out.push_back({{name + ".absmax", DType::F32, {n(w.absmax_f32.size())}}, w.absmax_f32.data()});
  }
  out.push_back({{name + ".quant_map", DType::F32, {n(w.quant_map.size())}}, w.quant_map.data()});
  keep.push_back(state_text);
  const std::string& s = keep.back();
  out.push_back({{name + ".quant_state.bitsandbytes__" + (w.quant_type == NF4_QUANT_NF4 ? "nf4" : "fp4"), DType::U8,
                  {n(s.size())}},
                 s.data()});
}

// A sharded copy of (part of) the golden file in `dir` (created if missing): the first `cases` parameters over three
// shards, with some parameters' companion tensors in a different shard than their weight, and
// (`with_expected`) each case's expected outputs, dense tensors that convert passes through.
inline void write_sharded_golden(const std::string& dir, std::size_t cases, bool with_expected = true) {
  std::filesystem::create_directories(dir);
  const auto& g = golden_file();
  std::vector<io::TensorData> shards[3];
  io::ShardIndex index;
  index.metadata["total_size"] = 0;
  index.metadata["producer"] = "nf4 tests";
  std::size_t k = 0;
  for (const auto& c : golden_cases()) {
    if (k++ >= cases) break;
    std::vector<const io::TensorInfo*> ts = {c.param.weight, c.param.absmax, c.param.quant_map, c.param.quant_state};
    if (c.param.nested_absmax) ts.push_back(c.param.nested_absmax);
    if (c.param.nested_quant_map) ts.push_back(c.param.nested_quant_map);
    if (with_expected)
      for (const auto* e : c.expected) ts.push_back(e);
    for (std::size_t j = 0; j < ts.size(); ++j) {
      const std::size_t s = (k + j) % 3;  // scatter a parameter's tensors over the shards
      shards[s].push_back({{ts[j]->name, ts[j]->dtype, ts[j]->shape}, g.data(*ts[j])});
      index.weight_map[ts[j]->name] = fmt::format("model-{:05d}-of-00003.safetensors", s + 1);
    }
  }
  for (int s = 0; s < 3; ++s)
    io::write_safetensors(fmt::format("{}/model-{:05d}-of-00003.safetensors", dir, s + 1), shards[s], {{"format", "pt"}});
  const std::string text = io::index_json(index);
  write_bytes(dir + "/" + io::kIndexFileName, std::vector<std::uint8_t>(text.begin(), text.end()));
}

}  // namespace nf4::test
