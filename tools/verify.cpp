// SPDX-License-Identifier: MIT
// `nf4 verify FILE`: the bit-exact contract, checked on real data.
//   - Every quantized parameter, in every output dtype, on every available backend (or the one
//     named by --backend), compared bit for bit with the CPU oracle.
//   - Where FILE holds what bitsandbytes itself returned (`<p>.expected.float16|bfloat16|float32`
//     next to `<p>.weight`, as tests/data/golden.safetensors does), the oracle against those.
//   - The fused matrix-vector product (nf4.h, nf4_gemv_desc) of every 2-D quantized weight with
//     random bf16 activations (fixed seed), m = 8 and m = 1, fp32 out, on every backend against the
//     oracle, bit for bit; and its fast contract (NF4_GEMV_FAST): the contract each backend
//     reports, every output within the stated bound of a float64 sum, the m = 1 row equal to row 0
//     of m = 8 bit for bit (two lines per backend; --no-gemv skips both).
//   - With --reference BNBFILE, FILE is a dense checkpoint made by `nf4 convert`: each dequantized
//     tensor must equal the oracle's output for BNBFILE at FILE's dtype and shape, every other
//     tensor must be BNBFILE's byte for byte, and nothing else may be there.
// Prints a summary (with --json: one JSON document on stdout, keys in docs/CLI.md); exits 1 on any
// difference (ExitCode), so scripts and CI can rely on it.
#include <CLI/CLI.hpp>
#include <bit>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/gemv_oracle.h"
#include "backends/cpu/oracle.h"
#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/json_limits.h"
#include "core/gemv.h"
#include "core/half.h"
#include "tools/checkpoint/output.h"
#include "core/tensor.h"
#include "core/types.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace nf4::cli {
namespace {

struct VerifyOptions {
  std::string file, reference, backend;  // backend empty: every available one
  int device = -1;                        // --backend's device index; -1: its default device
  bool json = false;                      // the result as JSON on stdout instead of the table
  std::vector<nf4_dtype> dtypes = [] {
    constexpr auto all = all_dtypes();  // every dtype of core/types.h's table
    return std::vector<nf4_dtype>(all.begin(), all.end());
  }();
  std::int64_t batch_bytes = std::int64_t{64} << 20;
  io::CheckpointOptions input;  // follow_symlinks
  bool gemv = true;
};

// One line of the summary: a comparison and what it found.
struct Tally {
  std::string label, device;
  std::size_t tensors = 0;
  std::int64_t elements = 0, diff_elements = 0, diff_bits = 0, errors = 0;
  std::string skipped;  // why this line did not run
  bool failed() const { return diff_elements != 0 || diff_bits != 0 || errors != 0; }
};

class Report {
 public:
  // Compares n elements of es bytes; adds to the tally and remembers the first differences.
  void compare(Tally& tally, const std::string& what, const std::uint8_t* expected, const std::uint8_t* actual, std::int64_t n,
               std::size_t es, std::int64_t first_index) {
    std::int64_t diff = 0, bits = 0, first = -1;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint8_t* a = expected + i * static_cast<std::int64_t>(es);
      const std::uint8_t* b = actual + i * static_cast<std::int64_t>(es);
      if (std::memcmp(a, b, es) == 0) continue;
      if (first < 0) first = i;
      ++diff;
      for (std::size_t k = 0; k < es; ++k) bits += std::popcount(static_cast<unsigned>(a[k] ^ b[k]));
    }
    tally.elements += n;
    tally.diff_elements += diff;
    tally.diff_bits += bits;
    if (diff) {
      problem(fmt::format("{}: {} of {} elements differ ({} bits), first at element {}: got {}, expected {}", what, diff, n, bits,
                          first_index + first, hex(actual + first * static_cast<std::int64_t>(es), es),
                          hex(expected + first * static_cast<std::int64_t>(es), es)));
    }
  }
  void error(Tally& tally, const std::string& message) {
    ++tally.errors;
    problem(message);
  }
  // n elements checked against a tolerance (not bits), `failing` of them outside it.
  void within(Tally& tally, std::int64_t n, std::int64_t failing, const std::string& message) {
    tally.elements += n;
    tally.diff_elements += failing;
    if (failing) problem(message);
  }
  void print() const {
    for (const auto& p : problems_) std::printf("  %s\n", p.c_str());
    if (hidden_) std::printf("  ... and %zu more\n", hidden_);
  }
  bool any() const { return !problems_.empty(); }
  const std::vector<std::string>& problems() const { return problems_; }
  std::size_t hidden() const { return hidden_; }

 private:
  void problem(std::string m) {
    if (problems_.size() < 20) problems_.push_back(std::move(m));
    else ++hidden_;
  }
  static std::string hex(const std::uint8_t* p, std::size_t es) {
    std::string s = "0x";
    for (std::size_t k = es; k-- > 0;) s += fmt::format("{:02x}", p[k]);  // little endian: high byte first
    return s;
  }
  std::vector<std::string> problems_;
  std::size_t hidden_ = 0;
};

// Calls f(piece, first) over pieces of `p` of at most ~budget output bytes (at least one nested
// block), each read from the files with pread: memory follows the budget, not the file, and a file
// truncated meanwhile is an I/O error naming it.
template <typename F>
void for_each_piece(const io::QuantizedParam& p, nf4_dtype dtype, std::int64_t budget_bytes, io::PieceBuffers& buffers, F&& f) {
  const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(dtype));
  const std::int64_t g = io::piece_granularity(p);
  const std::int64_t piece = std::max(g, std::max<std::int64_t>(budget_bytes / es, 1) / g * g);
  for (std::int64_t first = 0; first < p.numel; first += piece) {
    const std::int64_t count = std::min(piece, p.numel - first);
    f(io::read_piece(p, dtype, first, count, buffers), first);
  }
}

struct BackendRun {
  Tally tally;
  std::unique_ptr<ContextHandle> ctx;
};

std::vector<BackendRun> open_backends(const VerifyOptions& o, Report& report) {
  std::vector<BackendRun> runs;
  if (!o.backend.empty()) {
    BackendRun r;
    const nf4_backend_kind kind = parse_backend_option(o.backend);
    r.ctx = std::make_unique<ContextHandle>(kind, parse_device_option(kind, o.device));
    r.tally.label = backend_name(r.ctx->kind()) + " vs oracle";
    r.tally.device = r.ctx->device_name();
    runs.push_back(std::move(r));
    return runs;
  }
  for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
    nf4_backend_info info{};
    if (nf4_backend_get_info(i, &info) != NF4_OK) continue;
    BackendRun r;
    r.tally.label = std::string(info.name) + " vs oracle";
    r.tally.device = info.device_name ? info.device_name : "";
    if (!info.available) {
      r.tally.skipped = r.tally.device;  // the registry's reason
    } else {
      try {
        r.ctx = std::make_unique<ContextHandle>(info.kind);
        r.tally.device = r.ctx->device_name();
      } catch (const Error& e) {
        report.error(r.tally, fmt::format("backend {} is listed as available but failed to start: {}", info.name, e.what()));
      }
    }
    runs.push_back(std::move(r));
  }
  return runs;
}

// The fast contract of product `g` (bf16 x, fp32 y; `exact` its exact result) on one backend:
// where the backend runs it (nf4_gemv_mode_used), each output within gemv_fast_bound of the
// float64 sum over the weights rounded to bf16 and the m = 1 row equal to row 0 of all rows bit for
// bit; where it runs the exact contract instead, the exact bits.
// `all` (the exact check's result buffer, free again by then) and `scratch` keep their memory
// between calls: one allocation per weight, not per piece, so memory follows the budget, also
// under a quarantining allocator (ASan).
struct FastScratch {
  std::vector<std::uint8_t> one;
  std::vector<double> row;
};
void verify_fast(const nf4_gemv_desc& g, const std::vector<std::uint8_t>& exact, const std::string& what, const std::string& name,
                 ContextHandle& ctx, Tally& tally, Report& report, std::vector<std::uint8_t>& all, FastScratch& scratch) {
  nf4_gemv_desc f = g;
  f.mode = NF4_GEMV_FAST;
  nf4_gemv_mode used = NF4_GEMV_EXACT;
  if (nf4_gemv_mode_used(ctx.get(), &f, &used) != NF4_OK) {
    report.error(tally, fmt::format("{} on {}: {}", what, name, nf4_last_error(ctx.get())));
    return;
  }
  std::vector<std::uint8_t>& one = scratch.one;
  all.assign(static_cast<std::size_t>(g.m * g.n) * 4, 0xA5);
  one.assign(static_cast<std::size_t>(g.n) * 4, 0x5A);
  for (auto* y : {&all, &one}) {
    nf4_gemv_desc h = f;
    h.m = y == &all ? g.m : 1;
    h.y = y->data();
    h.y_bytes = static_cast<std::int64_t>(y->size());
    if (nf4_gemv_host(ctx.get(), &h) != NF4_OK) {
      report.error(tally, fmt::format("{} fast m={} on {}: {}", what, h.m, name, nf4_last_error(ctx.get())));
      return;
    }
  }
  report.compare(tally, fmt::format("{} fast: m=1 against row 0 of m={} on {}", what, g.m, name), all.data(), one.data(), g.n, 4, 0);
  if (used == NF4_GEMV_EXACT) {
    report.compare(tally, fmt::format("{} fast (the exact contract ran) m={} on {}", what, g.m, name), exact.data(), all.data(),
                   g.m * g.n, 4, 0);
    return;
  }
  // The weights as nf4_dequantize writes them in bf16, one row at a time.
  const nf4_tensor& w = *g.weight;
  float values[16];
  value_table(w, values);
  std::vector<double>& row = scratch.row;
  row.assign(static_cast<std::size_t>(g.k), 0.0);
  std::int64_t outside = 0, first = -1;
  for (std::int64_t r = 0; r < g.n; ++r) {
    for (std::int64_t c = 0; c < g.k; ++c)
      row[static_cast<std::size_t>(c)] = float_from_bf16(bf16_from_float(cpu::oracle_weight(w, values, r * g.k + c)));
    for (std::int32_t j = 0; j < g.m; ++j) {
      double sum = 0, abs_sum = 0;
      for (std::int64_t c = 0; c < g.k; ++c) {
        const double p = row[static_cast<std::size_t>(c)] * cpu::gemv_x_value(g.x, g.x_dtype, j * g.k + c);
        sum += p;
        abs_sum += p < 0 ? -p : p;
      }
      float y = 0;
      std::memcpy(&y, all.data() + static_cast<std::size_t>(j * g.n + r) * 4, 4);
      const double err = static_cast<double>(y) - sum;
      if (!((err < 0 ? -err : err) <= gemv_fast_bound(g.k, abs_sum, sum, g.y_dtype))) {
        if (first < 0) first = j * g.n + r;
        ++outside;
      }
    }
  }
  report.within(tally, g.m * g.n, outside,
                fmt::format("{} fast m={} on {}: {} of {} outputs past the stated bound (first: row {}, output {})", what, g.m, name,
                            outside, g.m * g.n, first / g.n, first % g.n));
}

// The product y[m, n] = x[m, k] @ W^T of every 2-D weight [n, k]: the oracle at m = 8, then every
// backend at m = 8 and at m = 1 (whose row must equal row 0 of the m = 8 result: a row does not
// depend on the others). Rows of W do not depend on each other either, so the check runs over
// pieces of whole rows, each read as a weight of its own (io::read_piece): y stays within
// `budget_bytes` whatever the shape (an [N, 1] weight would otherwise need 8 x N x 4 bytes twice,
// 128 bytes of memory per byte of file).
void verify_gemv(const std::vector<io::QuantizedParam>& params, std::int64_t budget_bytes, std::vector<BackendRun>& runs,
                 std::vector<Tally>& tallies, Report& report) {
  std::vector<Tally> gemv(runs.size()), fast(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    gemv[i].label = "gemv " + runs[i].tally.label;
    fast[i].label = "fast " + runs[i].tally.label.substr(0, runs[i].tally.label.find(' ')) + " vs bound";
    gemv[i].device = fast[i].device = runs[i].tally.device;
    gemv[i].skipped = fast[i].skipped = runs[i].tally.skipped;
  }
  std::uint64_t seed = 0x6e66342d67656d76ull;  // fixed: the same activations on every run
  const auto next = [&seed] {
    std::uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  io::PieceBuffers buffers;
  for (const auto& p : params) {
    if (p.state.shape.size() != 2) continue;
    const std::int64_t n = p.state.shape[0], k = p.state.shape[1];
    if (n == 0 || k == 0) continue;
    constexpr std::int32_t m = 8;
    std::vector<std::uint16_t> x(static_cast<std::size_t>(m * k));
    for (auto& v : x) {
      // Roughly normal: the sum of four uniforms, rounded to bf16.
      float f = -2.0f;
      for (int j = 0; j < 4; ++j) f += static_cast<float>(next() >> 40) / 16777216.0f;
      v = bf16_from_float(f);
    }
    for (std::size_t i = 0; i < runs.size(); ++i) gemv[i].tensors += runs[i].ctx ? 1 : 0, fast[i].tensors += runs[i].ctx ? 1 : 0;
    // A piece starts where read_piece can start one: a row count whose elements are a whole number
    // of (nested) blocks.
    const std::int64_t g = io::piece_granularity(p);
    const std::int64_t unit = g / std::gcd(g, k);
    const std::int64_t piece_rows = std::max(unit, std::max<std::int64_t>(budget_bytes / (m * 4), 1) / unit * unit);
    std::vector<std::uint8_t> want, got;
    FastScratch fast_scratch;
    for (std::int64_t r0 = 0; r0 < n; r0 += piece_rows) {
      const std::int64_t rows_here = std::min(piece_rows, n - r0);
      const nf4_tensor w = io::read_piece(p, NF4_DTYPE_F32, r0 * k, rows_here * k, buffers);
      nf4_gemv_desc g{};
      g.weight = &w;
      g.n = rows_here;
      g.k = k;
      g.m = m;
      g.x_dtype = NF4_DTYPE_BF16;
      g.x = x.data();
      g.y_dtype = NF4_DTYPE_F32;
      want.assign(static_cast<std::size_t>(m * rows_here) * 4, 0x5A);
      g.y = want.data();
      g.y_bytes = static_cast<std::int64_t>(want.size());
      cpu::oracle_gemv(g);
      const std::string what =
          rows_here == n ? fmt::format("gemv {} [{} x {}]", io::terminal_text(p.name), n, k)
                         : fmt::format("gemv {} [{} x {}] rows {}..{}", io::terminal_text(p.name), n, k, r0, r0 + rows_here - 1);
      for (std::size_t i = 0; i < runs.size(); ++i) {
        if (!runs[i].ctx) continue;
        const std::string name = backend_name(runs[i].ctx->kind());
        for (std::int32_t rows : {m, 1}) {
          got.assign(static_cast<std::size_t>(rows * rows_here) * 4, 0xA5);
          nf4_gemv_desc h = g;
          h.m = rows;
          h.y = got.data();
          h.y_bytes = static_cast<std::int64_t>(got.size());
          const nf4_status s = nf4_gemv_host(runs[i].ctx->get(), &h);
          if (s != NF4_OK) {
            report.error(gemv[i], fmt::format("{} m={} on {}: {}", what, rows, name, nf4_last_error(runs[i].ctx->get())));
            continue;
          }
          report.compare(gemv[i], fmt::format("{} m={} on {}", what, rows, name), want.data(), got.data(), rows * rows_here, 4, 0);
        }
        verify_fast(g, want, what, name, *runs[i].ctx, fast[i], report, got, fast_scratch);
      }
    }
  }
  for (auto& t : gemv) tallies.push_back(t);
  for (auto& t : fast) tallies.push_back(t);
}

// FILE's quantized parameters on every backend, and against its expected tensors.
void verify_quantized(const VerifyOptions& o, const io::Checkpoint& ck, const std::vector<io::QuantizedParam>& params,
                      std::vector<Tally>& tallies, Report& report) {
  Tally expected;
  expected.label = "oracle vs expected";
  expected.device = "tensors stored in the file";
  std::vector<BackendRun> runs = open_backends(o, report);
  std::vector<std::uint8_t> ref, out, stored;
  io::PieceBuffers buffers;
  for (const auto& p : params) {
    for (nf4_dtype d : o.dtypes) {
      const std::size_t es = nf4_dtype_size(d);
      io::TensorRef exp = ck.find(io::expected_tensor_name(p.name, d));
      const std::string what = fmt::format("{} {}", io::terminal_text(p.name), dtype_label(d));
      if (exp) {
        ++expected.tensors;
        if (exp->dtype != io::to_safetensors_dtype(d) || exp->shape != p.state.shape) {
          report.error(expected, fmt::format("{}: '{}' is {} {}, expected {} {}", what, io::terminal_text(exp->name), io::dtype_name(exp->dtype),
                                             shape_text(exp->shape), io::dtype_name(io::to_safetensors_dtype(d)),
                                             shape_text(p.state.shape)));
          exp = {};
        }
      }
      for (auto& r : runs) r.tally.tensors += r.ctx ? 1 : 0;
      for_each_piece(p, d, o.batch_bytes, buffers, [&](nf4_tensor t, std::int64_t first) {
        const std::int64_t bytes = t.numel * static_cast<std::int64_t>(es);
        ref.assign(static_cast<std::size_t>(bytes), 0x5A);
        t.out = ref.data();
        t.out_bytes = bytes;
        cpu::oracle_dequantize(t);
        if (exp) {
          stored.resize(static_cast<std::size_t>(bytes));
          exp.read(first * static_cast<std::int64_t>(es), stored.data(), bytes);
          report.compare(expected, what + " oracle vs " + io::terminal_text(exp->name), stored.data(), ref.data(), t.numel, es, first);
        }
        for (auto& r : runs) {
          if (!r.ctx) continue;
          out.assign(static_cast<std::size_t>(bytes), 0xA5);
          t.out = out.data();
          try {
            r.ctx->dequantize_host(&t, 1);
          } catch (const Error& e) {
            report.error(r.tally, fmt::format("{} on {}: {}", what, backend_name(r.ctx->kind()), e.what()));
            continue;
          }
          report.compare(r.tally, fmt::format("{} on {}", what, backend_name(r.ctx->kind())), ref.data(), out.data(), t.numel, es, first);
        }
      });
    }
  }
  if (expected.tensors) tallies.push_back(expected);
  for (auto& r : runs) tallies.push_back(r.tally);
  // The product's y of the 8 rows is 32 bytes per row of W: an eighth of the batch keeps it
  // within what one dequantize check holds.
  if (o.gemv) verify_gemv(params, o.batch_bytes / 8, runs, tallies, report);
}

// FILE is a dense conversion of `reference`.
void verify_against_reference(const VerifyOptions& o, const io::Checkpoint& ck, std::vector<Tally>& tallies, Report& report) {
  const io::Checkpoint ref(o.reference, o.input);
  const auto rparams = io::find_quantized_params(ref);
  Tally deq, dense;
  deq.label = "dequantized vs oracle";
  deq.device = "oracle on " + io::base_name(o.reference);
  dense.label = "pass-through tensors";
  dense.device = "bytes of " + io::base_name(o.reference);
  std::set<std::string, std::less<>> accounted;
  const auto owned = io::owned_tensors(rparams);
  std::vector<std::uint8_t> buf, got;
  io::PieceBuffers buffers;
  for (const auto& p : rparams) {
    accounted.insert(p.name);
    ++deq.tensors;
    const io::TensorRef t = ck.find(p.name);
    if (!t) {
      report.error(deq, fmt::format("{}: missing from {}", io::terminal_text(p.name), io::terminal_text(o.file)));
      continue;
    }
    const auto d = io::to_output_dtype(t->dtype);
    if (!d || t->shape != p.state.shape) {
      report.error(deq, fmt::format("{}: is {} {}, expected F16, BF16 or F32 of shape {}", io::terminal_text(p.name), io::dtype_name(t->dtype),
                                    shape_text(t->shape), shape_text(p.state.shape)));
      continue;
    }
    const std::size_t es = nf4_dtype_size(*d);
    for_each_piece(p, *d, o.batch_bytes, buffers, [&](nf4_tensor s, std::int64_t first) {
      const std::int64_t bytes = s.numel * static_cast<std::int64_t>(es);
      buf.assign(static_cast<std::size_t>(bytes), 0x5A);
      s.out = buf.data();
      s.out_bytes = bytes;
      cpu::oracle_dequantize(s);
      got.resize(static_cast<std::size_t>(bytes));
      t.read(first * static_cast<std::int64_t>(es), got.data(), bytes);
      report.compare(deq, fmt::format("{} ({})", io::terminal_text(p.name), dtype_label(*d)), buf.data(), got.data(), s.numel, es, first);
    });
  }
  for (std::size_t i = 0; i < ref.shard_count(); ++i)
    for (const io::TensorInfo& rt : ref.shard(i).tensors()) {
      if (owned.count(rt.name)) continue;
      accounted.insert(rt.name);
      ++dense.tensors;
      const io::TensorRef t = ck.find(rt.name);
      if (!t) {
        report.error(dense, fmt::format("{}: missing from {}", io::terminal_text(rt.name), io::terminal_text(o.file)));
        continue;
      }
      if (t->dtype != rt.dtype || t->shape != rt.shape) {
        report.error(dense, fmt::format("{}: is {} {}, the reference has {} {}", io::terminal_text(rt.name), io::dtype_name(t->dtype), shape_text(t->shape),
                                        io::dtype_name(rt.dtype), shape_text(rt.shape)));
        continue;
      }
      // In chunks of whole elements, read from both files.
      const std::int64_t es = static_cast<std::int64_t>(io::dtype_size(rt.dtype));
      const std::int64_t chunk = std::max<std::int64_t>(1, std::min(o.batch_bytes, rt.bytes()) / es) * es;
      for (std::int64_t off = 0; off < rt.bytes(); off += chunk) {
        const std::int64_t n = std::min(chunk, rt.bytes() - off);
        buf.resize(static_cast<std::size_t>(n));
        got.resize(static_cast<std::size_t>(n));
        ref.shard(i).read(rt, off, buf.data(), n);
        t.read(off, got.data(), n);
        report.compare(dense, io::terminal_text(rt.name), buf.data(), got.data(), n / es, static_cast<std::size_t>(es), off / es);
      }
    }
  for (std::size_t i = 0; i < ck.shard_count(); ++i)
    for (const io::TensorInfo& t : ck.shard(i).tensors())
      if (!accounted.count(t.name)) report.error(dense, fmt::format("{}: not in the reference (a leftover quant-state tensor?)", io::terminal_text(t.name)));
  tallies.push_back(deq);
  tallies.push_back(dense);
}

// docs/CLI.md describes every key; keys are only ever added.
nlohmann::json result_json(const VerifyOptions& o, std::size_t params, const std::vector<Tally>& tallies, const Report& report,
                           std::int64_t compared, std::int64_t diff_elems, std::int64_t diff_bits, std::int64_t errors) {
  using nlohmann::json;
  json dtypes = json::array();
  for (auto d : o.dtypes) dtypes.push_back(dtype_label(d));
  json checks = json::array();
  for (const auto& t : tallies)
    checks.push_back({{"check", t.label},
                      {"device", t.device},
                      {"skipped", t.skipped.empty() ? json(nullptr) : json(t.skipped)},
                      {"tensors", t.tensors},
                      {"elements", t.elements},
                      {"diff_elements", t.diff_elements},
                      {"diff_bits", t.diff_bits},
                      {"errors", t.errors},
                      {"ok", t.skipped.empty() && !t.failed()}});
  const bool failed = diff_elems || diff_bits || errors;
  return {{"file", o.file},
          {"reference", o.reference.empty() ? json(nullptr) : json(o.reference)},
          {"quantized_parameters", params},
          {"dtypes", dtypes},
          {"checks", checks},
          {"problems", report.problems()},
          {"problems_not_shown", report.hidden()},
          {"totals", {{"compared_elements", compared}, {"diff_elements", diff_elems}, {"diff_bits", diff_bits}, {"errors", errors}}},
          {"result", failed ? "failed" : "ok"}};
}

void verify(const VerifyOptions& o) {
  const io::Checkpoint ck(o.file, o.input);
  const auto params = io::find_quantized_params(ck);
  if (params.empty() && o.reference.empty())
    fail(NF4_ERR_INVALID_ARGUMENT, "{} holds no quantized parameters; to check a dense conversion pass --reference BNBFILE", o.file);
  std::string dtypes;
  for (auto d : o.dtypes) dtypes += fmt::format("{}{}", dtypes.empty() ? "" : ", ", dtype_label(d));
  if (!o.json) {
    std::printf("verify %s: %zu quantized parameters; output dtypes %s\n", io::terminal_text(o.file).c_str(), params.size(), dtypes.c_str());
    std::fflush(stdout);  // the checks can take minutes: say at once what is being checked
  }

  std::vector<Tally> tallies;
  Report report;
  if (!params.empty()) verify_quantized(o, ck, params, tallies, report);
  if (!o.reference.empty()) verify_against_reference(o, ck, tallies, report);

  if (!o.json)
    std::printf("  %-24s %-36s %8s %14s %12s %10s %7s\n", "check", "device", "tensors", "elements", "diff elems", "diff bits", "errors");
  std::int64_t total_bits = 0, total_elems = 0, total_errors = 0, compared = 0;
  for (const auto& t : tallies) {
    if (!t.skipped.empty()) {
      if (!o.json) std::printf("  %-24s skipped: %s\n", t.label.c_str(), t.skipped.c_str());
      continue;
    }
    if (!o.json)
      std::printf("  %-24s %-36s %8zu %14lld %12lld %10lld %7lld\n", t.label.c_str(), t.device.substr(0, 36).c_str(), t.tensors,
                  static_cast<long long>(t.elements), static_cast<long long>(t.diff_elements), static_cast<long long>(t.diff_bits),
                  static_cast<long long>(t.errors));
    total_bits += t.diff_bits;
    total_elems += t.diff_elements;
    total_errors += t.errors;
    compared += t.elements;
  }
  const bool failed = total_elems || total_bits || total_errors;
  if (o.json) {
    std::printf("%s\n", result_json(o, params.size(), tallies, report, compared, total_elems, total_bits, total_errors)
                             .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                             .c_str());
  } else {
    if (report.any()) {
      std::printf("differences:\n");
      report.print();
    }
    if (failed)
      std::printf("result: FAILED: %lld differing elements (%lld bits), %lld errors\n", static_cast<long long>(total_elems),
                  static_cast<long long>(total_bits), static_cast<long long>(total_errors));
    else
      std::printf("result: OK: 0 differing bits in %lld compared elements\n", static_cast<long long>(compared));
  }
  if (failed) {
    std::fflush(stdout);
    throw ExitCode{1};
  }
}

}  // namespace

void add_verify_command(CLI::App& app) {
  struct Args {
    VerifyOptions o;
    std::string dtype;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("verify", "Check every backend (and the file's expected tensors) against the CPU oracle, bit for bit");
  cmd->add_option("FILE", a->o.file, "a .safetensors file or sharded checkpoint")->required();
  CLI::Option* backend =
      cmd->add_option("--backend", a->o.backend, "check only this backend: auto | cpu | cuda | vulkan (default: every available one)");
  cmd->add_option("--device", a->o.device, "check --backend's device of this index (default: its default device)")
      ->check(CLI::NonNegativeNumber)
      ->needs(backend)
      ->option_text("N");
  cmd->add_option("--dtype", a->dtype, "check only this output dtype: bf16 | fp16 | fp32 (default: all three)");
  cmd->add_flag("!--no-gemv", a->o.gemv, "skip the matrix-vector product check");
  cmd->add_option("--reference", a->o.reference, "FILE is a dense conversion of this bnb-4bit checkpoint: check it against the oracle")
      ->option_text("BNBFILE");
  cmd->add_flag("--follow-symlinks", a->o.input.follow_symlinks, "read files of a model directory that link outside it");
  cmd->add_flag("--json", a->o.json, "print the result as one JSON document instead of the table (keys: docs/CLI.md)");
  cmd->callback([a] {
    VerifyOptions o = a->o;
    if (!a->dtype.empty()) o.dtypes = {parse_dtype_option(a->dtype)};
    if (!o.backend.empty()) parse_device_option(parse_backend_option(o.backend), o.device);  // usage errors before any work
    verify(o);
  });
}

}  // namespace nf4::cli
