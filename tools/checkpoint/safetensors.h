// SPDX-License-Identifier: MIT
// safetensors files: a little-endian u64 header length, a JSON header, then the raw data.
// The reader opens only regular files (tools/checkpoint/file_open.h), parses the header as a stream into
// its records (nesting bounded, repeated keys refused) and validates all of it before handing
// out a single pointer: unknown dtypes, sizes that disagree with shapes, offsets out of range or
// overlapping all fail with NF4_ERR_FORMAT naming the tensor. Tensor data is read with pread
// (read()): a file truncated by another process while it is read gives NF4_ERR_IO naming it. The
// pointer accessors (data(), f32()) map the file on first use instead; an access past a
// truncation through a mapping is SIGBUS, which no error handling can turn into a message, so
// they are for callers that own the file (tests, fuzzers), and the tools never call them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/checkpoint/file_open.h"

namespace nf4::io {

enum class DType { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2 };

std::size_t dtype_size(DType d);
const char* dtype_name(DType d);  // as written in safetensors headers, e.g. "BF16"
std::optional<DType> parse_dtype(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0;  // offsets in the data section
  std::int64_t end = 0;
  std::int64_t bytes() const { return end - begin; }
  std::int64_t numel() const;
};

// A parsed header (independent of where the bytes come from; the fuzzers use this directly).
struct Header {
  std::vector<TensorInfo> tensors;  // in file order of their data
  std::map<std::string, std::string> metadata;
};
// Parses and validates a header whose data section has `data_bytes` bytes. Throws nf4::Error.
Header parse_header(std::string_view json_text, std::int64_t data_bytes);

class SafetensorsFile {
 public:
  // Opens and validates `path` (under `policy`'s rules when given); nothing is mapped yet.
  // Throws nf4::Error: NF4_ERR_IO (cannot open, not a regular file, outside the input
  // directory) or NF4_ERR_FORMAT (malformed), with the path in the message.
  explicit SafetensorsFile(const std::string& path, const InputPolicy* policy = nullptr);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // O(log n): a name index is built when the file is opened.
  const TensorInfo* find(std::string_view name) const;
  // The tensor's bytes inside the mapping, which the first call creates (valid while this object
  // lives; NF4_ERR_IO if the file cannot be mapped). Only byte-aligned: the format does not
  // promise that a tensor's data starts on a multiple of its element size. Not truncation-safe
  // (see the top of this file): read() is.
  const std::uint8_t* data(const TensorInfo& t) const { return mapped_data() + t.begin; }
  // Copies `bytes` bytes of `t` from byte `offset` of the tensor with pread (never through the
  // mapping). Throws NF4_ERR_IO naming the file if it has been truncated meanwhile.
  void read(const TensorInfo& t, std::int64_t offset, void* dst, std::int64_t bytes) const;
  // An F32 tensor as a properly aligned float array: the mapping itself when the data happens to
  // be 4-byte aligned (every file written by the reference writer or ours), otherwise a copy made
  // once and kept while this object lives, so that no caller ever dereferences a misaligned
  // float*. Thread-safe. Throws nf4::Error(NF4_ERR_FORMAT) if `t` is not F32. Maps the file, as
  // data() does.
  const float* f32(const TensorInfo& t) const;

 private:
  std::string path_;
  Header header_;
  std::vector<std::uint32_t> by_name_;  // indices into header_.tensors, sorted by name
  const std::uint8_t* mapped_data() const;  // the data section inside the mapping, mapped once

  // The open file, shared with reads in progress. At most kMaxOpenShards files are held open in
  // the whole process (least recently used closed first; see open_file()), so a checkpoint of
  // tens of thousands of shards stays far below the open-file limit.
  std::shared_ptr<const InputFile> open_file() const;
  // Closes the least recently used shard that no read is using; false when there is none. The
  // caller holds the registry's lock; opens pass it to InputFile::open, which calls it while the
  // process is out of file descriptors.
  static bool close_idle_shard_locked();
  mutable std::shared_ptr<const InputFile> open_;  // guarded by the process-wide registry's lock
  std::optional<InputPolicy> policy_;
  std::uint64_t device_ = 0, inode_ = 0;  // of the file first opened: a reopen must find the same one
  std::size_t map_bytes_ = 0;     // the file's size when it was opened
  std::int64_t data_offset_ = 0;  // of the data section in the file
  // Guards the mapping and the aligned copies. map_ is read without the lock once set.
  mutable std::mutex mutex_;
  mutable std::atomic<void*> map_{nullptr};
  // Aligned copies of misaligned F32 tensors, keyed by the tensor's [begin, end) (an empty tensor
  // may share its begin with another one).
  mutable std::map<std::pair<std::int64_t, std::int64_t>, std::unique_ptr<float[]>> aligned_;
};

// Files a process keeps open at once through SafetensorsFile (each reopened on its next read);
// fewer under a low descriptor limit (a quarter of it), fewer still when the process comes within
// a reserve of its limit (others hold descriptors too), and an open that fails for want of
// descriptors closes an idle shard and retries.
inline constexpr std::size_t kMaxOpenShards = 32;

// ---- writing ----------------------------------------------------------------------------------

class OutputFile;

struct TensorSpec {
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::int64_t> shape;
  std::int64_t numel() const;
  std::int64_t bytes() const { return numel() * static_cast<std::int64_t>(dtype_size(dtype)); }
};

// Streams a safetensors file into `out`: the header at construction, then each tensor's bytes,
// in as many write() pieces as the caller likes, so the output is never held in memory.
// Layout: the format forbids holes between tensors, so alignment comes from the order: the data
// order is the given order stably sorted by element size, largest first, and the header is padded
// with spaces to a multiple of 8 bytes (as the reference Python writer does). Every tensor then
// starts at a multiple of its element size, relative to the file and to the data section.
class SafetensorsWriter {
 public:
  // Throws nf4::Error(NF4_ERR_INVALID_ARGUMENT) on empty or duplicate names, "__metadata__" as a
  // tensor name, or a shape whose byte count overflows.
  SafetensorsWriter(OutputFile& out, std::vector<TensorSpec> tensors, const std::map<std::string, std::string>& metadata);

  // The data order: write() expects the bytes of order()[0], then order()[1], ...
  const std::vector<TensorSpec>& order() const { return order_; }
  // The tensor the next write() continues; nullptr once everything is written.
  const TensorSpec* current() const { return next_ < order_.size() ? &order_[next_] : nullptr; }
  // Appends bytes to the current tensor; a piece never spans two tensors (throws
  // NF4_ERR_INVALID_ARGUMENT if it would, or if everything has been written).
  void write(const void* data, std::int64_t bytes);
  // Throws NF4_ERR_INVALID_ARGUMENT unless every tensor was written in full.
  void finish() const;
  std::int64_t header_bytes() const { return header_bytes_; }  // including the 8-byte length
  std::int64_t data_bytes() const { return data_bytes_; }

 private:
  OutputFile& out_;
  std::vector<TensorSpec> order_;
  std::size_t next_ = 0;
  std::int64_t written_in_current_ = 0;
  std::int64_t header_bytes_ = 0, data_bytes_ = 0;
};

// Writes a whole file from memory through an AtomicFile (tests, small outputs).
struct TensorData {
  TensorSpec spec;
  const void* data = nullptr;  // spec.bytes() bytes
};
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace nf4::io
