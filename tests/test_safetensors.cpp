// SPDX-License-Identifier: MIT
// The safetensors reader on corrupt and truncated files (errors with useful messages, never a
// crash), its name index and aligned F32 access; the streaming writer; the sharded index; headers
// of 200k tensors and keys written and read in linear time.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/checkpoint/output.h"
#include "tools/checkpoint/safetensors.h"
#include "tools/checkpoint/sharded.h"
#include "tests/support/io.h"

using namespace nf4;
using nf4::test::contains;
using nf4::test::open_error;
using nf4::test::ScratchDir;

TEST_CASE("safetensors reader rejects corrupt headers with NF4_ERR_FORMAT and a message naming the problem") {
  ScratchDir dir;
  struct Case {
    const char* what;
    std::string header;
    std::size_t data_bytes;
    std::int64_t declared;  // header length field, -1: the true length
    const char* message;    // part of the expected message
  };
  const std::string ok_entry = R"("t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]})";
  const Case cases[] = {
      {"header length past the end", "{" + ok_entry + "}", 16, 1000, "not a safetensors file"},
      {"header length far past the end", "{}", 0, std::int64_t{1} << 62, "not a safetensors file"},
      {"JSON garbage", "{\"t\": {\"dtype\": ", 16, -1, "not valid JSON"},
      {"binary garbage", std::string("\x01\xff\xfe{", 4), 16, -1, "not a safetensors file"},
      {"non-object header", "[1, 2, 3]", 16, -1, "not a safetensors file"},
      {"non-object header after whitespace", " [1, 2, 3]", 16, -1, "not a JSON object"},
      {"entry not an object", R"({"t": 5})", 16, -1, "entry is not an object"},
      {"unknown dtype", R"({"t": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}})", 16, -1, "unknown dtype 'F33'"},
      {"dtype not a string", R"({"t": {"dtype": 4, "shape": [4], "data_offsets": [0, 16]}})", 16, -1, "dtype"},
      {"missing shape", R"({"t": {"dtype": "F32", "data_offsets": [0, 16]}})", 16, -1, "missing shape"},
      {"negative shape entry", R"({"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", 16, -1, "non-negative"},
      {"fractional shape entry", R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 16]}})", 16, -1, "non-negative"},
      {"shape overflowing int64", R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 16]}})",
       16, -1, "shape larger than the file"},
      {"size disagreeing with the shape", R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", 16, -1,
       "expected 12"},
      {"size disagreeing with the dtype", R"({"t": {"dtype": "F16", "shape": [4], "data_offsets": [0, 16]}})", 16, -1,
       "expected 8"},
      {"offsets out of range", R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 16, -1,
       "outside the data section"},
      {"offsets reversed", R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [9, 8]}})", 16, -1, "outside the data section"},
      {"offsets negative", R"({"t": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}})", 16, -1, "non-negative"},
      {"offsets not a pair", R"({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]}})", 16, -1, "[begin, end]"},
      {"overlapping offsets",
       R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
       16, -1, "overlap"},
      {"metadata not an object", R"({"__metadata__": [1], "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})", 16, -1,
       "__metadata__"},
      {"metadata value not a string", R"({"__metadata__": {"format": 1}})", 16, -1, "__metadata__['format']"},
      {"truncated mid-tensor", "{" + ok_entry + "}", 9, -1, "outside the data section"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string path = dir / "bad.safetensors";
    test::write_raw(path, c.header, std::vector<std::uint8_t>(c.data_bytes, 0), c.declared);
    const auto err = open_error(path);
    const nf4_status status = err.first;
    const std::string& message = err.second;
    CHECK(status == NF4_ERR_FORMAT);
    CHECK_MESSAGE(contains(message, c.message), message);
    CHECK_MESSAGE(contains(message, path), message);
  }
}

TEST_CASE("safetensors reader: files too short, missing, or not regular files") {
  ScratchDir dir;
  for (std::size_t n : {0, 1, 7}) {
    test::write_bytes(dir / "short", std::vector<std::uint8_t>(n, 0));
    const auto err = open_error(dir / "short");
    const nf4_status status = err.first;
    const std::string& message = err.second;
    CHECK(status == NF4_ERR_FORMAT);
    CHECK(contains(message, "too short"));
  }
  CHECK(open_error(dir / "missing").first == NF4_ERR_IO);
  CHECK(open_error(dir.path()).first == NF4_ERR_IO);
  // An empty header (no tensors at all) is a valid file.
  test::write_raw(dir / "empty.safetensors", "{}", {});
  io::SafetensorsFile f(dir / "empty.safetensors");
  CHECK(f.tensors().empty());
  CHECK(f.find("x") == nullptr);
}

TEST_CASE("safetensors reader: every prefix of a valid file fails cleanly") {
  ScratchDir dir;
  std::vector<float> a(5, 1.5f);
  std::vector<std::uint8_t> b(7, 3);
  io::write_safetensors(dir / "ok.safetensors", {{{"a", io::DType::F32, {5}}, a.data()}, {{"b", io::DType::U8, {7}}, b.data()}},
                        {{"format", "pt"}});
  const auto bytes = test::read_bytes(dir / "ok.safetensors");
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    test::write_bytes(dir / "cut.safetensors", std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(n)));
    const auto err = open_error(dir / "cut.safetensors");
    const nf4_status status = err.first;
    const std::string& message = err.second;
    CHECK_MESSAGE(status == NF4_ERR_FORMAT, n << " bytes: " << message);
  }
  CHECK_NOTHROW(io::SafetensorsFile(dir / "ok.safetensors"));
}

TEST_CASE("safetensors name index finds every tensor and nothing else") {
  ScratchDir dir;
  std::vector<io::TensorData> ts;
  std::vector<std::uint8_t> data(300);
  std::iota(data.begin(), data.end(), 0);
  for (int i = 0; i < 300; ++i) {
    const int k = (i * 7919) % 300;  // scrambled name order relative to data order
    ts.push_back({{"layer." + std::to_string(k) + ".w", io::DType::U8, {1}}, &data[static_cast<std::size_t>(k)]});
  }
  io::write_safetensors(dir / "many.safetensors", ts, {});
  io::SafetensorsFile f(dir / "many.safetensors");
  REQUIRE(f.tensors().size() == 300);
  for (int k = 0; k < 300; ++k) {
    const io::TensorInfo* t = f.find("layer." + std::to_string(k) + ".w");
    REQUIRE(t != nullptr);
    CHECK(t->name == "layer." + std::to_string(k) + ".w");
    CHECK(*f.data(*t) == static_cast<std::uint8_t>(k));
  }
  CHECK(f.find("layer.300.w") == nullptr);
  CHECK(f.find("layer.1") == nullptr);
  CHECK(f.find("") == nullptr);
  // A moved file keeps its index.
  io::SafetensorsFile g(std::move(f));
  CHECK(g.find("layer.17.w") != nullptr);
}

TEST_CASE("F32 tensors at misaligned offsets are handed out as aligned copies") {
  ScratchDir dir;
  std::vector<float> values = {1.0f, -2.5f, 3.25f, 1e-30f, 7.0f};
  // Header of 8k+1 bytes: the data section, and the F32 tensor at offset 0, start at 4k+1.
  std::string header = R"({"x": {"dtype": "F32", "shape": [5], "data_offsets": [0, 20]}})";
  while ((header.size() % 8) != 1) header += ' ';
  std::vector<std::uint8_t> data(20);
  std::memcpy(data.data(), values.data(), 20);
  test::write_raw(dir / "mis.safetensors", header, data);
  io::SafetensorsFile f(dir / "mis.safetensors");
  const io::TensorInfo* t = f.find("x");
  REQUIRE(t != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(f.data(*t)) % alignof(float) != 0);
  const float* p = f.f32(*t);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0);
  for (int i = 0; i < 5; ++i) CHECK(p[i] == values[static_cast<std::size_t>(i)]);
  CHECK(f.f32(*t) == p);  // copied once
  // Not F32: an error, not a reinterpretation.
  std::vector<std::uint8_t> u(4);
  io::write_safetensors(dir / "u8.safetensors", {{{"u", io::DType::U8, {4}}, u.data()}}, {});
  io::SafetensorsFile g(dir / "u8.safetensors");
  CHECK_THROWS_AS(g.f32(*g.find("u")), Error);
}

TEST_CASE("safetensors writer round trip: dtypes, shapes, metadata, aligned offsets, no holes") {
  ScratchDir dir;
  std::vector<std::uint8_t> u8(13);
  std::iota(u8.begin(), u8.end(), 1);
  std::vector<float> f32(6);
  std::iota(f32.begin(), f32.end(), 0.5f);
  std::vector<std::uint16_t> bf16(3, 0x3f80), f16(5, 0x3c00);
  std::vector<std::int64_t> i64 = {-1, 2, 1ll << 40};
  float scalar = 42.0f;
  const std::vector<io::TensorData> in = {
      {{"odd.u8", io::DType::U8, {13}}, u8.data()},     {{"w.bf16", io::DType::BF16, {3, 1}}, bf16.data()},
      {{"w.f32", io::DType::F32, {2, 3}}, f32.data()},  {{"empty", io::DType::F32, {0, 4}}, nullptr},
      {{"h.f16", io::DType::F16, {5}}, f16.data()},     {{"ids", io::DType::I64, {3}}, i64.data()},
      {{"scalar", io::DType::F32, {}}, &scalar},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "quoted \" and unicode \xc3\xa9"}};
  const std::string path = dir / "rt.safetensors";

  SUBCASE("written whole") { io::write_safetensors(path, in, meta); }
  SUBCASE("streamed in small pieces") {
    io::AtomicFile file(path);
    std::vector<io::TensorSpec> specs;
    for (const auto& t : in) specs.push_back(t.spec);
    io::SafetensorsWriter w(file.file(), specs, meta);
    for (const auto& spec : w.order()) {
      const auto it = std::find_if(in.begin(), in.end(), [&](const io::TensorData& t) { return t.spec.name == spec.name; });
      const auto* p = static_cast<const std::uint8_t*>(it->data);
      for (std::int64_t off = 0; off < spec.bytes(); off += 3) w.write(p + off, std::min<std::int64_t>(3, spec.bytes() - off));
    }
    CHECK(w.current() == nullptr);
    w.finish();
    file.commit();
  }

  io::SafetensorsFile f(path);
  CHECK(f.metadata() == meta);
  REQUIRE(f.tensors().size() == in.size());
  const auto bytes = test::read_bytes(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  CHECK(n % 8 == 0);
  std::int64_t expect_begin = 0;
  for (const io::TensorInfo& t : f.tensors()) {  // data order
    CAPTURE(t.name);
    CHECK(t.begin == expect_begin);  // contiguous
    expect_begin = t.end;
    CHECK(t.begin % static_cast<std::int64_t>(io::dtype_size(t.dtype)) == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(f.data(t)) % io::dtype_size(t.dtype) == 0);
  }
  CHECK(8 + static_cast<std::int64_t>(n) + expect_begin == static_cast<std::int64_t>(bytes.size()));
  for (const auto& t : in) {
    CAPTURE(t.spec.name);
    const io::TensorInfo* r = f.find(t.spec.name);
    REQUIRE(r != nullptr);
    CHECK(r->dtype == t.spec.dtype);
    CHECK(r->shape == t.spec.shape);
    REQUIRE(r->bytes() == t.spec.bytes());
    if (r->bytes()) CHECK(std::memcmp(f.data(*r), t.data, static_cast<std::size_t>(r->bytes())) == 0);
  }
  // Largest element size first: I64, F32 ..., then 2-byte, then U8.
  CHECK(f.tensors().front().dtype == io::DType::I64);
  CHECK(f.tensors().back().name == "odd.u8");
}

TEST_CASE("safetensors writer refuses bad tensor lists and bad write sequences") {
  ScratchDir dir;
  io::AtomicFile file(dir / "x.safetensors");
  using S = io::TensorSpec;
  CHECK_THROWS_AS(io::SafetensorsWriter(file.file(), {S{"a", io::DType::U8, {1}}, S{"a", io::DType::F32, {1}}}, {}), Error);
  CHECK_THROWS_AS(io::SafetensorsWriter(file.file(), {S{"__metadata__", io::DType::U8, {1}}}, {}), Error);
  CHECK_THROWS_AS(io::SafetensorsWriter(file.file(), {S{"", io::DType::U8, {1}}}, {}), Error);
  CHECK_THROWS_AS(io::SafetensorsWriter(file.file(), {S{"neg", io::DType::U8, {-1}}}, {}), Error);
  CHECK_THROWS_AS(io::SafetensorsWriter(file.file(), {S{"big", io::DType::U8, {1ll << 40, 1ll << 40}}}, {}), Error);

  io::AtomicFile file2(dir / "y.safetensors");
  io::SafetensorsWriter w(file2.file(), {S{"a", io::DType::U8, {4}}, S{"b", io::DType::U8, {2}}}, {});
  const std::uint8_t buf[8] = {};
  CHECK_THROWS_AS(w.write(buf, 5), Error);  // would spill into the next tensor
  w.write(buf, 4);
  CHECK_THROWS_AS(w.finish(), Error);  // "b" missing
  w.write(buf, 2);
  CHECK_THROWS_AS(w.write(buf, 1), Error);  // past the end
  CHECK_NOTHROW(w.finish());
}

TEST_CASE("sharded index: parse, reject bad ones, round trip") {
  const char* bad[] = {
      "not json",
      "[]",
      R"({"metadata": {}})",
      R"({"weight_map": []})",
      R"({"weight_map": {}})",
      R"({"metadata": 3, "weight_map": {"a": "x.safetensors"}})",
      R"({"weight_map": {"a": 1}})",
      R"({"weight_map": {"a": "../x.safetensors"}})",
      R"({"weight_map": {"a": "sub/x.safetensors"}})",
      R"({"weight_map": {"a": ".."}})",
      R"({"weight_map": {"a": ""}})",
  };
  for (const char* text : bad) {
    CAPTURE(text);
    try {
      io::parse_index(text);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.status() == NF4_ERR_FORMAT);
    }
  }
  const io::ShardIndex idx =
      io::parse_index(R"({"metadata": {"total_size": 1234, "x": "y"}, "weight_map": {"b": "m-2.safetensors", "a": "m-1.safetensors",
                          "c": "m-1.safetensors"}})");
  CHECK(idx.metadata["total_size"] == 1234);
  CHECK(idx.shard_names() == std::vector<std::string>{"m-1.safetensors", "m-2.safetensors"});
  const io::ShardIndex back = io::parse_index(io::index_json(idx));
  CHECK(back.metadata == idx.metadata);
  CHECK(back.weight_map == idx.weight_map);
  ScratchDir dir;
  CHECK_THROWS_AS(io::read_index(dir / "missing.json"), Error);
}

namespace {

// CPU seconds of the calling thread: unlike wall time, not stretched by other processes.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Writes a header of n tensors and n metadata keys, reads it back, and returns the CPU seconds.
double write_and_read_header(const std::string& path, int n) {
  std::vector<io::TensorSpec> specs;
  std::map<std::string, std::string> meta;
  for (int i = 0; i < n; ++i) {
    specs.push_back({"model.layers." + std::to_string(i) + ".weight", io::DType::U8, {1}});
    meta["key" + std::to_string(i)] = "value";
  }
  const double t0 = thread_cpu_seconds();
  {
    io::AtomicFile f(path);
    io::SafetensorsWriter w(f.file(), specs, meta);
    const std::uint8_t byte = 1;
    for (int i = 0; i < n; ++i) w.write(&byte, 1);
    w.finish();
    f.commit();
  }
  const io::SafetensorsFile f(path);
  const double seconds = thread_cpu_seconds() - t0;
  CHECK(f.tensors().size() == static_cast<std::size_t>(n));
  CHECK(f.metadata().size() == static_cast<std::size_t>(n));
  CHECK(f.find("model.layers." + std::to_string(n - 1) + ".weight") != nullptr);
  return seconds;
}

}  // namespace

// Growth, not speed: 8 times the tensors and keys must cost about 8 times the CPU time (n log n at
// worst), where quadratic header building cost 64 times (and minutes at 200k).
TEST_CASE("header writing and reading are linear: 200k tensors and 200k metadata keys cost 8 times 25k") {
  ScratchDir dir;
  const double small = write_and_read_header(dir / "small.safetensors", 25000);
  const double large = write_and_read_header(dir / "large.safetensors", 200000);
  MESSAGE("CPU time: 25k tensors + keys " << small << " s, 200k " << large << " s, ratio " << large / small);
  CHECK(large / small < 24);
}
