// SPDX-License-Identifier: MIT
#include "core/io/checkpoint.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/tensor.h"

namespace nf4::io {

namespace {
constexpr std::string_view kQuantStateNf4 = ".quant_state.bitsandbytes__nf4";
constexpr std::string_view kQuantStateFp4 = ".quant_state.bitsandbytes__fp4";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
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
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  if (name == "float16" || name == "half" || name == "fp16" || name == "f16") *out = NF4_DTYPE_F16;
  else if (name == "bfloat16" || name == "bf16") *out = NF4_DTYPE_BF16;
  else if (name == "float32" || name == "float" || name == "fp32" || name == "f32") *out = NF4_DTYPE_F32;
  else return false;
  return true;
}

QuantState parse_quant_state(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(NF4_ERR_FORMAT, "quant state is not a JSON object");
  QuantState s;
  const auto qt = j.find("quant_type");
  if (qt == j.end() || !qt->is_string()) fail(NF4_ERR_FORMAT, "quant state: 'quant_type' missing");
  if (*qt == "nf4") s.quant_type = NF4_QUANT_NF4;
  else if (*qt == "fp4") s.quant_type = NF4_QUANT_FP4;
  else fail(NF4_ERR_FORMAT, "quant state: quant_type '{}' is neither nf4 nor fp4", qt->get<std::string>());
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

std::vector<QuantizedParam> find_quantized_params(const SafetensorsFile& file) {
  std::vector<QuantizedParam> params;
  for (const TensorInfo& qs : file.tensors()) {
    const bool nf4 = ends_with(qs.name, kQuantStateNf4), fp4 = ends_with(qs.name, kQuantStateFp4);
    if (!nf4 && !fp4) continue;
    QuantizedParam p;
    p.name = qs.name.substr(0, qs.name.size() - kQuantStateNf4.size());
    p.quant_state = &qs;
    try {
      if (qs.dtype != DType::U8) fail(NF4_ERR_FORMAT, "quant state tensor is {}, expected U8", dtype_name(qs.dtype));
      p.state = parse_quant_state(std::string_view(reinterpret_cast<const char*>(file.data(qs)), qs.bytes()));
      if ((p.state.quant_type == NF4_QUANT_FP4) != fp4)
        fail(NF4_ERR_FORMAT, "quant_type in the JSON disagrees with the key suffix");
      p.numel = 1;
      for (auto d : p.state.shape) p.numel *= d;
      const auto need = [&](const std::string& suffix, DType dtype) -> const TensorInfo* {
        const TensorInfo* t = file.find(p.name + suffix);
        if (!t) fail(NF4_ERR_FORMAT, "missing tensor '{}{}'", p.name, suffix);
        if (t->dtype != dtype) fail(NF4_ERR_FORMAT, "'{}' is {}, expected {}", t->name, dtype_name(t->dtype), dtype_name(dtype));
        return t;
      };
      p.weight = need("", DType::U8);
      p.absmax = need(".absmax", p.state.nested ? DType::U8 : DType::F32);
      p.quant_map = need(".quant_map", DType::F32);
      if (p.state.nested) {
        p.nested_absmax = need(".nested_absmax", DType::F32);
        p.nested_quant_map = need(".nested_quant_map", DType::F32);
      }
      validate_inputs(describe(file, p, NF4_DTYPE_F32, nullptr, 0), "stored weight");
    } catch (const Error& e) {
      throw Error(NF4_ERR_FORMAT, fmt::format("{}: quantized parameter '{}': {}", file.path(), p.name, e.what()));
    }
    params.push_back(std::move(p));
  }
  return params;
}

nf4_tensor describe(const SafetensorsFile& file, const QuantizedParam& p, nf4_dtype out_dtype, void* out,
                    std::int64_t out_bytes) {
  nf4_tensor t{};
  t.quant_type = p.state.quant_type;
  t.out_dtype = out_dtype;
  t.numel = p.numel;
  t.blocksize = p.state.blocksize;
  t.nested = p.state.nested ? 1 : 0;
  t.packed = file.data(*p.weight);
  t.packed_bytes = p.weight->bytes();
  t.absmax = file.data(*p.absmax);
  t.absmax_count = p.absmax->numel();
  t.quant_map = reinterpret_cast<const float*>(file.data(*p.quant_map));
  t.quant_map_count = p.quant_map->numel();
  if (p.state.nested) {
    t.nested_absmax = reinterpret_cast<const float*>(file.data(*p.nested_absmax));
    t.nested_absmax_count = p.nested_absmax->numel();
    t.nested_code = reinterpret_cast<const float*>(file.data(*p.nested_quant_map));
    t.nested_code_count = p.nested_quant_map->numel();
    t.nested_blocksize = p.state.nested_blocksize;
    t.nested_offset = p.state.nested_offset;
  }
  t.out = out;
  t.out_bytes = out_bytes;
  return t;
}

}  // namespace nf4::io
