// SPDX-License-Identifier: MIT
// ---- nf4_checkpoint: checkpoint I/O ------------------------------------------------------------------
// The library behind `nf4 convert / inspect / verify` (tools/checkpoint/, CMake target nf4_checkpoint): it opens
// a transformers checkpoint (one .safetensors file, a sharded set with its
// model.safetensors.index.json, or a model directory), finds the bitsandbytes 4-bit parameters,
// checks them and describes each as an nf4_tensor, which then goes through the public C API like
// any other caller's; it writes safetensors files, indexes and dense model directories. It is not
// part of libnf4 (nf4::nf4), whose callers hand it tensors, not files: only the CLI, the tests
// and the fuzzers link it, and tools/check_no_lab.sh fails if libnf4 holds an nf4::io symbol.
// Its interface is internal (namespace nf4::io) and may change. This header is the entry point;
// safetensors.h, sharded.h, model_dir.h and output.h are the parts it builds on.
//
// What it guarantees for files from strangers (docs/RELIABILITY.md section 4):
//  - Only regular files are opened, without blocking (a FIFO or a device is refused by kind), and
//    a file found through a model directory or an index must resolve inside that directory
//    unless the caller allows symbolic links out of it (file_open.h); an index's shard names are
//    plain file names (sharded.h).
//  - All JSON is bounded (json_limits.h): a size limit per file checked before parsing (header
//    100 MB, index 64 MiB, config.json 16 MiB, quant state 64 KiB), at most 64 levels of nesting,
//    repeated keys refused, no recursion; the safetensors header is parsed as a stream on the same
//    rules into its tensor records only.
//  - Everything is validated before anything is used: dtypes, shapes against sizes, offsets in
//    range and not overlapping, and each quantized parameter's tensors and quant state against
//    each other (no tensor in two roles or two parameters).
//  - Tensor data is read with pread: a file truncated by another process meanwhile is
//    NF4_ERR_IO naming it, never SIGBUS. (The pointer accessors that map the file are for
//    callers that own it: tests and fuzzers.)
//  - Failures are nf4::Error exceptions (NF4_ERR_IO, NF4_ERR_FORMAT) naming the file and what is
//    wrong, never quoting the file's contents beyond a short escaped name (printable()).
//  - Long loops honour a cancellation hook (cancel.h); outputs appear whole or not at all: a
//    temporary beside the destination, fsync'd and renamed, removed on failure, and an exclusive
//    lock per output path (output.h).
// ---------------------------------------------------------------------------------------------
//
// bitsandbytes 4-bit parameters inside a transformers checkpoint (docs/DESIGN.md section 1): each
// quantized parameter `p` is found by its `p.quant_state.bitsandbytes__nf4|fp4` key; its JSON
// quant state and companion tensors (`p.absmax`, `p.quant_map`, `p.nested_absmax`,
// `p.nested_quant_map`) are checked against each other before anything is dequantized.
// A checkpoint is one .safetensors file or a sharded set (tools/checkpoint/sharded.h); a parameter's
// companion tensors may live in a different shard than its weight.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tools/checkpoint/safetensors.h"
#include "tools/checkpoint/sharded.h"
#include "nf4/nf4.h"

namespace nf4::io {

struct QuantState {
  nf4_quant_type quant_type = NF4_QUANT_NF4;
  int blocksize = 64;
  std::string dtype;                 // the original dtype, e.g. "bfloat16"
  std::vector<std::int64_t> shape;   // the original shape
  bool nested = false;
  int nested_blocksize = 0;
  float nested_offset = 0.0f;        // JSON number parsed as double, rounded to float
};

// Real quant states are about 200 bytes.
inline constexpr std::int64_t kMaxQuantStateBytes = 64 << 10;

// Parses a quant-state JSON text; throws nf4::Error(NF4_ERR_FORMAT) naming the bad field.
QuantState parse_quant_state(std::string_view json_text);

// Maps "bfloat16" / "float16" / "float32" (and torch.* spellings) to an output dtype.
bool parse_torch_dtype(std::string_view name, nf4_dtype* out);

// A tensor somewhere in a checkpoint: its header entry and the shard that holds it.
struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
  explicit operator bool() const { return info != nullptr; }
  const TensorInfo* operator->() const { return info; }
  // Bytes [offset, offset + bytes) of the tensor, read with pread (SafetensorsFile::read).
  void read(std::int64_t offset, void* dst, std::int64_t bytes) const { file->read(*info, offset, dst, bytes); }
  // Through the mapping (SafetensorsFile::data: not truncation-safe, for callers that own the file).
  const std::uint8_t* data() const { return file->data(*info); }
};

struct CheckpointOptions {
  // Read shards (and, in convert, the files carried along) that resolve outside the input
  // directory through symbolic links. Off: such a file is an error naming it.
  bool follow_symlinks = false;
};

// A checkpoint opened for reading: every shard validated (tools/checkpoint/safetensors.h), the shards and
// the index checked against each other (each tensor in exactly one shard, as the weight_map says).
class Checkpoint {
 public:
  // `path`: a .safetensors file; a model.safetensors.index.json; or a directory holding an index
  // or exactly one .safetensors file. A directory whose index leaves out a .safetensors file beside
  // it (model.safetensors next to shards) is refused, naming both: transformers would load that
  // file and nf4 the shards. Throws nf4::Error (NF4_ERR_IO / NF4_ERR_FORMAT).
  explicit Checkpoint(const std::string& path, const CheckpointOptions& options = {});

  bool sharded() const { return index_.has_value(); }
  bool from_directory() const { return from_directory_; }  // `path` named a directory
  // The rules the checkpoint's own files were opened under (root: the input directory's real path).
  const InputPolicy& policy() const { return policy_; }
  const std::string& path() const { return path_; }      // as given
  const std::string& dir() const { return dir_; }        // the directory holding the shards
  const std::string& index_path() const { return index_path_; }  // empty when not sharded
  const ShardIndex* index() const { return index_ ? &*index_ : nullptr; }
  std::size_t shard_count() const { return shards_.size(); }
  const SafetensorsFile& shard(std::size_t i) const { return *shards_[i]; }
  const std::string& shard_name(std::size_t i) const { return shard_names_[i]; }  // file name in dir()
  std::size_t tensor_count() const { return where_.size(); }
  TensorRef find(std::string_view name) const;

 private:
  std::string path_, dir_, index_path_;
  bool from_directory_ = false;
  InputPolicy policy_;
  std::optional<ShardIndex> index_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::string> shard_names_;
  std::map<std::string, std::size_t, std::less<>> where_;  // tensor name -> shard
};

struct QuantizedParam {
  std::string name;  // the parameter, e.g. "model.layers.0.mlp.up_proj.weight"
  QuantState state;
  std::int64_t numel = 0;
  const TensorInfo* weight = nullptr;
  const TensorInfo* absmax = nullptr;
  const TensorInfo* quant_map = nullptr;
  const TensorInfo* nested_absmax = nullptr;     // nested only
  const TensorInfo* nested_quant_map = nullptr;  // nested only
  const TensorInfo* quant_state = nullptr;
  // The file holding each tensor above (one file unless a sharded checkpoint split them).
  struct Files {
    const SafetensorsFile *weight = nullptr, *absmax = nullptr, *quant_map = nullptr, *nested_absmax = nullptr,
                          *nested_quant_map = nullptr, *quant_state = nullptr;
  } files;
  // Every tensor name that belongs to this parameter besides the weight itself (dropped from a
  // dense copy).
  std::vector<std::string> companion_names() const;
};

// All quantized parameters of a file, in file order, each fully validated (dtypes, sizes and the
// quant state agree, no tensor used by two parameters or in two roles). Throws
// nf4::Error(NF4_ERR_FORMAT) naming the parameter (or both parameters) otherwise, and for a U8
// tensor that has quant-state companions (`.absmax`, `.quant_map`, ...) or a quant-state key
// with another suffix (`__NF4`) but no usable quant state: it would otherwise pass as dense.
std::vector<QuantizedParam> find_quantized_params(const SafetensorsFile& file);
// The same over every shard (shard by shard, file order within), companions looked up anywhere.
std::vector<QuantizedParam> find_quantized_params(const Checkpoint& checkpoint);

// The weights and every companion tensor of `params`: what a dense copy does not pass through.
std::set<std::string, std::less<>> owned_tensors(const std::vector<QuantizedParam>& params);

// The nf4_tensor for a parameter: host pointers into the files' mappings (F32 tables through
// SafetensorsFile::f32, so always aligned). Valid while the files live.
nf4_tensor describe(const QuantizedParam& p, nf4_dtype out_dtype, void* out, std::int64_t out_bytes);
// Same; `file` is used for tensors whose file is not recorded in `p.files`.
nf4_tensor describe(const SafetensorsFile& file, const QuantizedParam& p, nf4_dtype out_dtype, void* out,
                    std::int64_t out_bytes);

// Where read_piece puts a piece's arrays. take(bytes): storage for one array (aligned for floats)
// that stays valid while the description is used; scratch(bytes): storage needed only during the
// call (a piece's nested statistics while its absmax are decoded), valid until the next call.
class PieceStorage {
 public:
  virtual void* take(std::int64_t bytes) = 0;
  virtual void* scratch(std::int64_t bytes) = 0;

 protected:
  ~PieceStorage() = default;
};

// A list of byte arrays handed out in turn and reused from one round to the next (reset()).
class ArrayPool {
 public:
  void* next(std::int64_t bytes);
  void reset() { used_ = 0; }

 private:
  std::vector<std::vector<std::uint8_t>> arrays_;
  std::size_t used_ = 0;
};

// Elements [first, first + count) of `p` read from its files with pread into `storage`, described
// with out / out_bytes left empty (memory: the piece's own packed bytes, absmax and nested absmax,
// and the tables). `first` must be a multiple of the blocksize. A nested piece that starts inside
// a nested block (first not a multiple of piece_granularity(p)) has its absmax decoded here with
// the oracle's formula (docs/DESIGN.md section 2: the two roundings every backend makes) and is
// described as flat. A file truncated meanwhile is NF4_ERR_IO naming it, never SIGBUS.
nf4_tensor read_piece(const QuantizedParam& p, nf4_dtype out_dtype, std::int64_t first, std::int64_t count, PieceStorage& storage);

// Pieces that keep the stored statistics: `first` must be a multiple of piece_granularity(p). The
// arrays are reused from piece to piece.
class PieceBuffers final : public PieceStorage {
 public:
  void* take(std::int64_t bytes) override { return arrays_.next(bytes); }
  void* scratch(std::int64_t bytes) override { return scratch_.next(bytes); }
  void reset() { arrays_.reset(), scratch_.reset(); }

 private:
  ArrayPool arrays_, scratch_;
};
std::int64_t piece_granularity(const QuantizedParam& p);  // the block, times the nested block if nested
nf4_tensor read_piece(const QuantizedParam& p, nf4_dtype out_dtype, std::int64_t first, std::int64_t count, PieceBuffers& buffers);

// Splitting one tensor into independent pieces (bounded memory for huge tensors): a piece must
// start at a multiple of slice_granularity(t) elements, where every index array (packed bytes,
// absmax, nested absmax) starts on an element boundary of its own.
std::int64_t slice_granularity(const nf4_tensor& t);
// Elements [first, first + count) of `t` as a tensor of its own (out / out_bytes left empty).
// Throws NF4_ERR_INVALID_ARGUMENT if `first` is not a multiple of the granularity or the range
// leaves the tensor.
nf4_tensor slice(const nf4_tensor& t, std::int64_t first, std::int64_t count);

// "<prefix>.expected.float16" etc. for a parameter "<prefix>.weight" (the golden file's naming:
// what bitsandbytes returned for the weight, stored next to it). Indexed by nf4_dtype.
std::string expected_tensor_name(const std::string& param_name, nf4_dtype dtype);
// Safetensors dtype of a dequantized output, and back.
DType to_safetensors_dtype(nf4_dtype d);
std::optional<nf4_dtype> to_output_dtype(DType d);
const char* torch_dtype_name(nf4_dtype d);  // "float16", "bfloat16", "float32"

}  // namespace nf4::io
