// SPDX-License-Identifier: MIT
// bnb 4-bit parameters inside checkpoints: found by their quant-state key, cross-checked against
// their companion tensors (every disagreement an NF4_ERR_FORMAT naming the parameter), spread
// over shards, stored at misaligned offsets, and sliced into independent pieces.
#include <doctest/doctest.h>

#include <cstring>

#include "backends/cpu/oracle.h"
#include "core/error.h"
#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/output.h"
#include "tests/support/io.h"
#include "tests/support/common.h"
#include "tests/support/process.h"

using namespace nf4;
using nf4::test::ScratchDir;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Weights {
  cpu::QuantizedWeight nested = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 1);  // shape [10, 100]
  cpu::QuantizedWeight flat = test::random_weight(777, NF4_QUANT_FP4, 32, false, 2);    // shape [7, 111]
  std::vector<std::uint16_t> norm = std::vector<std::uint16_t>(10, 0x3f80);
};

// The tensors of a small checkpoint: two quantized parameters and one dense tensor.
std::vector<io::TensorData> checkpoint_tensors(const Weights& w, std::deque<std::string>& keep) {
  std::vector<io::TensorData> ts;
  test::add_param(ts, keep, "a.weight", w.nested, test::quant_state_json(w.nested, {10, 100}, "float16").dump());
  test::add_param(ts, keep, "b.weight", w.flat, test::quant_state_json(w.flat, {7, 111}, "bfloat16").dump());
  ts.push_back({{"norm.weight", io::DType::BF16, {10}}, w.norm.data()});
  return ts;
}

// The oracle's output for a description.
std::vector<std::uint8_t> oracle(nf4_tensor t) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(t.numel) * nf4_dtype_size(t.out_dtype));
  t.out = out.data();
  t.out_bytes = static_cast<std::int64_t>(out.size());
  cpu::oracle_dequantize(t);
  return out;
}

// Rewrites a file so that its data section starts at an odd address (one more header byte).
void misalign(const std::string& path) {
  auto b = test::read_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<std::size_t>(i)];
  b.insert(b.begin() + 8 + static_cast<long>(n), ' ');
  ++n;
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  test::write_bytes(path, b);
}

std::pair<nf4_status, std::string> params_error(const std::string& path) {
  try {
    io::SafetensorsFile f(path);
    io::find_quantized_params(f);
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {NF4_OK, ""};
}

}  // namespace

TEST_CASE("quantized parameters are found by their quant-state key and dequantize like the source weights") {
  ScratchDir dir;
  Weights w;
  std::deque<std::string> keep;
  io::write_safetensors(dir / "ck.safetensors", checkpoint_tensors(w, keep), {{"format", "pt"}});
  io::SafetensorsFile f(dir / "ck.safetensors");
  const auto params = io::find_quantized_params(f);
  REQUIRE(params.size() == 2);
  const io::QuantizedParam& a = params[0].name == "a.weight" ? params[0] : params[1];
  const io::QuantizedParam& b = params[0].name == "a.weight" ? params[1] : params[0];
  CHECK(a.state.nested);
  CHECK(a.state.dtype == "float16");
  CHECK(a.state.shape == std::vector<std::int64_t>{10, 100});
  CHECK(a.numel == 1000);
  CHECK(!b.state.nested);
  CHECK(b.state.quant_type == NF4_QUANT_FP4);
  CHECK(a.companion_names().size() == 5);
  CHECK(b.companion_names().size() == 3);
  for (nf4_dtype d : test::kDTypes) {
    CHECK(oracle(io::describe(f, a, d, nullptr, 0)) == oracle(w.nested.describe(d, nullptr, 0)));
    CHECK(oracle(io::describe(b, d, nullptr, 0)) == oracle(w.flat.describe(d, nullptr, 0)));
  }
}

// A mapping of a file that another process truncates is SIGBUS on access; the tools read with
// pread, and finding and validating the parameters must not map the files either.
TEST_CASE("finding and validating quantized parameters maps no file (single file and shards)") {
  ScratchDir dir;
  Weights w;
  std::deque<std::string> keep;
  const std::string single = dir / "ck.safetensors";
  io::write_safetensors(single, checkpoint_tensors(w, keep), {{"format", "pt"}});
  const std::string sharded = dir / "sharded";
  test::write_sharded_golden(sharded, 12, /*with_expected=*/false);

  const io::SafetensorsFile f(single);
  CHECK(io::find_quantized_params(f).size() == 2);
  CHECK(!test::maps_file(::getpid(), single));
  const io::Checkpoint ck(sharded);
  CHECK(io::find_quantized_params(ck).size() == 12);
  for (std::size_t i = 0; i < ck.shard_count(); ++i) {
    CAPTURE(ck.shard(i).path());
    CHECK(!test::maps_file(::getpid(), ck.shard(i).path()));
  }
}

TEST_CASE("tables stored at misaligned offsets dequantize identically (no misaligned float reads)") {
  ScratchDir dir;
  Weights w;
  std::deque<std::string> keep;
  io::write_safetensors(dir / "ck.safetensors", checkpoint_tensors(w, keep), {});
  misalign(dir / "ck.safetensors");
  io::SafetensorsFile f(dir / "ck.safetensors");
  const auto params = io::find_quantized_params(f);
  REQUIRE(params.size() == 2);
  bool any_misaligned = false;
  for (const auto& p : params) {
    any_misaligned |= reinterpret_cast<std::uintptr_t>(f.data(*p.quant_map)) % 4 != 0;
    const nf4_tensor t = io::describe(p, NF4_DTYPE_F32, nullptr, 0);
    CHECK(reinterpret_cast<std::uintptr_t>(t.quant_map) % 4 == 0);
    if (!t.nested) CHECK(reinterpret_cast<std::uintptr_t>(t.absmax) % 4 == 0);
    if (t.nested) CHECK(reinterpret_cast<std::uintptr_t>(t.nested_absmax) % 4 == 0);
    if (t.nested) CHECK(reinterpret_cast<std::uintptr_t>(t.nested_code) % 4 == 0);
    const auto& src = p.name == "a.weight" ? w.nested : w.flat;
    for (nf4_dtype d : test::kDTypes) CHECK(oracle(io::describe(p, d, nullptr, 0)) == oracle(src.describe(d, nullptr, 0)));
  }
  CHECK(any_misaligned);
}

TEST_CASE("quant states that disagree with their tensors are NF4_ERR_FORMAT naming the parameter") {
  ScratchDir dir;
  Weights w;
  const auto state = [&](auto&& edit) {
    nlohmann::json j = test::quant_state_json(w.nested, {10, 100});
    edit(j);
    return j.dump();
  };
  struct Case {
    const char* what;
    std::string state;
    const char* message;
  };
  const Case cases[] = {
      {"shape larger than the packed bytes", state([](auto& j) { j["shape"] = {100, 100}; }), "packed"},
      {"shape smaller than the packed bytes", state([](auto& j) { j["shape"] = {10, 10}; }), "packed"},
      {"blocksize disagreeing with absmax", state([](auto& j) { j["blocksize"] = 128; }), "absmax"},
      {"blocksize not a power of two", state([](auto& j) { j["blocksize"] = 48; }), "power of two"},
      {"blocksize out of range", state([](auto& j) { j["blocksize"] = 8192; }), "blocksize"},
      {"nested blocksize disagreeing", state([](auto& j) { j["nested_blocksize"] = 8; }), "nested"},
      {"nested offset missing", state([](auto& j) { j.erase("nested_offset"); }), "nested_offset"},
      {"quant type unknown", state([](auto& j) { j["quant_type"] = "int4"; }), "is not nf4 or fp4"},
      {"quant type disagreeing with the key", state([](auto& j) { j["quant_type"] = "fp4"; }), "disagrees with the key"},
      {"shape missing", state([](auto& j) { j.erase("shape"); }), "shape"},
      {"shape with a negative entry", state([](auto& j) { j["shape"] = {-10, 100}; }), "shape"},
      {"shape with zero elements", state([](auto& j) { j["shape"] = {0, 100}; }), "numel"},
      {"JSON garbage", "{\"quant_type\": ", "not a JSON object"},
      {"not an object", "[1]", "not a JSON object"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    std::vector<io::TensorData> ts;
    std::deque<std::string> keep;
    test::add_param(ts, keep, "a.weight", w.nested, c.state);
    io::write_safetensors(dir / "bad.safetensors", ts, {});
    const auto err = params_error(dir / "bad.safetensors");
    const nf4_status status = err.first;
    const std::string& message = err.second;
    CHECK(status == NF4_ERR_FORMAT);
    CHECK_MESSAGE(contains(message, "a.weight"), message);
    CHECK_MESSAGE(contains(message, c.message), message);
  }
}

TEST_CASE("missing companion tensors and wrong companion dtypes are NF4_ERR_FORMAT") {
  ScratchDir dir;
  Weights w;
  std::deque<std::string> keep;
  std::vector<io::TensorData> base;
  test::add_param(base, keep, "a.weight", w.nested, test::quant_state_json(w.nested, {10, 100}).dump());
  test::add_param(base, keep, "b.weight", w.flat, test::quant_state_json(w.flat, {7, 111}).dump());
  for (const char* name : {"a.weight", "a.weight.absmax", "a.weight.quant_map", "a.weight.nested_absmax", "a.weight.nested_quant_map",
                           "b.weight.absmax", "b.weight.quant_map"}) {
    CAPTURE(name);
    std::vector<io::TensorData> ts;
    for (const auto& t : base)
      if (t.spec.name != name) ts.push_back(t);
    io::write_safetensors(dir / "bad.safetensors", ts, {});
    const auto err = params_error(dir / "bad.safetensors");
    const nf4_status status = err.first;
    const std::string& message = err.second;
    CHECK(status == NF4_ERR_FORMAT);
    CHECK_MESSAGE(contains(message, std::string("missing tensor '") + name + "'"), message);
  }
  // Same bytes, other dtype (sizes kept consistent so only the dtype is wrong).
  struct Retype {
    const char* name;
    io::DType dtype;
    std::vector<std::int64_t> shape;
  };
  const Retype retypes[] = {
      {"a.weight", io::DType::I8, {500, 1}},
      {"a.weight.absmax", io::DType::I8, {16}},
      {"a.weight.quant_map", io::DType::I32, {16}},
      {"a.weight.nested_quant_map", io::DType::F16, {512}},
      {"b.weight.absmax", io::DType::U8, {100}},
      {"b.weight.quant_map", io::DType::BF16, {32}},
      {"a.weight.quant_state.bitsandbytes__nf4", io::DType::I8, {}},
  };
  for (const Retype& r : retypes) {
    CAPTURE(r.name);
    std::vector<io::TensorData> ts = base;
    for (auto& t : ts)
      if (t.spec.name == r.name) {
        t.spec.dtype = r.dtype;
        t.spec.shape = r.shape.empty() ? std::vector<std::int64_t>{t.spec.bytes()} : r.shape;
      }
    io::write_safetensors(dir / "bad.safetensors", ts, {});
    const auto err = params_error(dir / "bad.safetensors");
    const nf4_status status = err.first;
    const std::string& message = err.second;
    CHECK(status == NF4_ERR_FORMAT);
    CHECK_MESSAGE(contains(message, "expected"), message);
  }
  // Two quant states for one parameter.
  std::vector<io::TensorData> ts = base;
  const std::string fp4_state = test::quant_state_json(w.flat, {10, 100}).dump();
  ts.push_back({{"a.weight.quant_state.bitsandbytes__fp4", io::DType::U8, {static_cast<std::int64_t>(fp4_state.size())}},
                fp4_state.data()});
  io::write_safetensors(dir / "bad.safetensors", ts, {});
  CHECK(params_error(dir / "bad.safetensors").first == NF4_ERR_FORMAT);
}

TEST_CASE("the golden file truncated mid-tensor fails cleanly") {
  ScratchDir dir;
  const auto bytes = test::read_bytes(test::data_path("golden.safetensors"));
  for (std::size_t cut : {bytes.size() / 2, bytes.size() - 1, std::size_t{4096}}) {
    test::write_bytes(dir / "cut.safetensors", std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(cut)));
    CHECK(params_error(dir / "cut.safetensors").first == NF4_ERR_FORMAT);
    CHECK_THROWS_AS(io::Checkpoint(dir / "cut.safetensors"), Error);
  }
}

TEST_CASE("sharded checkpoint: companions in other shards, opened by directory or index") {
  ScratchDir dir;
  Weights w;
  std::deque<std::string> keep;
  const auto all = checkpoint_tensors(w, keep);
  // Shard 1: a's weight, b's quant map and state, the norm. Shard 2: everything else.
  std::vector<io::TensorData> s1, s2;
  io::ShardIndex index;
  index.metadata["total_size"] = 0;
  for (const auto& t : all) {
    const bool first = t.spec.name == "a.weight" || t.spec.name.rfind("b.weight.q", 0) == 0 || t.spec.name == "norm.weight";
    (first ? s1 : s2).push_back(t);
    index.weight_map[t.spec.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  io::write_safetensors(dir / "model-00001-of-00002.safetensors", s1, {{"format", "pt"}});
  io::write_safetensors(dir / "model-00002-of-00002.safetensors", s2, {{"format", "pt"}});
  test::write_bytes(dir / io::kIndexFileName, [&] {
    const std::string s = io::index_json(index);
    return std::vector<std::uint8_t>(s.begin(), s.end());
  }());

  for (const std::string& path : {dir.path(), dir / io::kIndexFileName}) {
    CAPTURE(path);
    io::Checkpoint ck(path);
    CHECK(ck.sharded());
    CHECK(ck.shard_count() == 2);
    CHECK(ck.tensor_count() == all.size());
    CHECK(ck.find("norm.weight"));
    CHECK(!ck.find("nope"));
    const auto params = io::find_quantized_params(ck);
    REQUIRE(params.size() == 2);
    for (const auto& p : params) {
      CHECK((p.files.weight != p.files.absmax || p.files.weight != p.files.quant_map));  // split across shards
      const auto& src = p.name == "a.weight" ? w.nested : w.flat;
      CHECK(oracle(io::describe(p, NF4_DTYPE_BF16, nullptr, 0)) == oracle(src.describe(NF4_DTYPE_BF16, nullptr, 0)));
    }
  }

  SUBCASE("index and shards must agree") {
    const auto write_index = [&](const io::ShardIndex& idx) {
      const std::string s = io::index_json(idx);
      test::write_bytes(dir / io::kIndexFileName, std::vector<std::uint8_t>(s.begin(), s.end()));
    };
    io::ShardIndex bad = index;
    bad.weight_map["norm.weight"] = "model-00002-of-00002.safetensors";  // wrong shard
    write_index(bad);
    CHECK_THROWS_AS(io::Checkpoint(dir.path()), Error);
    bad = index;
    bad.weight_map.erase("norm.weight");  // unlisted tensor
    write_index(bad);
    CHECK_THROWS_AS(io::Checkpoint(dir.path()), Error);
    bad = index;
    bad.weight_map["ghost"] = "model-00001-of-00002.safetensors";  // listed but absent
    write_index(bad);
    CHECK_THROWS_AS(io::Checkpoint(dir.path()), Error);
    bad = index;
    bad.weight_map["ghost"] = "model-00003-of-00002.safetensors";  // missing shard file
    write_index(bad);
    try {
      io::Checkpoint ck(dir.path());
      FAIL("opened");
    } catch (const Error& e) {
      CHECK(e.status() == NF4_ERR_IO);
      CHECK(contains(e.what(), "model-00003-of-00002.safetensors"));
    }
  }
  SUBCASE("a tensor in two shards") {
    io::write_safetensors(dir / "model-00002-of-00002.safetensors", [&] {
      auto v = s2;
      v.push_back({{"norm.weight", io::DType::BF16, {10}}, w.norm.data()});
      return v;
    }(), {});
    CHECK_THROWS_AS(io::Checkpoint(dir.path()), Error);
  }
  SUBCASE("several files and no index") {
    std::filesystem::remove(dir / io::kIndexFileName);
    CHECK_THROWS_AS(io::Checkpoint(dir.path()), Error);
    std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
    io::Checkpoint single(dir.path());  // exactly one file: opened as a single checkpoint
    CHECK(!single.sharded());
    CHECK(single.shard_count() == 1);
  }
}

TEST_CASE("slices of a tensor dequantize to the matching part of the whole") {
  for (bool nested : {true, false}) {
    const std::int64_t n = 3 * 64 * 256 + 1001;
    const auto w = test::random_weight(n, NF4_QUANT_NF4, 64, nested, 7);
    const nf4_tensor full = w.describe(NF4_DTYPE_BF16, nullptr, 0);
    const auto whole = oracle(full);
    const std::int64_t g = io::slice_granularity(full);
    CHECK(g == (nested ? 64 * 256 : 64));
    for (std::int64_t piece : {g, 2 * g, n}) {
      std::vector<std::uint8_t> joined;
      for (std::int64_t first = 0; first < n; first += piece) {
        const auto part = oracle(io::slice(full, first, std::min(piece, n - first)));
        joined.insert(joined.end(), part.begin(), part.end());
      }
      CHECK(joined == whole);
    }
    CHECK_THROWS_AS(io::slice(full, g / 2, 10), Error);
    CHECK_THROWS_AS(io::slice(full, 0, n + 1), Error);
    CHECK_THROWS_AS(io::slice(full, 0, 0), Error);
  }
}

TEST_CASE("expected tensor names and dtype mappings") {
  CHECK(io::expected_tensor_name("c000.weight", NF4_DTYPE_F16) == "c000.expected.float16");
  CHECK(io::expected_tensor_name("m.layers.0.up.weight", NF4_DTYPE_BF16) == "m.layers.0.up.expected.bfloat16");
  CHECK(io::expected_tensor_name("odd", NF4_DTYPE_F32) == "odd.expected.float32");
  for (nf4_dtype d : test::kDTypes) CHECK(io::to_output_dtype(io::to_safetensors_dtype(d)) == d);
  CHECK(!io::to_output_dtype(io::DType::U8));
}

TEST_CASE("a tensor used by two quantized parameters is refused, naming both (no parameter vanishes)") {
  ScratchDir dir;
  Weights w;
  std::vector<io::TensorData> ts;
  std::deque<std::string> keep;
  test::add_param(ts, keep, "a.weight", w.nested, test::quant_state_json(w.nested, {10, 100}).dump());
  // A second parameter whose packed weight is a.weight's absmax (16 bytes: 32 codes).
  REQUIRE(w.nested.absmax_u8.size() == 16);
  const std::vector<float> absmax = {1.0f};
  const auto qmap = cpu::saved_quant_map(NF4_QUANT_NF4);
  ts.push_back({{"a.weight.absmax.absmax", io::DType::F32, {1}}, absmax.data()});
  ts.push_back({{"a.weight.absmax.quant_map", io::DType::F32, {16}}, qmap.data()});
  keep.push_back(R"({"quant_type": "nf4", "blocksize": 32, "dtype": "bfloat16", "shape": [32]})");
  ts.push_back({{"a.weight.absmax.quant_state.bitsandbytes__nf4", io::DType::U8, {static_cast<std::int64_t>(keep.back().size())}},
                keep.back().data()});
  io::write_safetensors(dir / "shared.safetensors", ts, {});
  const auto err = params_error(dir / "shared.safetensors");
  CHECK(err.first == NF4_ERR_FORMAT);
  CHECK_MESSAGE(contains(err.second, "tensor 'a.weight.absmax' is both the absmax of quantized parameter 'a.weight' and the weight of "
                                     "quantized parameter 'a.weight.absmax'"),
                err.second);
}

TEST_CASE("a quant state too large to be one is refused before it is read") {
  ScratchDir dir;
  Weights w;
  std::vector<io::TensorData> ts;
  std::deque<std::string> keep;
  std::string state = test::quant_state_json(w.nested, {10, 100}).dump();
  state.append(static_cast<std::size_t>(io::kMaxQuantStateBytes), ' ');
  test::add_param(ts, keep, "a.weight", w.nested, state);
  io::write_safetensors(dir / "big-state.safetensors", ts, {});
  const auto err = params_error(dir / "big-state.safetensors");
  CHECK(err.first == NF4_ERR_FORMAT);
  CHECK_MESSAGE(contains(err.second, "more than the"), err.second);
}
