// SPDX-License-Identifier: MIT
// `nf4 bench`: the harness of docs/DESIGN.md section 4. Per backend: the device-to-device copy
// ceiling, then per shape and dtype the median dequantization time, GB/s of the bytes that must
// move, and % of the ceiling; plus a grouped MLP (gate, up, down in one launch). Buffers rotate
// so that the bytes touched per round exceed 4x the last-level cache. Timing comes from the
// backend's runner in nf4_bench (bench/bench.h: CUDA events, Vulkan timestamps, steady clock on
// the CPU); the weights from bench/weights.h. The development binary nf4_lab (lab/) registers the
// same command with a peer, timed on the same tensors.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/util.h"
#include "bench/weights.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/format.h"
#include "core/gemv.h"
#include "tools/checkpoint/output.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace nf4::cli {
namespace {

struct BenchOptions {
  std::string backend = "auto";
  int device = -1;  // the backend's device index; -1: its default device
  std::vector<std::string> shapes = {"1024x4096", "2048x8192", "4096x14336", "8192x28672"};
  std::vector<std::string> dtypes = {"fp16", "bf16"};
  std::string mlp = "1024x4096";  // hd x m: gate [m, hd], up [m, hd], down [hd, m]
  std::string json_path;
  std::string peer_bnb;
  int iters = 50;
  int blocksize = 64;
  double copy_mib = 512;
  // The matrix-vector product (nf4.h, nf4_gemv_desc): W [N x K] nested NF4, x and y of gemv_dtype.
  std::vector<std::string> gemv_shapes = {"4096x4096", "14336x4096", "4096x14336", "28672x8192", "8192x28672"};
  std::vector<int> gemv_m = {1, 4, 8};
  std::string gemv_dtype = "bf16";
  std::string gemv_mode = "exact";  // the product's contract (nf4.h, nf4_gemv_desc.mode)
  bool gemv = false;       // time the products too (their shapes are skipped otherwise)
  bool gemv_only = false;  // time only the products
};

struct Shape {
  std::int64_t rows, cols;
};

// A benchmark weight is made in host memory (packed codes, statistics) and again on the device:
// 2^36 elements (32 GiB of codes) is past any machine it runs on, and far from overflowing.
constexpr std::int64_t kMaxBenchElements = std::int64_t{1} << 36;

// `option` names where the shape came from, for the message.
Shape parse_shape(const std::string& s, const char* option) {
  const auto x = s.find('x');
  Shape sh{0, 0};
  try {
    std::size_t end1 = 0, end2 = 0;
    if (x != std::string::npos) sh = {std::stoll(s.substr(0, x), &end1), std::stoll(s.substr(x + 1), &end2)};
    if (x == std::string::npos || end1 != x || end2 != s.size() - x - 1) sh = {0, 0};
  } catch (const std::exception&) {
    sh = {0, 0};
  }
  if (sh.rows <= 0 || sh.cols <= 0)
    throw UsageError(NF4_ERR_INVALID_ARGUMENT, fmt::format("{} '{}' is not ROWSxCOLS with positive sizes (e.g. 4096x14336)", option, s));
  std::int64_t n = 0;
  if (__builtin_mul_overflow(sh.rows, sh.cols, &n) || n > kMaxBenchElements)
    throw UsageError(NF4_ERR_INVALID_ARGUMENT, fmt::format("{} '{}' has more than 2^36 elements", option, s));
  return sh;
}

struct Row {
  std::string name, dtype;
  std::int64_t bytes;
  double us, gbps, pct, floor_us, peer_us;
};

void run_bench(const BenchOptions& o, BenchPeer peer) {
  // Every option checked before any work (and before anything is allocated for it).
  for (const auto& s : o.gemv_only ? std::vector<std::string>{} : o.shapes) parse_shape(s, "--shapes");
  if (!o.mlp.empty()) parse_shape(o.mlp, "--mlp");
  for (const auto& s : o.gemv_shapes) parse_shape(s, "--gemv-shapes");
  if (o.blocksize < format::kMinBlocksize || o.blocksize > format::kMaxBlocksize || (o.blocksize & (o.blocksize - 1)) != 0)
    throw UsageError(NF4_ERR_INVALID_ARGUMENT, fmt::format("--blocksize {} is not a power of two in [{}, {}]", o.blocksize,
                                                           format::kMinBlocksize, format::kMaxBlocksize));
  for (const auto& d : o.dtypes) parse_dtype_option(d);
  parse_dtype_option(o.gemv_dtype);
  const nf4_backend_kind kind = parse_backend_option(o.backend);
  auto backend = create_backend(kind, parse_device_option(kind, o.device));
  const std::unique_ptr<bench::BenchRunner> runner = bench::make_bench_runner(*backend);
  if (!runner) fail(NF4_ERR_UNSUPPORTED, "backend '{}' has no benchmark runner", nf4::backend_name(backend->kind()));
  const std::int64_t cache = runner->cache_bytes();
  const auto rotations_for = [&](std::int64_t bytes) {
    return static_cast<int>(std::clamp<std::int64_t>(ceil_div(4 * cache, std::max<std::int64_t>(bytes, 1)), 2, 64));
  };

  std::printf("nf4 bench: backend %s, device %s\n", nf4::backend_name(backend->kind()), backend->device_name().c_str());
  const std::int64_t copy_bytes = static_cast<std::int64_t>(o.copy_mib * 1024 * 1024);
  const double copy_us = runner->time_copy_us(copy_bytes, rotations_for(2 * copy_bytes), o.iters);
  const double ceiling = 2.0 * static_cast<double>(copy_bytes) / copy_us / 1e3;  // GB/s, read + write
  std::printf("copy ceiling: %.1f GB/s (%lld MiB copied in %.1f us, %d rotations, last-level cache %lld MiB)\n\n", ceiling,
              static_cast<long long>(copy_bytes >> 20), copy_us, rotations_for(2 * copy_bytes), static_cast<long long>(cache >> 20));
  if (!o.gemv_only)
    std::printf("%-22s %-5s %12s %10s %10s %8s %10s %10s\n", "matrix", "dtype", "bytes", "time us", "GB/s", "% copy", "floor us",
                "peer us");

  std::vector<Row> rows;
  const auto measure = [&](const std::string& name, const std::string& dtype_name, const std::vector<bench::BenchWeight>& ws) {
    const nf4_dtype d = parse_dtype_option(dtype_name);
    std::vector<nf4_tensor> ts;
    std::int64_t bytes = 0;
    for (const auto& w : ws) {
      ts.push_back(w.describe(d));
      bytes += bench::minimum_bytes(ts.back());
    }
    const int rot = rotations_for(bytes);
    Row r{name, dtype_name, bytes, 0, 0, 0, 0, -1};
    r.us = runner->time_dequantize_us(ts.data(), ts.size(), rot, o.iters);
    r.gbps = static_cast<double>(bytes) / r.us / 1e3;
    r.pct = 100.0 * r.gbps / ceiling;
    r.floor_us = static_cast<double>(bytes) / ceiling / 1e3;
    if (!o.peer_bnb.empty()) r.peer_us = peer(*backend, o.peer_bnb.c_str(), ts.data(), ts.size(), rot, o.iters);
    std::printf("%-22s %-5s %12lld %10.2f %10.1f %7.1f%% %10.2f %10s\n", name.c_str(), dtype_name.c_str(), static_cast<long long>(bytes),
                r.us, r.gbps, r.pct, r.floor_us, r.peer_us >= 0 ? fmt::format("{:.2f}", r.peer_us).c_str() : "-");
    std::fflush(stdout);
    rows.push_back(r);
  };

  std::uint64_t seed = 1;
  for (const auto& s : o.gemv_only ? std::vector<std::string>{} : o.shapes) {
    const Shape sh = parse_shape(s, "--shapes");
    const std::vector<bench::BenchWeight> ws = {bench::make_bench_weight(sh.rows * sh.cols, o.blocksize, seed++)};
    for (const auto& d : o.dtypes) measure(s, d, ws);
  }
  if (!o.mlp.empty() && !o.gemv_only) {
    const Shape sh = parse_shape(o.mlp, "--mlp");  // hd x m
    std::vector<bench::BenchWeight> ws;
    for (int i = 0; i < 3; ++i) ws.push_back(bench::make_bench_weight(sh.rows * sh.cols, o.blocksize, seed++));
    for (const auto& d : o.dtypes) measure("mlp3 " + o.mlp + " grouped", d, ws);
  }

  // The product: its floor is the bytes it must move (W's codes and statistics, x, y) at the copy
  // ceiling of this run.
  struct GemvRow {
    std::string shape;
    int m;
    std::int64_t bytes;
    double us, floor_us, pct;
    const char* mode;  // the contract that ran
  };
  std::vector<GemvRow> gemv_rows;
  if ((o.gemv || o.gemv_only) && !o.gemv_shapes.empty() && !o.gemv_m.empty()) {
    const nf4_dtype d = parse_dtype_option(o.gemv_dtype);
    const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(d));
    const nf4_gemv_mode mode = o.gemv_mode == "fast" ? NF4_GEMV_FAST : NF4_GEMV_EXACT;
    std::printf("\n%-22s %-3s %12s %10s %10s %8s %10s %s\n", "gemv W [N x K]", "m", "bytes", "time us", "GB/s", "% floor", "floor us", "mode");
    for (const auto& s : o.gemv_shapes) {
      const Shape sh = parse_shape(s, "--gemv-shapes");  // N x K
      const bench::BenchWeight w = bench::make_bench_weight(sh.rows * sh.cols, o.blocksize, seed++);
      const nf4_tensor wt = w.describe(NF4_DTYPE_F32);
      const int max_m = *std::max_element(o.gemv_m.begin(), o.gemv_m.end());
      // x in its dtype, each value rounded by the dtype's codec.
      const auto xs = bench::bench_values(max_m * sh.cols, seed++);
      std::vector<std::uint8_t> x(xs.size() * static_cast<std::size_t>(es));
      dispatch_dtype(d, [&](auto tag) {
        for (std::size_t i = 0; i < xs.size(); ++i) store_element<decltype(tag)::value>(x.data(), static_cast<std::int64_t>(i), xs[i]);
      });
      std::vector<std::uint8_t> y(static_cast<std::size_t>(max_m * sh.rows * es));
      for (int m : o.gemv_m) {
        nf4_gemv_desc g{};
        g.weight = &wt;
        g.n = sh.rows;
        g.k = sh.cols;
        g.m = m;
        g.x_dtype = d;
        g.x = x.data();
        g.y_dtype = d;
        g.y = y.data();
        g.y_bytes = static_cast<std::int64_t>(y.size());
        g.mode = mode;
        // The contract the backend runs for it (the exact one where it has no fast path).
        const bool fast = gemv_wants_fast(g) && backend->gemv_fast(validate_gemv(g));
        const std::int64_t bytes = bench::minimum_bytes(wt) - wt.numel * 4 + m * sh.cols * es + m * sh.rows * es;  // no dense output
        GemvRow r{s, m, bytes, runner->time_gemv_us(g, rotations_for(bytes), o.iters), 0, 0, fast ? "fast" : "exact"};
        r.floor_us = static_cast<double>(bytes) / ceiling / 1e3;
        if (r.us < 0) {
          std::printf("%-22s %-3d backend %s has no gemv timing\n", s.c_str(), m, nf4::backend_name(backend->kind()));
          continue;
        }
        r.pct = 100.0 * r.floor_us / r.us;
        std::printf("%-22s %-3d %12lld %10.2f %10.1f %7.1f%% %10.2f %s\n", s.c_str(), m, static_cast<long long>(bytes), r.us,
                    static_cast<double>(bytes) / r.us / 1e3, r.pct, r.floor_us, r.mode);
        std::fflush(stdout);
        gemv_rows.push_back(r);
      }
    }
  }

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["backend"] = nf4::backend_name(backend->kind());
    j["device"] = backend->device_name();
    j["copy_ceiling_gbps"] = ceiling;
    j["copy_bytes"] = copy_bytes;
    j["cache_bytes"] = cache;
    j["iters"] = o.iters;
    j["blocksize"] = o.blocksize;
    for (const auto& r : rows) {
      nlohmann::json e = {{"matrix", r.name}, {"dtype", r.dtype},       {"bytes", r.bytes}, {"time_us", r.us},
                          {"gbps", r.gbps},   {"pct_of_copy", r.pct}, {"floor_us", r.floor_us}};
      if (r.peer_us >= 0) e["peer_us"] = r.peer_us;
      j["results"].push_back(e);
    }
    for (const auto& r : gemv_rows)
      j["gemv"].push_back({{"matrix", r.shape}, {"m", r.m}, {"dtype", o.gemv_dtype}, {"bytes", r.bytes}, {"time_us", r.us},
                           {"floor_us", r.floor_us}, {"pct_of_floor", r.pct}, {"mode", r.mode}});
    // Written and closed with every error checked: a full disk fails the command.
    const std::string text = j.dump(2) + "\n";
    io::OutputFile f = io::OutputFile::create(o.json_path, /*exclusive=*/false);
    f.write(text.data(), text.size());
    f.close();
  }
}

}  // namespace

void add_bench_command(CLI::App& app, BenchPeer peer) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Time dequantization against the device's copy ceiling (docs/DESIGN.md section 4)");
  cmd->add_option("--backend", o->backend, "backend to time: " + backend_choices())->capture_default_str();
  cmd->add_option("--device", o->device, "the backend's device to time, by index (default: its default device)")
      ->check(CLI::NonNegativeNumber)
      ->option_text("N");
  cmd->add_option("--shapes", o->shapes, "matrices ROWSxCOLS")->delimiter(',')->capture_default_str();
  cmd->add_option("--dtypes", o->dtypes, "output dtypes: " + dtype_choices())->delimiter(',')->capture_default_str();
  cmd->add_option("--mlp", o->mlp, "grouped MLP HDxM: gate, up, down in one launch (empty: skip)")->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations per case, 1 to 100000 (median reported)")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--blocksize", o->blocksize, "absmax blocksize, a power of two from 32 to 4096")->capture_default_str();
  cmd->add_option("--copy-mib", o->copy_mib, "MiB copied to measure the ceiling, 1 to 65536")->check(CLI::Range(1.0, 65536.0))->capture_default_str();
  cmd->add_option("--json", o->json_path, "also write the results as JSON to this file")->option_text("FILE");
  if (peer)
    cmd->add_option("--peer-bnb", o->peer_bnb, "bitsandbytes CUDA library to time its three-launch path (cuda only)")->option_text("LIBRARY");
  cmd->add_option("--gemv-shapes", o->gemv_shapes, "matrix-vector products: W as NxK (empty: skip)")->delimiter(',')->capture_default_str();
  cmd->add_option("--gemv-m", o->gemv_m, "activation rows per product (1..256)")->delimiter(',')->check(CLI::Range(1, NF4_GEMV_MAX_M))->capture_default_str();
  cmd->add_option("--gemv-mode", o->gemv_mode, "the products' contract: exact (bit-exact everywhere) or fast (tensor cores where the device has them)")
      ->check(CLI::IsMember({"exact", "fast"}))
      ->capture_default_str();
  cmd->add_option("--gemv-dtype", o->gemv_dtype, "x and y dtype of the products: " + dtype_choices())->capture_default_str();
  cmd->add_flag("--gemv", o->gemv, "also time the matrix-vector products (--gemv-shapes, --gemv-m, --gemv-dtype)");
  cmd->add_flag("--gemv-only", o->gemv_only, "time only the matrix-vector products (no dequantization shapes)");
  cmd->callback([o, peer] {
    try {
      run_bench(*o, peer);
    } catch (const std::bad_alloc&) {
      fail(NF4_ERR_OUT_OF_MEMORY, "not enough memory for the benchmark's buffers (--shapes, --mlp, --gemv-shapes and --copy-mib set "
           "their sizes)");
    }
  });
}

}  // namespace nf4::cli
