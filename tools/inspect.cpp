// SPDX-License-Identifier: MIT
// `nf4 inspect FILE`: what a checkpoint holds. Quantized parameters (quant type, original shape and
// dtype, blocksize, nested statistics, packed bytes including every companion tensor) and dense
// tensors (dtype, shape, bytes), with totals and the size a dense conversion would have; as a
// table, or with --json as one JSON document on stdout (keys in docs/CLI.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/json_limits.h"
#include "core/types.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace nf4::cli {
namespace {

// What inspect reports, gathered once and printed as a table or as JSON.
struct QuantizedRow {
  const io::QuantizedParam* p;
  std::int64_t stored_bytes;  // weight + every companion tensor
  std::string shard;
};
struct DenseRow {
  const io::TensorInfo* t;
  std::string shard;
};
struct Inventory {
  std::vector<QuantizedRow> quantized;
  std::vector<DenseRow> dense;
  std::int64_t q_elems = 0, q_bytes = 0, dense_bytes = 0;
  std::map<std::string, std::int64_t> dense_out_by_dtype;  // dense size of the quantized params at their dtype
};

Inventory take_inventory(const io::Checkpoint& ck, const std::vector<io::QuantizedParam>& params) {
  Inventory inv;
  const auto owned = io::owned_tensors(params);
  const auto shard_of = [&](const std::string& name) -> std::string {
    const io::TensorRef r = ck.find(name);
    for (std::size_t i = 0; i < ck.shard_count(); ++i)
      if (&ck.shard(i) == r.file) return ck.shard_name(i);
    return "?";
  };
  for (const auto& p : params) {
    std::int64_t bytes = 0;
    for (const io::TensorInfo* t : {p.weight, p.absmax, p.quant_map, p.nested_absmax, p.nested_quant_map, p.quant_state})
      if (t) bytes += t->bytes();
    inv.q_elems += p.numel;
    inv.q_bytes += bytes;
    nf4_dtype d;
    if (io::parse_torch_dtype(p.state.dtype, &d))
      inv.dense_out_by_dtype[io::torch_dtype_name(d)] += p.numel * static_cast<std::int64_t>(nf4_dtype_size(d));
    inv.quantized.push_back({&p, bytes, ck.sharded() ? shard_of(p.name) : ""});
  }
  for (std::size_t i = 0; i < ck.shard_count(); ++i)
    for (const io::TensorInfo& t : ck.shard(i).tensors()) {
      if (owned.count(t.name)) continue;
      inv.dense_bytes += t.bytes();
      inv.dense.push_back({&t, ck.sharded() ? ck.shard_name(i) : ""});
    }
  return inv;
}

// Every name and value from the file goes through io::terminal_text: a tensor name holding
// terminal escapes must not retitle the window, clear the screen or hide lines of the report.
void print_table(const std::string& path, const io::Checkpoint& ck, const Inventory& inv) {
  const auto safe = [](std::string_view s) { return io::terminal_text(s); };
  std::printf("%s: %s, %zu tensors\n", safe(path).c_str(),
              ck.sharded() ? fmt::format("sharded checkpoint, {} shards", ck.shard_count()).c_str() : "safetensors file",
              ck.tensor_count());
  for (std::size_t i = 0; i < ck.shard_count(); ++i) {
    const auto& f = ck.shard(i);
    std::string meta;
    for (const auto& [k, v] : f.metadata()) meta += fmt::format("{}{}={}", meta.empty() ? "" : ", ", safe(k), safe(v));
    std::printf("  shard %s: %zu tensors, metadata {%s}\n", safe(ck.shard_name(i)).c_str(), f.tensors().size(), meta.c_str());
  }

  if (!inv.quantized.empty()) {
    std::printf("\nquantized parameters (%zu):\n", inv.quantized.size());
    std::printf("  %-48s %-5s %-16s %-9s %6s %-10s %12s%s\n", "name", "type", "shape", "dtype", "block", "nested", "packed bytes",
                ck.sharded() ? "  shard" : "");
    for (const auto& row : inv.quantized) {
      const io::QuantizedParam& p = *row.p;
      const std::string nested = p.state.nested ? fmt::format("B2={}", p.state.nested_blocksize) : "no";
      std::printf("  %-48s %-5s %-16s %-9s %6d %-10s %12lld%s%s\n", safe(p.name).c_str(),
                  std::string(quant_type_name(p.state.quant_type)).c_str(), shape_text(p.state.shape).c_str(),
                  p.state.dtype.empty() ? "?" : safe(p.state.dtype).c_str(), p.state.blocksize, nested.c_str(),
                  static_cast<long long>(row.stored_bytes), ck.sharded() ? "  " : "", safe(row.shard).c_str());
    }
  }

  if (!inv.dense.empty()) {
    std::string rows;
    for (const auto& row : inv.dense)
      rows += fmt::format("  {:<48} {:<8} {:<20} {:>12}{}\n", safe(row.t->name), io::dtype_name(row.t->dtype), shape_text(row.t->shape),
                          row.t->bytes(), ck.sharded() ? "  " + safe(row.shard) : "");
    std::printf("\ndense tensors (%zu):\n  %-48s %-8s %-20s %12s%s\n%s", inv.dense.size(), "name", "dtype", "shape", "bytes",
                ck.sharded() ? "  shard" : "", rows.c_str());
  }

  std::printf("\ntotals:\n");
  std::printf("  quantized: %zu parameters, %lld elements, %s stored (weights + quant state)\n", inv.quantized.size(),
              static_cast<long long>(inv.q_elems), human_bytes(static_cast<double>(inv.q_bytes)).c_str());
  std::printf("  dense:     %zu tensors, %s\n", inv.dense.size(), human_bytes(static_cast<double>(inv.dense_bytes)).c_str());
  if (!inv.quantized.empty()) {
    std::int64_t converted = inv.dense_bytes;
    std::string per;
    for (const auto& [name, b] : inv.dense_out_by_dtype) {
      converted += b;
      per += fmt::format("{}{} {}", per.empty() ? "" : ", ", human_bytes(static_cast<double>(b)), name);
    }
    std::printf("  after `nf4 convert` at the stored dtypes: %s (%s dequantized)\n", human_bytes(static_cast<double>(converted)).c_str(),
                per.empty() ? "dtype unknown" : per.c_str());
  }
}

// docs/CLI.md describes every key; keys are only ever added.
nlohmann::json inventory_json(const std::string& path, const io::Checkpoint& ck, const Inventory& inv) {
  using nlohmann::json;
  json shards = json::array();
  for (std::size_t i = 0; i < ck.shard_count(); ++i) {
    json meta = json::object();
    for (const auto& [k, v] : ck.shard(i).metadata()) meta[k] = v;
    shards.push_back({{"name", ck.shard_name(i)}, {"tensors", ck.shard(i).tensors().size()}, {"metadata", meta}});
  }
  json quantized = json::array();
  for (const auto& row : inv.quantized) {
    const io::QuantizedParam& p = *row.p;
    quantized.push_back({{"name", p.name},
                         {"quant_type", std::string(quant_type_name(p.state.quant_type))},
                         {"shape", p.state.shape},
                         {"numel", p.numel},
                         {"dtype", p.state.dtype.empty() ? json(nullptr) : json(p.state.dtype)},
                         {"blocksize", p.state.blocksize},
                         {"nested", p.state.nested},
                         {"nested_blocksize", p.state.nested ? json(p.state.nested_blocksize) : json(nullptr)},
                         {"stored_bytes", row.stored_bytes},
                         {"shard", ck.sharded() ? json(row.shard) : json(nullptr)}});
  }
  json dense = json::array();
  for (const auto& row : inv.dense)
    dense.push_back({{"name", row.t->name},
                     {"dtype", io::dtype_name(row.t->dtype)},
                     {"shape", row.t->shape},
                     {"bytes", row.t->bytes()},
                     {"shard", ck.sharded() ? json(row.shard) : json(nullptr)}});
  json converted = nullptr;
  json by_dtype = json::object();
  if (!inv.quantized.empty()) {
    std::int64_t total = inv.dense_bytes;
    for (const auto& [name, b] : inv.dense_out_by_dtype) {
      total += b;
      by_dtype[name] = b;
    }
    converted = total;
  }
  return {{"path", path},
          {"sharded", ck.sharded()},
          {"tensor_count", ck.tensor_count()},
          {"shards", shards},
          {"quantized", quantized},
          {"dense", dense},
          {"totals",
           {{"quantized_parameters", inv.quantized.size()},
            {"quantized_elements", inv.q_elems},
            {"quantized_stored_bytes", inv.q_bytes},
            {"dense_tensors", inv.dense.size()},
            {"dense_bytes", inv.dense_bytes},
            {"converted_bytes", converted},
            {"dequantized_bytes_by_dtype", by_dtype}}}};
}

void inspect(const std::string& path, bool as_json, const io::CheckpointOptions& options) {
  const io::Checkpoint ck(path, options);
  const auto params = io::find_quantized_params(ck);
  const Inventory inv = take_inventory(ck, params);
  // JSON escapes every control character; bytes that are not UTF-8 (a file name, a path) become
  // U+FFFD instead of failing the whole report.
  if (as_json) std::printf("%s\n", inventory_json(path, ck, inv).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  else print_table(path, ck, inv);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  struct Args {
    std::string path;
    bool json = false;
    io::CheckpointOptions options;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("inspect", "List the quantized and dense tensors of a checkpoint");
  cmd->add_option("FILE", a->path, "a .safetensors file, or a sharded checkpoint (its directory or index)")->required();
  cmd->add_flag("--json", a->json, "print one JSON document instead of the table (keys: docs/CLI.md)");
  cmd->add_flag("--follow-symlinks", a->options.follow_symlinks, "read files of a model directory that link outside it");
  cmd->callback([a] { inspect(a->path, a->json, a->options); });
}

}  // namespace nf4::cli
