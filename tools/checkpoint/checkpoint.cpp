// SPDX-License-Identifier: MIT
#include "tools/checkpoint/checkpoint.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <set>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends/cpu/oracle.h"
#include "core/error.h"
#include "tools/checkpoint/cancel.h"
#include "tools/checkpoint/json_limits.h"
#include "tools/checkpoint/output.h"
#include "core/tensor.h"
#include "core/types.h"

namespace nf4::io {

namespace {
// A parameter's quant state is the tensor "<P>.quant_state.bitsandbytes__<quant type's name>".
constexpr std::string_view kQuantStateKey = ".quant_state.bitsandbytes__";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The quant type whose quant-state suffix ends `name`, or nullptr; *param_length is then the
// length of the parameter's name.
const QuantTypeInfo* quant_state_type(std::string_view name, std::size_t* param_length) {
  for (const QuantTypeInfo& q : kQuantTypes)
    if (ends_with(name, q.name) && ends_with(name.substr(0, name.size() - q.name.size()), kQuantStateKey)) {
      *param_length = name.size() - q.name.size() - kQuantStateKey.size();
      return &q;
    }
  return nullptr;
}

// "bitsandbytes__nf4 and bitsandbytes__fp4": the quant-state suffixes for a message.
std::string quant_state_suffixes() {
  std::string s;
  for (std::size_t i = 0; i < std::size(kQuantTypes); ++i)
    s += (i == 0 ? "" : i + 1 == std::size(kQuantTypes) ? " and " : ", ") + std::string("bitsandbytes__") + std::string(kQuantTypes[i].name);
  return s;
}

int json_int(const nlohmann::json& j, const char* key, std::int64_t lo, std::int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) fail(NF4_ERR_FORMAT, "quant state: '{}' missing or not an integer", key);
  const auto v = it->get<std::int64_t>();
  if (v < lo || v > hi) fail(NF4_ERR_FORMAT, "quant state: '{}' = {} outside [{}, {}]", key, v, lo, hi);
  return static_cast<int>(v);
}
}  // namespace

bool parse_torch_dtype(std::string_view name, nf4_dtype* out) {
  const DtypeInfo* d = find_dtype_or_alias(name);
  if (d) *out = d->dtype;
  return d != nullptr;
}

QuantState parse_quant_state(std::string_view text) {
  nlohmann::json j;
  try {
    j = parse_json_bounded(text, "text", {kMaxQuantStateBytes, 8});
  } catch (const Error& e) {
    if (e.status() != NF4_ERR_FORMAT) throw;
    fail(NF4_ERR_FORMAT, "quant state is not a JSON object ({})", e.what());
  }
  if (!j.is_object()) fail(NF4_ERR_FORMAT, "quant state is not a JSON object");
  QuantState s;
  const auto qt = j.find("quant_type");
  if (qt == j.end() || !qt->is_string()) fail(NF4_ERR_FORMAT, "quant state: 'quant_type' missing");
  const QuantTypeInfo* type = find_quant_type(std::string_view(qt->get_ref<const std::string&>()));
  if (!type)
    fail(NF4_ERR_FORMAT, "quant state: quant_type '{}' is not {}", printable(qt->get<std::string>(), 16), joined_names(kQuantTypes, ", ", " or "));
  s.quant_type = type->quant_type;
  s.blocksize = json_int(j, "blocksize", 32, 4096);
  if ((s.blocksize & (s.blocksize - 1)) != 0) fail(NF4_ERR_FORMAT, "quant state: blocksize {} is not a power of two", s.blocksize);
  const auto dt = j.find("dtype");
  if (dt != j.end()) {
    if (!dt->is_string()) fail(NF4_ERR_FORMAT, "quant state: 'dtype' is not a string");
    s.dtype = dt->get<std::string>();
  }
  const auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array() || sh->empty()) fail(NF4_ERR_FORMAT, "quant state: 'shape' missing or empty");
  std::int64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(NF4_MAX_ELEMENTS))
      fail(NF4_ERR_FORMAT, "quant state: shape entries must be non-negative integers");
    const auto v = d.get<std::int64_t>();
    if (v != 0 && numel > NF4_MAX_ELEMENTS / v) fail(NF4_ERR_FORMAT, "quant state: shape has more than 2^56 elements");
    numel *= v;
    s.shape.push_back(v);
  }
  s.nested = j.contains("nested_blocksize") || j.contains("nested_offset");
  if (s.nested) {
    s.nested_blocksize = json_int(j, "nested_blocksize", 1, 1 << 20);
    if ((s.nested_blocksize & (s.nested_blocksize - 1)) != 0)
      fail(NF4_ERR_FORMAT, "quant state: nested_blocksize {} is not a power of two", s.nested_blocksize);
    const auto off = j.find("nested_offset");
    if (off == j.end() || !off->is_number()) fail(NF4_ERR_FORMAT, "quant state: 'nested_offset' missing or not a number");
    s.nested_offset = static_cast<float>(off->get<double>());
  }
  return s;
}

std::vector<std::string> QuantizedParam::companion_names() const {
  std::vector<std::string> names;
  for (const TensorInfo* t : {absmax, quant_map, nested_absmax, nested_quant_map, quant_state})
    if (t) names.push_back(t->name);
  return names;
}

namespace {

// The nf4_tensor for a parameter without its addresses: the scalars and the stored counts.
nf4_tensor describe_counts(const QuantizedParam& p, nf4_dtype out_dtype) {
  nf4_tensor t{};
  t.quant_type = p.state.quant_type;
  t.out_dtype = out_dtype;
  t.numel = p.numel;
  t.blocksize = p.state.blocksize;
  t.nested = p.state.nested ? 1 : 0;
  t.packed_bytes = p.weight->bytes();
  t.absmax_count = p.absmax->numel();
  t.quant_map_count = p.quant_map->numel();
  if (p.state.nested) {
    t.nested_absmax_count = p.nested_absmax->numel();
    t.nested_code_count = p.nested_quant_map->numel();
    t.nested_blocksize = p.state.nested_blocksize;
    t.nested_offset = p.state.nested_offset;
  }
  return t;
}

// One parameter from its quant-state tensor; `lookup(name)` finds companions (in any shard).
template <typename Lookup>
QuantizedParam make_param(const SafetensorsFile& qs_file, const TensorInfo& qs, const QuantTypeInfo& key_type, std::size_t name_length,
                          const Lookup& lookup) {
  QuantizedParam p;
  p.name = qs.name.substr(0, name_length);
  p.quant_state = &qs;
  p.files.quant_state = &qs_file;
  try {
    if (qs.dtype != DType::U8) fail(NF4_ERR_FORMAT, "quant state tensor is {}, expected U8", dtype_name(qs.dtype));
    if (qs.bytes() > kMaxQuantStateBytes)
      fail(NF4_ERR_FORMAT, "quant state of {} bytes is more than the {} bytes accepted", qs.bytes(), kMaxQuantStateBytes);
    std::string text(static_cast<std::size_t>(qs.bytes()), '\0');
    qs_file.read(qs, 0, text.data(), qs.bytes());
    p.state = parse_quant_state(text);
    if (p.state.quant_type != key_type.quant_type) fail(NF4_ERR_FORMAT, "quant_type in the JSON disagrees with the key suffix");
    p.numel = 1;
    for (auto d : p.state.shape) p.numel *= d;
    const auto need = [&](const std::string& suffix, DType dtype, const SafetensorsFile*& file) -> const TensorInfo* {
      const TensorRef t = lookup(p.name + suffix);
      if (!t) fail(NF4_ERR_FORMAT, "missing tensor '{}{}'", printable(p.name), suffix);
      if (t->dtype != dtype) fail(NF4_ERR_FORMAT, "'{}' is {}, expected {}", printable(t->name), dtype_name(t->dtype), dtype_name(dtype));
      file = t.file;
      return t.info;
    };
    p.weight = need("", DType::U8, p.files.weight);
    p.absmax = need(".absmax", p.state.nested ? DType::U8 : DType::F32, p.files.absmax);
    p.quant_map = need(".quant_map", DType::F32, p.files.quant_map);
    if (p.state.nested) {
      p.nested_absmax = need(".nested_absmax", DType::F32, p.files.nested_absmax);
      p.nested_quant_map = need(".nested_quant_map", DType::F32, p.files.nested_quant_map);
    }
    // Counts only: validation needs no address, so nothing is mapped (a mapping of a file that
    // another process truncates is SIGBUS on access; the tools read with pread instead).
    validate_counts(describe_counts(p, NF4_DTYPE_F32), "stored weight");
  } catch (const Error& e) {
    if (e.status() == NF4_ERR_INTERRUPTED || e.status() == NF4_ERR_IO) throw;
    throw Error(NF4_ERR_FORMAT, fmt::format("{}: quantized parameter '{}': {}", qs_file.path(), printable(p.name), e.what()));
  }
  return p;
}

template <typename Lookup>
void collect_params(const SafetensorsFile& file, const Lookup& lookup, std::map<std::string, std::string>& seen,
                    std::vector<QuantizedParam>& out) {
  for (const TensorInfo& qs : file.tensors()) {
    std::size_t name_length = 0;
    const QuantTypeInfo* key_type = quant_state_type(qs.name, &name_length);
    if (!key_type) continue;
    QuantizedParam p = make_param(file, qs, *key_type, name_length, lookup);
    if (const auto [it, fresh] = seen.emplace(p.name, qs.name); !fresh)
      fail(NF4_ERR_FORMAT, "{}: quantized parameter '{}' has two quant states, '{}' and '{}'", file.path(), printable(p.name),
           printable(it->second), printable(qs.name));
    out.push_back(std::move(p));
    if ((out.size() & 1023) == 0) check_cancel();
  }
}

// Each tensor belongs to at most one parameter in one role: a tensor that is, say, one
// parameter's absmax and another one's weight would make a dense copy drop or mix one of them.
void check_no_shared_tensors(const std::vector<QuantizedParam>& params) {
  struct Use {
    std::size_t param;
    const char* role;
  };
  std::map<std::string_view, Use> owner;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const QuantizedParam& p = params[i];
    const std::pair<const TensorInfo*, const char*> roles[] = {{p.weight, "weight"},
                                                               {p.absmax, "absmax"},
                                                               {p.quant_map, "quant_map"},
                                                               {p.nested_absmax, "nested_absmax"},
                                                               {p.nested_quant_map, "nested_quant_map"},
                                                               {p.quant_state, "quant state"}};
    for (const auto& [t, role] : roles) {
      if (!t) continue;
      const auto [it, fresh] = owner.emplace(t->name, Use{i, role});
      if (!fresh)
        fail(NF4_ERR_FORMAT, "tensor '{}' is both the {} of quantized parameter '{}' and the {} of quantized parameter '{}'",
             printable(t->name), it->second.role, printable(params[it->second.param].name), role, printable(p.name));
    }
  }
}

// A U8 tensor with quant-state companions but no usable quant state (missing, or its key
// misspelled: `__NF4`, `__nf5`) would pass as a dense tensor: a "dense" copy holding 4-bit bytes,
// its absmax and quant_map beside it. Such a weight is refused, naming it.
template <typename Lookup>
void check_no_stray_quant_tensors(const SafetensorsFile& file, const Lookup& lookup,
                                  const std::set<std::string, std::less<>>& owned) {
  static constexpr std::string_view kCompanions[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"};
  constexpr std::string_view kQuantState = ".quant_state.";
  std::size_t n = 0;
  for (const TensorInfo& t : file.tensors()) {
    if ((++n & 4095) == 0) check_cancel();
    if (owned.count(t.name)) continue;
    const std::string_view name = t.name;
    if (const auto at = name.rfind(kQuantState); at != std::string_view::npos)
      fail(NF4_ERR_FORMAT, "{}: tensor '{}' looks like the quant state of '{}', but only the suffixes {} are quant states; "
           "refusing to treat '{}' as a dense tensor", file.path(), printable(name), printable(name.substr(0, at)), quant_state_suffixes(),
           printable(name.substr(0, at)));
    for (const std::string_view suffix : kCompanions) {
      if (!ends_with(name, suffix)) continue;
      const std::string_view base = name.substr(0, name.size() - suffix.size());
      const TensorRef weight = lookup(std::string(base));
      if (weight && weight->dtype == DType::U8)
        fail(NF4_ERR_FORMAT, "{}: '{}' looks quantized (a U8 tensor with '{}') but has no quant state '{}{}<{}>'; "
             "its 4-bit bytes would be copied as a dense weight", file.path(), printable(base), printable(name), printable(base),
             kQuantStateKey, joined_names(kQuantTypes, "|", "|"));
    }
  }
}

}  // namespace

std::set<std::string, std::less<>> owned_tensors(const std::vector<QuantizedParam>& params) {
  std::set<std::string, std::less<>> owned;
  for (const auto& p : params) {
    owned.insert(p.name);
    for (auto& c : p.companion_names()) owned.insert(c);
  }
  return owned;
}

std::vector<QuantizedParam> find_quantized_params(const SafetensorsFile& file) {
  std::vector<QuantizedParam> params;
  std::map<std::string, std::string> seen;
  const auto lookup = [&](const std::string& name) { return TensorRef{&file, file.find(name)}; };
  collect_params(file, lookup, seen, params);
  try {
    check_no_shared_tensors(params);
  } catch (const Error& e) {
    throw Error(e.status(), file.path() + ": " + e.what());
  }
  check_no_stray_quant_tensors(file, lookup, owned_tensors(params));
  return params;
}

std::vector<QuantizedParam> find_quantized_params(const Checkpoint& checkpoint) {
  std::vector<QuantizedParam> params;
  std::map<std::string, std::string> seen;
  const auto lookup = [&](const std::string& name) { return checkpoint.find(name); };
  for (std::size_t i = 0; i < checkpoint.shard_count(); ++i) collect_params(checkpoint.shard(i), lookup, seen, params);
  try {
    check_no_shared_tensors(params);
  } catch (const Error& e) {
    throw Error(e.status(), checkpoint.path() + ": " + e.what());
  }
  const auto owned = owned_tensors(params);
  for (std::size_t i = 0; i < checkpoint.shard_count(); ++i) check_no_stray_quant_tensors(checkpoint.shard(i), lookup, owned);
  return params;
}

nf4_tensor describe(const QuantizedParam& p, nf4_dtype out_dtype, void* out, std::int64_t out_bytes) {
  NF4_CHECK(p.files.weight && p.files.absmax && p.files.quant_map);
  nf4_tensor t = describe_counts(p, out_dtype);
  t.packed = p.files.weight->data(*p.weight);
  // Flat absmax and every table are F32 and go through f32(): aligned, copied if the file is not.
  t.absmax = p.state.nested ? static_cast<const void*>(p.files.absmax->data(*p.absmax))
                            : static_cast<const void*>(p.files.absmax->f32(*p.absmax));
  t.quant_map = p.files.quant_map->f32(*p.quant_map);
  if (p.state.nested) {
    NF4_CHECK(p.files.nested_absmax && p.files.nested_quant_map);
    t.nested_absmax = p.files.nested_absmax->f32(*p.nested_absmax);
    t.nested_code = p.files.nested_quant_map->f32(*p.nested_quant_map);
  }
  t.out = out;
  t.out_bytes = out_bytes;
  return t;
}

nf4_tensor describe(const SafetensorsFile& file, const QuantizedParam& p, nf4_dtype out_dtype, void* out,
                    std::int64_t out_bytes) {
  QuantizedParam q = p;
  for (const SafetensorsFile** f : {&q.files.weight, &q.files.absmax, &q.files.quant_map, &q.files.nested_absmax,
                                    &q.files.nested_quant_map, &q.files.quant_state})
    if (!*f) *f = &file;
  return describe(q, out_dtype, out, out_bytes);
}

std::int64_t piece_granularity(const QuantizedParam& p) {
  return p.state.nested ? std::int64_t{p.state.blocksize} * p.state.nested_blocksize : std::int64_t{p.state.blocksize};
}

void* ArrayPool::next(std::int64_t bytes) {
  if (used_ == arrays_.size()) arrays_.emplace_back();
  std::vector<std::uint8_t>& v = arrays_[used_++];
  v.resize(static_cast<std::size_t>(bytes));
  return v.data();
}

namespace {

// A piece [first, first + count) of `p` must start at a multiple of `granularity` and stay inside.
void check_piece(const QuantizedParam& p, std::int64_t first, std::int64_t count, std::int64_t granularity) {
  if (first < 0 || first % granularity != 0 || count < 1 || first > p.numel || count > p.numel - first)
    fail(NF4_ERR_INVALID_ARGUMENT, "piece [{}, +{}) of {}: must start at a multiple of {} and stay inside", first, count,
         printable(p.name), granularity);
}

// n elements of tensor t of `file`, from element first, read into `at`.
template <typename T>
T* read_elements(void* at, const SafetensorsFile* file, const TensorInfo* t, std::int64_t first, std::int64_t n) {
  file->read(*t, first * static_cast<std::int64_t>(sizeof(T)), at, n * static_cast<std::int64_t>(sizeof(T)));
  return static_cast<T*>(at);
}

}  // namespace

nf4_tensor read_piece(const QuantizedParam& p, nf4_dtype out_dtype, std::int64_t first, std::int64_t count, PieceStorage& storage) {
  const auto& f = p.files;
  NF4_CHECK(f.weight && f.absmax && f.quant_map);
  const std::int64_t B = p.state.blocksize;
  check_piece(p, first, count, B);
  // n elements of t into an array of the piece, or into scratch.
  const auto take = [&](auto type_tag, const SafetensorsFile* file, const TensorInfo* t, std::int64_t first_elem, std::int64_t n) {
    using T = decltype(type_tag);
    return read_elements<T>(storage.take(n * static_cast<std::int64_t>(sizeof(T))), file, t, first_elem, n);
  };
  const auto scratch = [&](auto type_tag, const SafetensorsFile* file, const TensorInfo* t, std::int64_t first_elem, std::int64_t n) {
    using T = decltype(type_tag);
    return read_elements<T>(storage.scratch(n * static_cast<std::int64_t>(sizeof(T))), file, t, first_elem, n);
  };
  const std::uint8_t u8{};
  const float f32{};
  const std::int64_t b0 = first / B, blocks = ceil_div(count, B);
  nf4_tensor t{};
  t.quant_type = p.state.quant_type;
  t.out_dtype = out_dtype;
  t.numel = count;
  t.blocksize = p.state.blocksize;
  t.packed_bytes = ceil_div(count, std::int64_t{2});
  t.packed = take(u8, f.weight, p.weight, first / 2, t.packed_bytes);  // first is even: B is
  t.quant_map_count = p.quant_map->numel();
  t.quant_map = take(f32, f.quant_map, p.quant_map, 0, t.quant_map_count);
  t.absmax_count = blocks;
  if (!p.state.nested) {
    t.absmax = take(f32, f.absmax, p.absmax, b0, blocks);
    return t;
  }
  NF4_CHECK(f.nested_absmax && f.nested_quant_map);
  const std::int64_t B2 = p.state.nested_blocksize;
  const std::int64_t n0 = b0 / B2, nested = (b0 + blocks - 1) / B2 + 1 - n0;
  const std::int64_t code_count = p.nested_quant_map->numel();
  if (b0 % B2 == 0) {
    t.nested = 1;
    t.absmax = take(u8, f.absmax, p.absmax, b0, blocks);
    t.nested_absmax_count = nested;
    t.nested_absmax = take(f32, f.nested_absmax, p.nested_absmax, n0, nested);
    t.nested_code_count = code_count;
    t.nested_code = take(f32, f.nested_quant_map, p.nested_quant_map, 0, code_count);
    t.nested_blocksize = p.state.nested_blocksize;
    t.nested_offset = p.state.nested_offset;
    return t;
  }
  // Inside a nested block: each block's absmax decoded as the oracle decodes it, the piece flat.
  const std::uint8_t* codes = scratch(u8, f.absmax, p.absmax, b0, blocks);
  const float* nested_absmax = scratch(f32, f.nested_absmax, p.nested_absmax, n0, nested);
  nf4_tensor one{};
  one.nested = 1;
  one.nested_code = scratch(f32, f.nested_quant_map, p.nested_quant_map, 0, code_count);
  one.nested_blocksize = p.state.nested_blocksize;
  one.nested_offset = p.state.nested_offset;
  auto* absmax = static_cast<float*>(storage.take(blocks * static_cast<std::int64_t>(sizeof(float))));
  for (std::int64_t b = 0; b < blocks; ++b) {
    one.absmax = codes + b;
    one.nested_absmax = nested_absmax + ((b0 + b) / B2 - n0);
    absmax[b] = cpu::oracle_absmax(one, 0);
  }
  t.absmax = absmax;
  return t;
}

nf4_tensor read_piece(const QuantizedParam& p, nf4_dtype out_dtype, std::int64_t first, std::int64_t count, PieceBuffers& buffers) {
  check_piece(p, first, count, piece_granularity(p));
  buffers.reset();
  return read_piece(p, out_dtype, first, count, static_cast<PieceStorage&>(buffers));
}

std::int64_t slice_granularity(const nf4_tensor& t) {
  return t.nested ? std::int64_t{t.blocksize} * t.nested_blocksize : std::int64_t{t.blocksize};
}

nf4_tensor slice(const nf4_tensor& t, std::int64_t first, std::int64_t count) {
  const std::int64_t g = slice_granularity(t);
  if (g <= 0 || first < 0 || first % g != 0 || count < 1 || first > t.numel || count > t.numel - first)
    fail(NF4_ERR_INVALID_ARGUMENT, "slice [{}, +{}) of a {}-element tensor: must start at a multiple of {} and stay inside", first,
         count, t.numel, g);
  nf4_tensor s = t;
  const std::int64_t block0 = first / t.blocksize;
  s.numel = count;
  s.packed = t.packed + first / 2;  // g is even, so the slice starts on a byte
  s.packed_bytes = ceil_div(count, 2);
  s.absmax_count = ceil_div(count, t.blocksize);
  if (t.nested) {
    s.absmax = static_cast<const std::uint8_t*>(t.absmax) + block0;
    s.nested_absmax = t.nested_absmax + block0 / t.nested_blocksize;
    s.nested_absmax_count = ceil_div(s.absmax_count, t.nested_blocksize);
  } else {
    s.absmax = static_cast<const float*>(t.absmax) + block0;
  }
  s.out = nullptr;
  s.out_bytes = 0;
  return s;
}

const char* torch_dtype_name(nf4_dtype d) { return dtype_info(d).torch_name.data(); }

std::string expected_tensor_name(const std::string& param_name, nf4_dtype dtype) {
  std::string_view prefix = param_name;
  if (ends_with(prefix, ".weight")) prefix.remove_suffix(7);
  return fmt::format("{}.expected.{}", prefix, torch_dtype_name(dtype));
}

DType to_safetensors_dtype(nf4_dtype d) {
  const std::optional<DType> st = parse_dtype(dtype_info(d).safetensors_name);
  NF4_CHECK(st.has_value());  // every row's safetensors_name is one the reader knows (tests/test_checkpoint.cpp)
  return *st;
}

std::optional<nf4_dtype> to_output_dtype(DType d) {
  const DtypeInfo* row = find_dtype_safetensors(dtype_name(d));
  return row ? std::optional<nf4_dtype>(row->dtype) : std::nullopt;
}

// ---- Checkpoint -------------------------------------------------------------------------------

Checkpoint::Checkpoint(const std::string& path, const CheckpointOptions& options) : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(NF4_ERR_IO, "{}: cannot open: {}", path, std::strerror(errno));
  from_directory_ = S_ISDIR(st.st_mode);
  std::string index_path;
  std::string single;
  if (from_directory_) {
    dir_ = path;
    const std::string candidate = path + "/" + kIndexFileName;
    if (::lstat(candidate.c_str(), &st) == 0) {
      index_path = candidate;
    } else {
      std::vector<std::string> found;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(path, ec))
        if (e.path().extension() == ".safetensors") found.push_back(e.path().filename().string());
      if (ec) fail(NF4_ERR_IO, "{}: cannot list the directory: {}", path, ec.message());
      if (found.empty()) fail(NF4_ERR_IO, "{}: holds neither {} nor a .safetensors file", path, kIndexFileName);
      if (found.size() > 1)
        fail(NF4_ERR_FORMAT, "{}: holds {} .safetensors files but no {} that says how they fit together", path, found.size(),
             kIndexFileName);
      single = found[0];
    }
  } else {
    dir_ = parent_dir(path);
    if (ends_with(path, ".json")) index_path = path;
    else single = base_name(path);
  }
  // Files the tool finds by itself (shards named by an index, the file of a model directory)
  // must be inside the input directory; a file the user named is read wherever it is.
  policy_.root = real_path(dir_);
  index_path_ = index_path;
  policy_.follow_symlinks = options.follow_symlinks;

  if (!index_path.empty()) {
    index_ = read_index(index_path, from_directory_ ? &policy_ : nullptr);
    shard_names_ = index_->shard_names();
    if (from_directory_) {
      // Two sources in one directory: transformers loads model.safetensors before an index, so a
      // dense copy made from the shards would hold other weights than the input loads as.
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
        const std::string name = e.path().filename().string();
        if (e.path().extension() == ".safetensors" && !std::binary_search(shard_names_.begin(), shard_names_.end(), name))
          fail(NF4_ERR_FORMAT, "{}: holds both {} (shards {}) and {}, which the index does not name; transformers would load {}, nf4 "
               "the shards: remove one of them, or name the one to convert ({} or {}/{})", path, kIndexFileName,
               printable(fmt::format("{}", fmt::join(shard_names_, ", ")), 200), printable(name), printable(name), index_path, path,
               printable(name));
      }
      if (ec) fail(NF4_ERR_IO, "{}: cannot list the directory: {}", path, ec.message());
    }
  } else {
    shard_names_ = {single};
  }
  for (std::size_t i = 0; i < shard_names_.size(); ++i) {
    check_cancel();
    const bool named = !from_directory_ && !index_;
    const std::string file = named ? path : dir_ + "/" + shard_names_[i];
    shards_.push_back(std::make_unique<SafetensorsFile>(file, named ? nullptr : &policy_));
    std::size_t n = 0;
    for (const TensorInfo& t : shards_[i]->tensors()) {
      if ((++n & 4095) == 0) check_cancel();
      const auto [it, fresh] = where_.emplace(t.name, i);
      if (!fresh)
        fail(NF4_ERR_FORMAT, "{}: tensor '{}' is in both {} and {}", index_path, printable(t.name), printable(shard_names_[it->second]),
             printable(shard_names_[i]));
      if (index_) {
        const auto listed = index_->weight_map.find(t.name);
        if (listed == index_->weight_map.end())
          fail(NF4_ERR_FORMAT, "{}: tensor '{}' of shard {} is not in the weight_map", index_path, printable(t.name),
               printable(shard_names_[i]));
        if (listed->second != shard_names_[i])
          fail(NF4_ERR_FORMAT, "{}: the weight_map puts tensor '{}' in {}, but it is in {}", index_path, printable(t.name),
               printable(listed->second), printable(shard_names_[i]));
      }
    }
  }
  if (index_)
    for (const auto& [tensor, shard] : index_->weight_map)
      if (!where_.count(tensor))
        fail(NF4_ERR_FORMAT, "{}: tensor '{}' is in the weight_map but not in {}", index_path, printable(tensor), printable(shard));
}

TensorRef Checkpoint::find(std::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) return {};
  const SafetensorsFile& f = *shards_[it->second];
  return {&f, f.find(name)};
}

}  // namespace nf4::io
