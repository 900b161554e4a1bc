// SPDX-License-Identifier: MIT
// `nf4 convert IN OUT`: every quantized parameter dequantized (through the public C API, on the
// chosen backend), its quant-state companions dropped, its shape restored; every other tensor
// copied byte for byte; `__metadata__` kept ({"format": "pt"} added if missing, as transformers
// requires it). A model directory (or an index) becomes a model directory: the same shard names
// (a new index when sharded), every non-weight file carried unchanged, config.json without its
// quantization_config and with the output dtype. A single .safetensors file becomes one file.
// Memory stays bounded: inputs are read with pread (a file truncated meanwhile is an I/O error,
// never SIGBUS), outputs are streamed tensor by tensor, and quantized tensors are dequantized in
// batches of at most --batch-mb output bytes (several small tensors per grouped call, huge ones
// split at block boundaries, whatever their nested blocksize).
//
// Never a partial or mixed OUT: OUT is locked for the whole run (a second convert to it fails at
// once), everything is written under a temporary name next to OUT, fsync'd, and renamed (or, for
// a directory replaced with --force, exchanged) into place; errors and SIGINT / SIGTERM / SIGHUP /
// SIGQUIT / SIGPIPE / SIGXFSZ and every other signal that would end the process (a flag checked
// between pieces of work and inside long loops) unwind through
// destructors that remove the temporary files, and leftovers of a killed run are removed by the
// next run to the same OUT.
#include "tools/convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "core/error.h"
#include "tools/checkpoint/cancel.h"
#include "tools/checkpoint/json_limits.h"
#include "tools/checkpoint/model_dir.h"
#include "core/tensor.h"
#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/output.h"
#include "tools/checkpoint/safetensors.h"
#include "tools/checkpoint/sharded.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace nf4::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0;
int g_last_signal = 0;
std::string g_out;  // OUT, for the interrupt message

extern "C" void on_signal(int sig) { g_signal = sig; }

// Every signal whose default action ends the process, except the faults a program raises on
// itself (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT: it cannot go on after those)
// and SIGKILL (leftovers of a killed run are removed by the next run to the same OUT).
std::vector<int> interrupting_signals() {
  std::vector<int> s = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGXFSZ, SIGXCPU, SIGALRM,
                        SIGUSR1, SIGUSR2, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT};
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) s.push_back(sig);
  return s;
}

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", sig);
}

void check_interrupted() {
  if (const int sig = g_signal) {
    g_last_signal = sig;
    fail(NF4_ERR_INTERRUPTED, "interrupted by {}: {} was not written and its temporary files were removed", signal_name(sig), g_out);
  }
}

// The signals of interrupting_signals() (SIGINT, SIGTERM, SIGHUP for a closed terminal, SIGPIPE
// for a reader of the progress that went away, SIGXFSZ for a file-size limit whose write then
// fails with EFBIG, ...) set a flag for the duration of a conversion, checked between pieces of
// work and inside long loops (io::check_cancel), so every phase stops within a batch and
// unwinds through the destructors that remove the temporary output and the lock. Repeated
// signals only set the flag again: the clean-up still runs.
class InterruptGuard {
 public:
  explicit InterruptGuard(const std::string& out) : signals_(interrupting_signals()), old_(signals_.size()) {
    g_signal = 0;
    g_out = out;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < signals_.size(); ++i) {
      ::sigaction(signals_[i], nullptr, &old_[i]);
      // A signal the caller ignores (nohup, a background job) stays ignored.
      if (old_[i].sa_handler != SIG_IGN) ::sigaction(signals_[i], &sa, nullptr);
    }
    old_hook_ = io::set_cancel_check(check_interrupted);
  }
  ~InterruptGuard() {
    io::set_cancel_check(old_hook_);
    for (std::size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &old_[i], nullptr);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  void check(const std::string&) const { check_interrupted(); }

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> old_;
  io::CancelCheck old_hook_ = nullptr;
};

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

// A bump allocator over one block: the staged inputs and the outputs of one grouped call.
class Arena {
 public:
  std::int64_t capacity() const { return capacity_; }
  std::int64_t used() const { return used_; }
  void reset() { used_ = 0; }
  // Replaces the block (only while nothing is allocated from it).
  void reserve(std::int64_t bytes) {
    block_.reset(new std::uint8_t[static_cast<std::size_t>(bytes)]);
    capacity_ = bytes;
    used_ = 0;
  }
  std::uint8_t* take(std::int64_t bytes) {
    const std::int64_t at = (used_ + kAlign - 1) / kAlign * kAlign;
    NF4_CHECK(at + bytes <= capacity_);
    used_ = at + bytes;
    return block_.get() + at;
  }
  static constexpr std::int64_t kAlign = 64;

 private:
  std::unique_ptr<std::uint8_t[]> block_;
  std::int64_t capacity_ = 0, used_ = 0;
};

// A piece's arrays in the arena (they live until the grouped call that uses them); the statistics
// a piece decodes in a pool reused from piece to piece.
class ArenaStorage final : public io::PieceStorage {
 public:
  ArenaStorage(Arena& arena, io::ArrayPool& scratch) : arena_(arena), scratch_(scratch) {}
  void* take(std::int64_t bytes) override { return arena_.take(bytes); }
  void* scratch(std::int64_t bytes) override { return scratch_.next(bytes); }

 private:
  Arena& arena_;
  io::ArrayPool& scratch_;
};

// Dequantizes into a bounded buffer, several tensors (or pieces of one) per grouped call, and
// streams the results to the writer in its order. Every input byte is read with pread into the
// same buffer (SafetensorsFile::read), never through the mapping.
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

  // Staged bytes of elements [first, first + count) of `p`: output, packed codes, absmax, tables.
  static std::int64_t piece_bytes(const io::QuantizedParam& p, std::int64_t count, std::int64_t es) {
    const std::int64_t blocks = ceil_div(count, std::int64_t{p.state.blocksize});
    const std::int64_t a = Arena::kAlign;
    // absmax: fp32 per block at most (flat, or decoded from the nested form); nested: the nested
    // absmax and code besides.
    std::int64_t in = ceil_div(count, std::int64_t{2}) + blocks * 4 + 16 * 4 + 3 * a;
    if (p.state.nested) in += (blocks / p.state.nested_blocksize + 2) * 4 + 256 * 4 + 2 * a;
    return count * es + in + a;
  }

  void add_quantized(const io::QuantizedParam& p, nf4_dtype dtype) {
    const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(dtype));
    const std::int64_t B = p.state.blocksize;
    const std::int64_t B2 = p.state.nested ? p.state.nested_blocksize : 1;
    const std::int64_t budget_elems = std::max<std::int64_t>(options_.batch_bytes / es, 1);
    // Pieces start at a multiple of the nested block when that fits in the budget (the nested
    // statistics stay as stored); otherwise at any multiple of the block, with the absmax of the
    // piece decoded on the host (so --batch-mb holds for every nested blocksize).
    const std::int64_t g = B * B2 <= budget_elems ? B * B2 : B;
    const std::int64_t piece = std::max(g, budget_elems / g * g);
    for (std::int64_t first = 0; first < p.numel; first += piece) {
      interrupt_.check(options_.out);
      const std::int64_t count = std::min(piece, p.numel - first);
      const std::int64_t need = piece_bytes(p, count, es);
      if (need > arena_.capacity() - arena_.used()) flush();
      if (need > arena_.capacity()) {  // nothing pending now: grow (a piece may exceed the budget by < one block)
        const std::int64_t budget = piece_bytes(p, std::min(piece, budget_elems), es) + (options_.batch_bytes >> 4);
        arena_.reserve(std::max(need, std::min(budget, remaining_hint_ + (std::int64_t{1} << 16))));
      }
      scratch_.reset();
      ArenaStorage storage{arena_, scratch_};
      nf4_tensor t = io::read_piece(p, dtype, first, count, storage);
      t.out = arena_.take(count * es);
      t.out_bytes = count * es;
      pending_.push_back({t, first + count == p.numel});
    }
  }

  void flush() {
    if (pending_.empty()) return;
    interrupt_.check(options_.out);
    std::vector<nf4_tensor> ts;
    for (const auto& p : pending_) ts.push_back(p.t);
    ctx_.dequantize_host(ts.data(), ts.size());
    interrupt_.check(options_.out);
    std::int64_t bytes = 0;
    for (const auto& p : pending_) {
      writer_->write(p.t.out, p.t.out_bytes);  // one tensor per write
      bytes += p.t.out_bytes;
    }
    for (const auto& p : pending_) progress_.state().tensor += p.last_piece;
    progress_.state().bytes += bytes;
    pending_.clear();
    arena_.reset();
    report();
  }

  void write_dense(const io::SafetensorsFile& shard, const io::TensorInfo& t) {
    flush();
    const std::int64_t chunk = std::max<std::int64_t>(1, std::min({kDenseChunk, options_.batch_bytes, t.bytes()}));
    if (static_cast<std::int64_t>(bounce_.size()) < chunk) bounce_.resize(static_cast<std::size_t>(chunk));
    for (std::int64_t off = 0; off < t.bytes(); off += chunk) {
      interrupt_.check(options_.out);
      const std::int64_t n = std::min(chunk, t.bytes() - off);
      shard.read(t, off, bounce_.data(), n);
      writer_->write(bounce_.data(), n);
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

  static constexpr std::int64_t kDenseChunk = std::int64_t{16} << 20;
  const Plan& plan_;
  const ContextHandle& ctx_;
  const InterruptGuard& interrupt_;
  Progress& progress_;
  const ConvertOptions& options_;
  io::SafetensorsWriter* writer_ = nullptr;
  Arena arena_;
  std::int64_t remaining_hint_ = 0;
  std::vector<Pending> pending_;
  std::vector<std::uint8_t> bounce_;
  io::ArrayPool scratch_;  // a piece's nested statistics while its absmax are decoded
};

// Refuses to write over IN (by device and inode, so other spellings, symlinks and hard links of
// the same file count), over an existing OUT without --force, and to replace (delete) a
// directory that does not look like a model directory.
void check_output(const ConvertOptions& o, const io::Checkpoint& in, bool out_is_dir) {
  const bool dir_input = in.sharded() || in.from_directory();
  if (dir_input) {
    // A model directory is carried whole, subfolders included: an OUT inside it would be carried
    // into itself.
    const std::string in_root = io::real_path(in.dir()), out_parent = io::real_path(io::parent_dir(o.out));
    if (out_parent == in_root || out_parent.compare(0, in_root.size() + 1, in_root + "/") == 0)
      fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' is inside the input directory {}; choose a place outside it", o.out, in.dir());
  }
  struct stat st {};
  if (::lstat(o.out.c_str(), &st) != 0) return;
  const std::string in_file = dir_input ? in.dir() : in.shard(0).path();
  if (io::same_file(o.out, in_file) || (!dir_input && io::same_file(o.out, in.path())))
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' is the input itself; refusing to overwrite it", o.out);
  // Only what convert itself could have written is ever replaced: a regular file or a directory.
  // A FIFO or a device stays (with --force, as root, /dev/null would become a file), and so does a
  // symbolic link, dangling or not (the link, not its target, would be replaced).
  if (S_ISLNK(st.st_mode))
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' is a symbolic link; refusing to replace it (name the path it points to, or remove the link)",
         o.out);
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' is {}, not a file or directory that convert writes; refusing to replace it{}", o.out,
         io::file_kind(st.st_mode), o.force ? " (even with --force)" : "");
  if (out_is_dir && !S_ISDIR(st.st_mode))
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' exists and is not a directory (a model directory input needs an output directory)", o.out);
  if (!out_is_dir && S_ISDIR(st.st_mode)) fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' is a directory; name the output file", o.out);
  if (!o.force) fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' exists; pass --force to replace it", o.out);
  if (!out_is_dir) return;
  // --force replaces the directory as a whole and deletes the old one: only a flat directory of
  // files holding a model (or nothing) is deleted that way, never, say, a home directory.
  // Subdirectories (a model's carried folders) only beside weights, the surest sign of a model.
  bool weights = false, config = false, empty = true;
  std::string subdir;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(o.out, ec)) {
    empty = false;
    const std::string name = e.path().filename().string();
    struct stat est {};
    if (::lstat(e.path().c_str(), &est) == 0 && S_ISDIR(est.st_mode)) subdir = name;
    if (io::is_weight_file(name)) weights = true;
    if (name == io::kConfigFileName) config = true;
  }
  if (ec) fail(NF4_ERR_IO, "{}: cannot list the directory: {}", o.out, ec.message());
  if (!subdir.empty() && !weights)
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' holds a directory '{}' but no weights: --force replaces a model directory as a whole and "
         "this does not look like one; refusing to delete it", o.out, io::printable(subdir));
  if (!empty && !weights && !config)
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' holds no weights and no config.json: --force replaces a model directory as a whole and "
         "this does not look like one; refusing to delete it", o.out);
}

void copy_file(const std::string& from, const io::InputPolicy& policy, io::OutputFile& to, std::vector<std::uint8_t>& buffer) {
  const io::InputFile in = io::InputFile::open(from, &policy);
  if (buffer.empty()) buffer.resize(std::size_t{4} << 20);
  for (std::int64_t off = 0; off < in.size();) {
    check_interrupted();
    const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(buffer.size()), in.size() - off);
    in.read_at(off, buffer.data(), n);
    to.write(buffer.data(), static_cast<std::size_t>(n));
    off += n;
  }
}

std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

int last_interrupt_signal() { return g_last_signal; }

ConvertResult convert_checkpoint(const ConvertOptions& options) {
  if (options.batch_bytes < 1) fail(NF4_ERR_INVALID_ARGUMENT, "batch size must be positive, got {} bytes", options.batch_bytes);
  ConvertOptions o = options;
  const bool out_named_dir = !o.out.empty() && o.out.back() == '/';
  o.out = strip_trailing_slashes(o.out);
  g_last_signal = 0;
  InterruptGuard interrupt(o.out);
  io::CheckpointOptions in_options;
  in_options.follow_symlinks = o.follow_symlinks;
  const io::Checkpoint in(o.in, in_options);
  const std::vector<io::QuantizedParam> params = io::find_quantized_params(in);
  Plan plan;
  for (const auto& p : params) {
    nf4_dtype d;
    if (o.dtype) d = *o.dtype;
    else if (!io::parse_torch_dtype(p.state.dtype, &d))
      fail(NF4_ERR_FORMAT, "parameter '{}': quant state dtype '{}' is not float16, bfloat16 or float32; pass --dtype",
           io::printable(p.name), io::printable(p.state.dtype, 16));
    plan.by_weight[p.name] = &p;
    plan.out_dtype[p.name] = d;
    for (auto& c : p.companion_names()) plan.dropped.insert(c);
  }
  // A model directory (or its index) becomes a model directory; a file named alone, a file.
  const bool out_is_dir = in.sharded() || in.from_directory();
  if (!out_is_dir && out_named_dir)
    fail(NF4_ERR_INVALID_ARGUMENT, "OUT '{}' ends with '/', a directory, but IN '{}' is one .safetensors file, which converts to one "
         "file: name that file (e.g. '{}/{}'), or convert the model directory", options.out, o.in, o.out, io::base_name(o.in));
  io::CarriedFiles carried;
  std::optional<std::string> config;
  if (out_is_dir) {
    std::vector<std::string> own;
    for (std::size_t i = 0; i < in.shard_count(); ++i) own.push_back(in.shard_name(i));
    if (in.sharded()) own.push_back(io::base_name(in.index_path()));
    carried = io::carried_files(in.dir(), in.policy(), own);
    const std::string config_path = in.dir() + "/" + io::kConfigFileName;
    struct stat st {};
    if (::lstat(config_path.c_str(), &st) == 0) {
      std::set<nf4_dtype> dtypes;
      for (const auto& [name, d] : plan.out_dtype) dtypes.insert(d);
      config = io::dense_model_config(io::read_text_file(config_path, io::kMaxConfigBytes, &in.policy()),
                                      dtypes.size() == 1 ? io::torch_dtype_name(*dtypes.begin()) : "", config_path);
    }
  }

  // Held until the end: a second convert to the same OUT fails here at once.
  const io::OutputLock lock(o.out);
  io::remove_stale_temporaries(o.out);
  check_output(o, in, out_is_dir);

  ContextHandle ctx(o.backend);
  ConvertResult result;
  result.backend_device = fmt::format("{} ({})", backend_name(ctx.kind()), ctx.device_name());
  result.quantized = params.size();
  result.dropped = plan.dropped.size();
  result.shards = in.shard_count();
  result.carried = carried.files.size() + (config ? 1 : 0);
  result.skipped = carried.skipped;
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
    if (in.sharded()) {
      index.metadata = in.index()->metadata;
      index.metadata["total_size"] = result.data_bytes;
    }
    for (std::size_t i = 0; i < in.shard_count(); ++i) {
      if (specs[i].empty() && in.sharded()) continue;  // a shard that only held dropped quant-state tensors
      io::OutputFile f = dir.create(in.shard_name(i));
      writer.write(in.shard(i), f);
      f.close();
      for (const auto& s : specs[i]) index.weight_map[s.name] = in.shard_name(i);
    }
    const auto write_file = [&](const std::string& name, const std::string& text) {
      io::OutputFile f = dir.create(name);
      f.write(text.data(), text.size());
      f.close();
    };
    // The rest of the model directory comes along, so that transformers loads the dense copy as
    // an ordinary model: config.json without its quantization_config, every other file (in
    // subfolders too) as is. dir.commit() syncs them all at once.
    std::vector<std::uint8_t> buffer;
    for (const std::string& sub : carried.dirs) dir.make_dir(sub);
    for (const std::string& name : carried.files) {
      io::OutputFile f = dir.create(name);
      copy_file(in.dir() + "/" + name, in.policy(), f, buffer);
      f.close();
    }
    if (config) write_file(io::kConfigFileName, *config);
    if (in.sharded()) write_file(io::kIndexFileName, io::index_json(index));
    interrupt.check(o.out);
    dir.commit();
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
  cmd->add_option("OUT", a->o.out, "output file (IN a .safetensors file) or model directory (IN a directory or an index)")->required();
  cmd->add_option("--dtype", a->dtype, "output dtype: bf16, fp16 or fp32 (default: each parameter's original dtype from its quant state)");
  cmd->add_option("--backend", a->backend, "where to dequantize: " + backend_choices())->capture_default_str();
  cmd->add_flag("--force", a->o.force, "replace an existing OUT (IN is never overwritten)");
  cmd->add_flag("--follow-symlinks", a->o.follow_symlinks,
                "read files of a model directory that are symbolic links to files outside it (e.g. a Hugging Face cache snapshot)");
  cmd->add_flag("--progress", a->o.progress, "report progress on stderr even when it is not a terminal");
  cmd->add_option("--batch-mb", a->batch_mb, "output MiB dequantized per call, 1 to 1048576 (bounds memory)")
      ->check(CLI::Range(1.0, 1048576.0))
      ->option_text("MIB")
      ->description("output MiB dequantized per call, 1 to 1048576; bounds memory (default: 256)");
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
                io::terminal_text(o.out).c_str(), r.quantized + r.dense, r.quantized, r.backend_device.c_str(), r.dense, r.dropped,
                human_bytes(static_cast<double>(r.data_bytes)).c_str(),
                r.shards > 1 ? fmt::format(" in {} shards", r.shards).c_str() : "");
    for (const auto& [name, why] : r.skipped) std::printf("  not carried: %s (%s)\n", io::terminal_text(name).c_str(), why.c_str());
  });
}

}  // namespace nf4::cli
