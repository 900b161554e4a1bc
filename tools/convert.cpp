// SPDX-License-Identifier: MIT
// `nf4 convert IN OUT`: every quantized parameter dequantized (through the public C API, on the
// chosen backend), its quant-state companions dropped, its shape restored; every other tensor
// copied byte for byte; `__metadata__` kept ({"format": "pt"} added if missing, as transformers
// requires it). A sharded checkpoint becomes a sharded one with the same shard names and a new
// index. Memory stays bounded: inputs are memory-mapped, outputs are streamed tensor by tensor,
// and quantized tensors are dequantized in batches of at most --batch-mb output bytes (several
// small tensors per grouped call, huge ones split at block boundaries).
//
// Never a partial OUT: everything is written under a temporary name next to OUT, fsync'd, and
// renamed into place; errors and SIGINT / SIGTERM (a flag checked between pieces of work) unwind
// through destructors that remove the temporary files.
#include "tools/convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/io/output.h"
#include "core/io/safetensors.h"
#include "core/io/sharded.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace nf4::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0;
int g_last_signal = 0;

extern "C" void on_signal(int sig) { g_signal = sig; }

// SIGINT / SIGTERM set a flag for the duration of a conversion. SA_RESETHAND: a second signal
// takes the default action (the user insists; the temporary file may then remain).
class InterruptGuard {
 public:
  InterruptGuard() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    for (auto [sig, old] : {std::pair{SIGINT, &old_int_}, std::pair{SIGTERM, &old_term_}}) {
      ::sigaction(sig, nullptr, old);
      // A signal the caller ignores (nohup, a background job) stays ignored.
      if (old->sa_handler != SIG_IGN) ::sigaction(sig, &sa, nullptr);
    }
  }
  ~InterruptGuard() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  void check(const std::string& out) const {
    if (const int sig = g_signal) {
      g_last_signal = sig;
      fail(NF4_ERR_INTERRUPTED, "interrupted by {}: {} was not written and its temporary files were removed",
           sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal", out);
    }
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

bool exists(const std::string& path, struct stat* st) { return ::stat(path.c_str(), st) == 0; }

// One status line on stderr: tensors and bytes done, the average rate since the start (MB/s,
// 10^6 bytes) and the time left at that rate; the final line gives the total time instead.
//   nf4 convert: tensor 12/464, 1.2 GiB / 3.4 GiB (35%), 850.3 MB/s, 2m05s left
//   nf4 convert: tensor 464/464, 3.4 GiB / 3.4 GiB (100%), 861.0 MB/s, done in 4.2s
class Progress {
 public:
  Progress(bool enabled, std::size_t tensors, std::int64_t total)
      : tty_(::isatty(STDERR_FILENO) != 0), enabled_(enabled || tty_), start_(std::chrono::steady_clock::now()) {
    state_.tensors = tensors;
    state_.total_bytes = total;
  }
  ConvertProgress& state() { return state_; }
  void update(bool final = false) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    // A terminal line is cheap to redraw; a log gets a line at most once a second.
    if (!final && now - last_ < (tty_ ? std::chrono::milliseconds(100) : std::chrono::seconds(1))) return;
    last_ = now;
    const double pct = state_.total_bytes ? 100.0 * static_cast<double>(state_.bytes) / static_cast<double>(state_.total_bytes) : 100.0;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(state_.bytes) / elapsed : 0.0;  // bytes per second
    std::string timing;
    if (final) timing = "done in " + duration_text(elapsed);
    else if (state_.bytes > 0 && rate > 0) timing = duration_text(static_cast<double>(state_.total_bytes - state_.bytes) / rate) + " left";
    else timing = "time left unknown";
    std::fprintf(stderr, "%snf4 convert: tensor %zu/%zu, %s / %s (%.0f%%), %.1f MB/s, %s%s%s", tty_ ? "\r" : "", state_.tensor,
                 state_.tensors, human_bytes(static_cast<double>(state_.bytes)).c_str(),
                 human_bytes(static_cast<double>(state_.total_bytes)).c_str(), pct, rate / 1e6, timing.c_str(),
                 tty_ ? "\x1b[K" : "",  // a terminal: clear what a longer previous line left
                 tty_ && !final ? "" : "\n");
    std::fflush(stderr);
  }

  // 4.2 -> "4.2s", 125 -> "2m05s", 7500 -> "2h05m"
  static std::string duration_text(double seconds) {
    if (!(seconds >= 0)) seconds = 0;
    if (seconds < 60) return fmt::format("{:.1f}s", seconds);
    const auto s = static_cast<long long>(seconds + 0.5);
    if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
    return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  }

 private:
  bool tty_, enabled_;
  ConvertProgress state_;
  std::chrono::steady_clock::time_point start_, last_{};
};

struct Plan {
  std::map<std::string, const io::QuantizedParam*, std::less<>> by_weight;  // weight name -> parameter
  std::map<std::string, nf4_dtype, std::less<>> out_dtype;                  // weight name -> output dtype
  std::set<std::string, std::less<>> dropped;                               // companions
};

// The output tensors of one shard, in the shard's file order.
std::vector<io::TensorSpec> shard_specs(const Plan& plan, const io::SafetensorsFile& shard) {
  std::vector<io::TensorSpec> specs;
  for (const io::TensorInfo& t : shard.tensors()) {
    if (plan.dropped.count(t.name)) continue;
    if (const auto p = plan.by_weight.find(t.name); p != plan.by_weight.end())
      specs.push_back({t.name, io::to_safetensors_dtype(plan.out_dtype.find(t.name)->second), p->second->state.shape});
    else
      specs.push_back({t.name, t.dtype, t.shape});
  }
  return specs;
}

// Dequantizes into a bounded buffer, several tensors (or pieces of one) per grouped call, and
// streams the results to the writer in its order.
class ShardWriter {
 public:
  ShardWriter(const Plan& plan, const ContextHandle& ctx, const InterruptGuard& interrupt, Progress& progress,
              const ConvertOptions& options)
      : plan_(plan), ctx_(ctx), interrupt_(interrupt), progress_(progress), options_(options) {}

  // Total output bytes still to come: the buffer never grows past what the whole job needs.
  void set_remaining_hint(std::int64_t bytes) { remaining_hint_ = bytes; }

  void write(const io::SafetensorsFile& shard, io::OutputFile& file) {
    std::map<std::string, std::string> metadata = shard.metadata();
    metadata.emplace("format", "pt");  // transformers refuses a file without it; an existing value is kept
    io::SafetensorsWriter w(file, shard_specs(plan_, shard), metadata);
    writer_ = &w;
    for (const io::TensorSpec& spec : w.order()) {
      if (const auto p = plan_.by_weight.find(spec.name); p != plan_.by_weight.end())
        add_quantized(*p->second, plan_.out_dtype.find(spec.name)->second);
      else
        write_dense(shard, *shard.find(spec.name));
    }
    flush();
    w.finish();
    writer_ = nullptr;
  }

 private:
  struct Pending {
    nf4_tensor t;
    bool last_piece;  // completes a tensor (progress counts tensors)
  };

  void add_quantized(const io::QuantizedParam& p, nf4_dtype dtype) {
    const nf4_tensor full = io::describe(p, dtype, nullptr, 0);
    const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(dtype));
    const std::int64_t g = io::slice_granularity(full);
    const std::int64_t budget_elems = std::max<std::int64_t>(options_.batch_bytes / es, 1);
    const std::int64_t piece = std::max(g, budget_elems / g * g);
    for (std::int64_t first = 0; first < full.numel; first += piece) {
      const std::int64_t count = std::min(piece, full.numel - first);
      const std::int64_t bytes = count * es;
      if (bytes > capacity_ - pending_bytes_) flush();
      if (bytes > capacity_) {  // nothing pending now: grow (a piece may exceed the budget by < one granularity)
        capacity_ = std::max(bytes, std::min(options_.batch_bytes, remaining_hint_));
        buffer_.reset(new std::uint8_t[static_cast<std::size_t>(capacity_)]);
      }
      nf4_tensor t = (first == 0 && count == full.numel) ? full : io::slice(full, first, count);
      t.out = buffer_.get() + pending_bytes_;
      t.out_bytes = bytes;
      pending_.push_back({t, first + count == full.numel});
      pending_bytes_ += bytes;
    }
  }

  void flush() {
    if (pending_.empty()) return;
    interrupt_.check(options_.out);
    std::vector<nf4_tensor> ts;
    for (const auto& p : pending_) ts.push_back(p.t);
    ctx_.dequantize_host(ts.data(), ts.size());
    interrupt_.check(options_.out);
    for (const auto& p : pending_) writer_->write(p.t.out, p.t.out_bytes);  // one tensor per write
    for (const auto& p : pending_) progress_.state().tensor += p.last_piece;
    progress_.state().bytes += pending_bytes_;
    pending_.clear();
    pending_bytes_ = 0;
    report();
  }

  void write_dense(const io::SafetensorsFile& shard, const io::TensorInfo& t) {
    flush();
    const std::uint8_t* src = shard.data(t);
    constexpr std::int64_t kChunk = std::int64_t{64} << 20;
    for (std::int64_t off = 0; off < t.bytes(); off += kChunk) {
      interrupt_.check(options_.out);
      const std::int64_t n = std::min(kChunk, t.bytes() - off);
      writer_->write(src + off, n);
      progress_.state().bytes += n;
      if (off + n < t.bytes()) report();
    }
    ++progress_.state().tensor;
    report();
  }

  void report() {
    progress_.update();
    if (options_.on_progress) options_.on_progress(progress_.state());
    interrupt_.check(options_.out);
  }

  const Plan& plan_;
  const ContextHandle& ctx_;
  const InterruptGuard& interrupt_;
  Progress& progress_;
  const ConvertOptions& options_;
  io::SafetensorsWriter* writer_ = nullptr;
  std::unique_ptr<std::uint8_t[]> buffer_;
  std::int64_t capacity_ = 0, pending_bytes_ = 0, remaining_hint_ = 0;
  std::vector<Pending> pending_;
};

// Refuses to write over IN (by device and inode, so other spellings, symlinks and hard links of
// the same file count) and over an existing OUT without --force.
void check_output(const ConvertOptions& o, const io::Checkpoint& in, bool out_is_dir) {
  struct stat st {};
  if (!exists(o.out, &st)) return;
  const std::string in_file = in.sharded() ? in.dir() : in.shard(0).path();
  if (io::same_file(o.out, in_file) || (!in.sharded() && io::same_file(o.out, in.path())))
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' is the input itself; refusing to overwrite it", o.out);
  if (out_is_dir && !S_ISDIR(st.st_mode))
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' exists and is not a directory (a sharded input needs an output directory)", o.out);
  if (!out_is_dir && S_ISDIR(st.st_mode)) fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' is a directory; name the output file", o.out);
  if (!o.force) fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' exists; pass --force to replace it", o.out);
  if (out_is_dir) {
    // Replacing files inside an existing directory: none of them may be one of IN's shards.
    for (std::size_t i = 0; i < in.shard_count(); ++i)
      if (io::same_file(o.out + "/" + in.shard_name(i), in.shard(i).path()))
        fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}/{}' is input shard {}; refusing to overwrite it", o.out, in.shard_name(i),
             in.shard(i).path());
  }
}

// config.json of a transformers model directory, rewritten for the dense checkpoint: no
// quantization_config, torch_dtype set to the output dtype when every weight has the same one.
// nullopt when there is no config.json.
std::optional<std::string> dense_model_config(const std::string& path, const Plan& plan) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const nlohmann::json parsed = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) fail(NF4_ERR_FORMAT, "{}: not a JSON object", path);
  nlohmann::json config = parsed;
  config.erase("quantization_config");
  std::set<nf4_dtype> dtypes;
  for (const auto& [name, d] : plan.out_dtype) dtypes.insert(d);
  if (dtypes.size() == 1) config["torch_dtype"] = io::torch_dtype_name(*dtypes.begin());
  return config.dump(2) + "\n";
}

}  // namespace

int last_interrupt_signal() { return g_last_signal; }

ConvertResult convert_checkpoint(const ConvertOptions& o) {
  if (o.batch_bytes < 1) fail(NF4_ERR_INVALID_ARGUMENT, "batch size must be positive, got {} bytes", o.batch_bytes);
  InterruptGuard interrupt;
  g_last_signal = 0;
  const io::Checkpoint in(o.in);
  const std::vector<io::QuantizedParam> params = io::find_quantized_params(in);
  Plan plan;
  for (const auto& p : params) {
    nf4_dtype d;
    if (o.dtype) d = *o.dtype;
    else if (!io::parse_torch_dtype(p.state.dtype, &d))
      fail(NF4_ERR_FORMAT, "parameter '{}': quant state dtype '{}' is not float16, bfloat16 or float32; pass --dtype", p.name,
           p.state.dtype);
    plan.by_weight[p.name] = &p;
    plan.out_dtype[p.name] = d;
    for (auto& c : p.companion_names()) plan.dropped.insert(c);
  }
  const bool out_is_dir = in.sharded();
  check_output(o, in, out_is_dir);

  ContextHandle ctx(o.backend);
  ConvertResult result;
  result.backend_device = fmt::format("{} ({})", backend_name(ctx.kind()), ctx.device_name());
  result.quantized = params.size();
  result.dropped = plan.dropped.size();
  result.shards = in.shard_count();
  std::vector<std::vector<io::TensorSpec>> specs;
  std::size_t tensors = 0;
  for (std::size_t i = 0; i < in.shard_count(); ++i) {
    specs.push_back(shard_specs(plan, in.shard(i)));
    tensors += specs.back().size();
    for (const auto& s : specs.back()) result.data_bytes += s.bytes();
  }
  result.dense = tensors - result.quantized;
  Progress progress(o.progress, tensors, result.data_bytes);
  ShardWriter writer(plan, ctx, interrupt, progress, o);
  writer.set_remaining_hint(result.data_bytes);
  interrupt.check(o.out);

  if (!out_is_dir) {
    io::AtomicFile out(o.out);
    writer.write(in.shard(0), out.file());
    interrupt.check(o.out);
    out.commit();
  } else {
    io::TempDir dir(o.out);
    io::ShardIndex index;
    index.metadata = in.index()->metadata;
    index.metadata["total_size"] = result.data_bytes;
    for (std::size_t i = 0; i < in.shard_count(); ++i) {
      if (specs[i].empty()) continue;  // a shard that only held dropped quant-state tensors
      io::OutputFile f = dir.create(in.shard_name(i));
      writer.write(in.shard(i), f);
      f.sync();
      f.close();
      for (const auto& s : specs[i]) index.weight_map[s.name] = in.shard_name(i);
    }
    const auto write_file = [&](const std::string& name, const std::string& text) {
      io::OutputFile f = dir.create(name);
      f.write(text.data(), text.size());
      f.sync();
      f.close();
    };
    // A model directory's config.json comes along without its quantization_config, so that
    // transformers loads the dense copy as an ordinary model.
    if (const auto config = dense_model_config(in.dir() + "/config.json", plan)) write_file("config.json", *config);
    write_file(io::kIndexFileName, io::index_json(index));
    interrupt.check(o.out);
    dir.commit(io::kIndexFileName);
  }
  progress.update(/*final=*/true);
  return result;
}

void add_convert_command(CLI::App& app) {
  struct Args {
    ConvertOptions o;
    std::string dtype, backend = "auto";
    double batch_mb = 256;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("convert", "Dequantize a bitsandbytes 4-bit checkpoint into a dense safetensors checkpoint");
  cmd->add_option("IN", a->o.in, "a .safetensors file, or a sharded checkpoint (its directory or model.safetensors.index.json)")
      ->required();
  cmd->add_option("OUT", a->o.out, "output file (single-file IN) or directory (sharded IN)")->required();
  cmd->add_option("--dtype", a->dtype, "bf16 | fp16 | fp32 (default: each parameter's original dtype from its quant state)");
  cmd->add_option("--backend", a->backend, "auto | cpu | cuda | vulkan")->capture_default_str();
  cmd->add_flag("--force", a->o.force, "replace an existing OUT (IN is never overwritten)");
  cmd->add_flag("--progress", a->o.progress, "report progress on stderr even when it is not a terminal");
  cmd->add_option("--batch-mb", a->batch_mb, "output MiB dequantized per call (bounds memory)")
      ->check(CLI::Range(1.0, 1048576.0))
      ->capture_default_str();
  cmd->callback([a] {
    ConvertOptions o = a->o;
    if (!a->dtype.empty()) o.dtype = parse_dtype_option(a->dtype);
    o.backend = parse_backend_option(a->backend);
    o.batch_bytes = static_cast<std::int64_t>(a->batch_mb * 1048576.0);
    ConvertResult r;
    try {
      r = convert_checkpoint(o);
    } catch (const Error& e) {
      if (e.status() != NF4_ERR_INTERRUPTED) throw;
      std::fprintf(stderr, "nf4 convert: %s\n", e.what());
      throw ExitCode{128 + last_interrupt_signal()};
    }
    std::printf("wrote %s: %zu tensors (%zu dequantized on %s, %zu dense copied, %zu quant-state tensors dropped), %s of data%s\n",
                o.out.c_str(), r.quantized + r.dense, r.quantized, r.backend_device.c_str(), r.dense, r.dropped,
                human_bytes(static_cast<double>(r.data_bytes)).c_str(),
                r.shards > 1 ? fmt::format(" in {} shards", r.shards).c_str() : "");
  });
}

}  // namespace nf4::cli
