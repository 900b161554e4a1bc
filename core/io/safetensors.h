// SPDX-License-Identifier: MIT
// safetensors files: a little-endian u64 header length, a JSON header, then the raw data.
// The reader memory-maps the file (a multi-GB checkpoint is never read into RAM) and validates
// the whole header before handing out a single pointer: unknown dtypes, sizes that disagree with
// shapes, offsets out of range or overlapping all fail with NF4_ERR_FORMAT naming the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  // Maps and validates `path`. Throws nf4::Error: NF4_ERR_IO (cannot open / map) or
  // NF4_ERR_FORMAT (malformed), with the path in the message.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const;
  // The tensor's bytes inside the mapping (valid while this object lives).
  const std::uint8_t* data(const TensorInfo& t) const { return data_ + t.begin; }

 private:
  std::string path_;
  Header header_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::uint8_t* data_ = nullptr;
};

}  // namespace nf4::io
