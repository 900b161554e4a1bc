// SPDX-License-Identifier: MIT
// `nf4 inspect FILE`: what a checkpoint holds. Quantized parameters (quant type, original shape and
// dtype, blocksize, nested statistics, packed bytes including every companion tensor) and dense
// tensors (dtype, shape, bytes), with totals and the size a dense conversion would have.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "core/io/checkpoint.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace nf4::cli {
namespace {

void inspect(const std::string& path, const io::CheckpointOptions& options) {
  const io::Checkpoint ck(path, options);
  const auto params = io::find_quantized_params(ck);
  std::set<std::string, std::less<>> owned;  // weights and companions of quantized parameters
  for (const auto& p : params) {
    owned.insert(p.name);
    for (auto& c : p.companion_names()) owned.insert(c);
  }
  const auto shard_of = [&](const std::string& name) -> std::string {
    const io::TensorRef r = ck.find(name);
    for (std::size_t i = 0; i < ck.shard_count(); ++i)
      if (&ck.shard(i) == r.file) return ck.shard_name(i);
    return "?";
  };

  std::printf("%s: %s, %zu tensors\n", path.c_str(),
              ck.sharded() ? fmt::format("sharded checkpoint, {} shards", ck.shard_count()).c_str() : "safetensors file",
              ck.tensor_count());
  for (std::size_t i = 0; i < ck.shard_count(); ++i) {
    const auto& f = ck.shard(i);
    std::string meta;
    for (const auto& [k, v] : f.metadata()) meta += fmt::format("{}{}={}", meta.empty() ? "" : ", ", k, v);
    std::printf("  shard %s: %zu tensors, metadata {%s}\n", ck.shard_name(i).c_str(), f.tensors().size(), meta.c_str());
  }

  std::int64_t q_elems = 0, q_bytes = 0, dense_as_stored = 0;
  std::map<std::string, std::int64_t> dense_out_by_dtype;  // dense size of the quantized params at their dtype
  if (!params.empty()) {
    std::printf("\nquantized parameters (%zu):\n", params.size());
    std::printf("  %-48s %-5s %-16s %-9s %6s %-10s %12s%s\n", "name", "type", "shape", "dtype", "block", "nested", "packed bytes",
                ck.sharded() ? "  shard" : "");
    for (const auto& p : params) {
      std::int64_t bytes = 0;
      for (const io::TensorInfo* t : {p.weight, p.absmax, p.quant_map, p.nested_absmax, p.nested_quant_map, p.quant_state})
        if (t) bytes += t->bytes();
      q_elems += p.numel;
      q_bytes += bytes;
      nf4_dtype d;
      if (io::parse_torch_dtype(p.state.dtype, &d))
        dense_out_by_dtype[io::torch_dtype_name(d)] += p.numel * static_cast<std::int64_t>(nf4_dtype_size(d));
      const std::string nested = p.state.nested ? fmt::format("B2={}", p.state.nested_blocksize) : "no";
      std::printf("  %-48s %-5s %-16s %-9s %6d %-10s %12lld%s%s\n", p.name.c_str(), p.state.quant_type == NF4_QUANT_NF4 ? "nf4" : "fp4",
                  shape_text(p.state.shape).c_str(), p.state.dtype.empty() ? "?" : p.state.dtype.c_str(), p.state.blocksize,
                  nested.c_str(), static_cast<long long>(bytes), ck.sharded() ? "  " : "",
                  ck.sharded() ? shard_of(p.name).c_str() : "");
    }
  }

  std::size_t dense_count = 0;
  std::string dense_rows;
  for (std::size_t i = 0; i < ck.shard_count(); ++i)
    for (const io::TensorInfo& t : ck.shard(i).tensors()) {
      if (owned.count(t.name)) continue;
      ++dense_count;
      dense_as_stored += t.bytes();
      dense_rows += fmt::format("  {:<48} {:<8} {:<20} {:>12}{}\n", t.name, io::dtype_name(t.dtype), shape_text(t.shape), t.bytes(),
                                ck.sharded() ? "  " + ck.shard_name(i) : "");
    }
  if (dense_count) {
    std::printf("\ndense tensors (%zu):\n  %-48s %-8s %-20s %12s%s\n%s", dense_count, "name", "dtype", "shape", "bytes",
                ck.sharded() ? "  shard" : "", dense_rows.c_str());
  }

  std::printf("\ntotals:\n");
  std::printf("  quantized: %zu parameters, %lld elements, %s stored (weights + quant state)\n", params.size(),
              static_cast<long long>(q_elems), human_bytes(static_cast<double>(q_bytes)).c_str());
  std::printf("  dense:     %zu tensors, %s\n", dense_count, human_bytes(static_cast<double>(dense_as_stored)).c_str());
  if (!params.empty()) {
    std::int64_t converted = dense_as_stored;
    std::string per;
    for (const auto& [name, b] : dense_out_by_dtype) {
      converted += b;
      per += fmt::format("{}{} {}", per.empty() ? "" : ", ", human_bytes(static_cast<double>(b)), name);
    }
    std::printf("  after `nf4 convert` at the stored dtypes: %s (%s dequantized)\n", human_bytes(static_cast<double>(converted)).c_str(),
                per.empty() ? "dtype unknown" : per.c_str());
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto options = std::make_shared<io::CheckpointOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "List the quantized and dense tensors of a checkpoint");
  cmd->add_option("FILE", *path, "a .safetensors file, or a sharded checkpoint (its directory or index)")->required();
  cmd->add_flag("--follow-symlinks", options->follow_symlinks, "read files of a model directory that link outside it");
  cmd->callback([path, options] { inspect(*path, *options); });
}

}  // namespace nf4::cli
