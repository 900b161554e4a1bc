// SPDX-License-Identifier: MIT
// The safetensors reader on corrupt and truncated files (errors with useful messages, never a
// crash), its name index and aligned F32 access; the streaming writer; atomic outputs; the
// sharded index; hostile inputs (deep nesting, repeated keys, FIFOs, links out of the input
// directory, huge headers) and the output lock and leftovers of killed runs.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <functional>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/io/file_open.h"
#include "core/io/json_limits.h"
#include "core/io/model_dir.h"
#include "core/io/output.h"
#include "core/io/safetensors.h"
#include "core/io/sharded.h"
#include "tests/support/io.h"

using namespace nf4;
using nf4::test::ScratchDir;

namespace {

// Opens `path` expecting failure; returns the status and message.
std::pair<nf4_status, std::string> open_error(const std::string& path) {
  try {
    io::SafetensorsFile f(path);
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {NF4_OK, ""};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

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
      {"header length past the end", "{" + ok_entry + "}", 16, 1000, "runs past the end"},
      {"header length far past the end", "{}", 0, std::int64_t{1} << 62, "runs past the end"},
      {"JSON garbage", "{\"t\": {\"dtype\": ", 16, -1, "not valid JSON"},
      {"binary garbage", std::string("\x01\xff\xfe{", 4), 16, -1, "not valid JSON"},
      {"non-object header", "[1, 2, 3]", 16, -1, "not a JSON object"},
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

TEST_CASE("a full disk is reported as 'No space left on device' naming the file") {
  if (::access("/dev/full", W_OK) != 0) {
    MESSAGE("skipped: /dev/full is not writable here");
    return;
  }
  io::OutputFile f = io::OutputFile::create("/dev/full", /*exclusive=*/false);
  std::vector<std::uint8_t> data(1 << 16);
  try {
    f.write(data.data(), data.size());
    FAIL("write to /dev/full succeeded");
  } catch (const Error& e) {
    CHECK(e.status() == NF4_ERR_IO);
    CHECK_MESSAGE(contains(e.what(), "No space left on device"), e.what());
    CHECK_MESSAGE(contains(e.what(), "/dev/full"), e.what());
  }
}

TEST_CASE("atomic file: visible only after commit, temporary removed otherwise, mode follows the umask") {
  ScratchDir dir;
  const std::string target = dir / "out.bin";
  {
    io::AtomicFile f(target);
    f.file().write("abc", 3);
    CHECK(test::read_bytes(target).empty());
    CHECK(dir.entries().size() == 1);  // only the temporary
    CHECK(contains(dir.entries()[0], ".nf4-tmp-"));
  }
  CHECK(dir.entries().empty());
  {
    io::AtomicFile f(target);
    f.file().write("abc", 3);
    f.commit();
  }
  CHECK(dir.entries() == std::vector<std::string>{"out.bin"});
  CHECK(test::read_bytes(target) == std::vector<std::uint8_t>{'a', 'b', 'c'});
  struct stat st {};
  REQUIRE(::stat(target.c_str(), &st) == 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  CHECK((st.st_mode & 0777) == (0666 & ~mask));
  // Replacing an existing file.
  {
    io::AtomicFile f(target);
    f.file().write("xy", 2);
    f.commit();
  }
  CHECK(test::read_bytes(target) == std::vector<std::uint8_t>{'x', 'y'});
  CHECK_THROWS_AS(io::AtomicFile(dir / "no-such-dir/out.bin"), Error);
}

TEST_CASE("temporary directory: renamed into place, swapped with an existing one as a whole, or removed") {
  ScratchDir dir;
  const std::string out = dir / "out";
  {
    io::TempDir t(out);
    io::OutputFile a = t.create("a.txt");
    a.write("1", 1);
    a.close();
    CHECK_THROWS_AS(t.create("../evil"), Error);
  }
  CHECK(dir.entries().empty());
  {
    io::TempDir t(out);
    t.create("a.txt").write("1", 1);
    t.create("index.json").write("{}", 2);
    t.commit();
  }
  CHECK(dir.entries() == std::vector<std::string>{"out"});
  CHECK(dir.entries("out") == (std::vector<std::string>{"a.txt", "index.json"}));
  test::write_bytes(out + "/old.txt", {'k'});
  struct stat before {};
  REQUIRE(::stat(out.c_str(), &before) == 0);
  {
    io::TempDir t(out);
    t.create("a.txt").write("2", 1);
    // Until the commit, OUT is entirely the old directory.
    CHECK(dir.entries("out") == (std::vector<std::string>{"a.txt", "index.json", "old.txt"}));
    t.commit();
  }
  // Then entirely the new one (another directory, not files moved into the old), the old removed.
  CHECK(dir.entries() == std::vector<std::string>{"out"});
  CHECK(dir.entries("out") == (std::vector<std::string>{"a.txt"}));
  CHECK(test::read_bytes(out + "/a.txt") == std::vector<std::uint8_t>{'2'});
  struct stat after {};
  REQUIRE(::stat(out.c_str(), &after) == 0);
  CHECK(after.st_ino != before.st_ino);
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

// ---- hostile inputs ---------------------------------------------------------------------------

namespace {

std::string nested_json(std::size_t levels, const std::string& inner = "1") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

template <typename F>
std::pair<nf4_status, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {NF4_OK, ""};
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
  for (const auto& [what, run] : cases) {
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
  CHECK_MESSAGE(contains(err.second, "runs past the end"), err.second);
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

TEST_CASE("output lock: a second holder fails at once with a clear message; the lock file goes away") {
  ScratchDir dir;
  const std::string out = dir / "out";
  {
    io::OutputLock first(out);
    CHECK(dir.entries() == std::vector<std::string>{".out.nf4-lock"});
    const auto err = error_of([&] { io::OutputLock second(out); });
    CHECK(err.first == NF4_ERR_IO);
    CHECK_MESSAGE(contains(err.second, "another nf4 process is writing it"), err.second);
  }
  CHECK(dir.entries().empty());
  io::OutputLock again(out);  // free again
}

TEST_CASE("leftover temporaries of a dead process are removed; those of live processes are kept") {
  ScratchDir dir;
  const std::string out = dir / "out";
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int st = 0;
  ::waitpid(child, &st, 0);  // a pid that is gone
  const std::string dead_dir = ".out.nf4-tmp-" + std::to_string(child) + "-12345-0-0badf00d";
  const std::string dead_old = ".out.nf4-old-" + std::to_string(child) + "-12345-3-0badf00d";
  const std::string live = ".out.nf4-tmp-" + io::process_token() + "-7-12345678";
  const std::string other = ".other.nf4-tmp-" + std::to_string(child) + "-12345-0-0badf00d";
  for (const auto& d : {dead_dir, dead_old}) {
    std::filesystem::create_directory(dir / d);
    test::write_bytes(dir / (d + "/model.safetensors"), {1, 2, 3});
  }
  test::write_bytes(dir / live, {1});
  test::write_bytes(dir / other, {1});
  CHECK(io::remove_stale_temporaries(out) == 2);
  CHECK(dir.entries() == (std::vector<std::string>{other, live}));
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
  // A 20 KB config nested 10^4 levels does not become a 200 MB file: it is refused.
  const auto err = error_of([] { io::dense_model_config("{\"x\": " + nested_json(10000) + "}", "bfloat16"); });
  CHECK(err.first == NF4_ERR_FORMAT);
  CHECK(!error_of([] { io::dense_model_config("[1]", ""); }).second.empty());
}

TEST_CASE("carried files: regular non-weight files only; FIFOs and links out of the directory refused by name") {
  ScratchDir outside, model;
  for (const char* name : {"tokenizer.json", "README.md", "LICENSE", "generation_config.json", "chat_template.jinja", ".gitattributes"})
    test::write_bytes(model / name, {'x'});
  for (const char* name : {"model.safetensors", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                           "config.json", "consolidated.pth"})
    test::write_bytes(model / name, {'w'});
  std::filesystem::create_directory(model / "original");
  const io::InputPolicy policy{io::real_path(model.path()), false};
  CHECK(io::carried_files(model.path(), policy) ==
        (std::vector<std::string>{".gitattributes", "LICENSE", "README.md", "chat_template.jinja", "generation_config.json", "tokenizer.json"}));
  REQUIRE(::mkfifo((model / "tokenizer.model").c_str(), 0600) == 0);
  auto err = error_of([&] { io::carried_files(model.path(), policy); });
  CHECK(err.first == NF4_ERR_IO);
  CHECK_MESSAGE(contains(err.second, "tokenizer.model"), err.second);
  std::filesystem::remove(model / "tokenizer.model");
  test::write_bytes(outside / "secret", {'s'});
  std::filesystem::create_symlink(outside / "secret", model / "special_tokens_map.json");
  err = error_of([&] { io::carried_files(model.path(), policy); });
  CHECK_MESSAGE(contains(err.second, "special_tokens_map.json"), err.second);
  CHECK_MESSAGE(contains(err.second, "outside the input directory"), err.second);
  CHECK(io::carried_files(model.path(), {policy.root, true}).size() == 7);
}
