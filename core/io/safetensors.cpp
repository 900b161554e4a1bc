// SPDX-License-Identifier: MIT
#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/output.h"

namespace nf4::io {

namespace {
struct DTypeName {
  DType dtype;
  const char* name;
  std::size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},   {DType::I8, "I8", 1},     {DType::U16, "U16", 2},
    {DType::I16, "I16", 2},   {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2}, {DType::U32, "U32", 4},
    {DType::I32, "I32", 4},   {DType::F32, "F32", 4}, {DType::U64, "U64", 8},   {DType::I64, "I64", 8},
    {DType::F64, "F64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1}};

constexpr std::int64_t kMaxHeaderBytes = 100 << 20;  // the safetensors spec's limit
}  // namespace

std::size_t dtype_size(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.size;
  return 0;
}
const char* dtype_name(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}
std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kDTypes)
    if (name == e.name) return e.dtype;
  return std::nullopt;
}

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Header parse_header(std::string_view text, std::int64_t data_bytes) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(NF4_ERR_FORMAT, "header is not valid JSON");
  if (!j.is_object()) fail(NF4_ERR_FORMAT, "header is not a JSON object");
  Header h;
  for (auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(NF4_ERR_FORMAT, "__metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(NF4_ERR_FORMAT, "__metadata__['{}'] is not a string", k);
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) fail(NF4_ERR_FORMAT, "tensor '{}': entry is not an object", name);
    const auto dt = entry.find("dtype");
    const auto sh = entry.find("shape");
    const auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) fail(NF4_ERR_FORMAT, "tensor '{}': missing or non-string dtype", name);
    const auto dtype = parse_dtype(dt->get<std::string>());
    if (!dtype) fail(NF4_ERR_FORMAT, "tensor '{}': unknown dtype '{}'", name, dt->get<std::string>());
    if (sh == entry.end() || !sh->is_array()) fail(NF4_ERR_FORMAT, "tensor '{}': missing shape", name);
    if (off == entry.end() || !off->is_array() || off->size() != 2) fail(NF4_ERR_FORMAT, "tensor '{}': data_offsets must be [begin, end]", name);
    TensorInfo t;
    t.name = name;
    t.dtype = *dtype;
    std::int64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) fail(NF4_ERR_FORMAT, "tensor '{}': shape entries must be non-negative integers", name);
      const auto v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(data_bytes) + 1 || (v != 0 && numel > data_bytes / static_cast<std::int64_t>(v) + 1))
        fail(NF4_ERR_FORMAT, "tensor '{}': shape larger than the file", name);
      t.shape.push_back(static_cast<std::int64_t>(v));
      numel *= static_cast<std::int64_t>(v);
    }
    for (int k = 0; k < 2; ++k)
      if (!(*off)[k].is_number_unsigned()) fail(NF4_ERR_FORMAT, "tensor '{}': data_offsets must be non-negative integers", name);
    const auto begin = (*off)[0].get<std::uint64_t>(), end = (*off)[1].get<std::uint64_t>();
    if (begin > end || end > static_cast<std::uint64_t>(data_bytes))
      fail(NF4_ERR_FORMAT, "tensor '{}': data_offsets [{}, {}] outside the data section of {} bytes", name, begin, end, data_bytes);
    t.begin = static_cast<std::int64_t>(begin);
    t.end = static_cast<std::int64_t>(end);
    const std::int64_t expected = numel * static_cast<std::int64_t>(dtype_size(t.dtype));
    if (t.bytes() != expected)
      fail(NF4_ERR_FORMAT, "tensor '{}': {} bytes for shape of {} {} elements, expected {}", name, t.bytes(), numel, dtype_name(t.dtype), expected);
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (std::size_t i = 1; i < h.tensors.size(); ++i)
    if (h.tensors[i].begin < h.tensors[i - 1].end)
      fail(NF4_ERR_FORMAT, "tensors '{}' and '{}' overlap in the data section", h.tensors[i - 1].name, h.tensors[i].name);
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(NF4_ERR_IO, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(NF4_ERR_IO, "{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(NF4_ERR_IO, "{}: not a regular file", path);
  }
  map_bytes_ = static_cast<std::size_t>(st.st_size);
  if (map_bytes_ < 8) {
    ::close(fd);
    fail(NF4_ERR_FORMAT, "{}: {} bytes is too short for a safetensors file (needs an 8-byte header length)", path, map_bytes_);
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(NF4_ERR_IO, "{}: cannot map: {}", path, std::strerror(errno));
  }
  try {
    const auto* bytes = static_cast<const std::uint8_t*>(map_);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little endian
    if (n > static_cast<std::uint64_t>(kMaxHeaderBytes) || n > map_bytes_ - 8)
      fail(NF4_ERR_FORMAT, "header length {} runs past the end of the {}-byte file", n, map_bytes_);
    const std::int64_t data_bytes = static_cast<std::int64_t>(map_bytes_ - 8 - n);
    header_ = parse_header(std::string_view(reinterpret_cast<const char*>(bytes + 8), n), data_bytes);
    data_ = bytes + 8 + n;
    if (header_.tensors.size() > UINT32_MAX) fail(NF4_ERR_FORMAT, "{} tensors is more than this reader indexes", header_.tensors.size());
    by_name_.resize(header_.tensors.size());
    for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = static_cast<std::uint32_t>(i);
    std::sort(by_name_.begin(), by_name_.end(),
              [&](std::uint32_t a, std::uint32_t b) { return header_.tensors[a].name < header_.tensors[b].name; });
  } catch (const Error& e) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw Error(e.status(), path + ": " + e.what());
  }
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), header_(std::move(o.header_)), by_name_(std::move(o.by_name_)),
      map_(std::exchange(o.map_, nullptr)), map_bytes_(o.map_bytes_), data_(o.data_) {
  std::lock_guard lock(o.aligned_mutex_);
  aligned_ = std::move(o.aligned_);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                   [&](std::uint32_t i, std::string_view n) { return header_.tensors[i].name < n; });
  if (it == by_name_.end() || header_.tensors[*it].name != name) return nullptr;
  return &header_.tensors[*it];
}

const float* SafetensorsFile::f32(const TensorInfo& t) const {
  if (t.dtype != DType::F32) fail(NF4_ERR_FORMAT, "{}: tensor '{}' is {}, expected F32", path_, t.name, dtype_name(t.dtype));
  const std::uint8_t* p = data(t);
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0) return reinterpret_cast<const float*>(p);
  std::lock_guard lock(aligned_mutex_);
  auto& copy = aligned_[{t.begin, t.end}];
  if (!copy) {
    copy = std::make_unique<float[]>(static_cast<std::size_t>(t.numel()));
    std::memcpy(copy.get(), p, static_cast<std::size_t>(t.bytes()));
  }
  return copy.get();
}

// ---- writing ----------------------------------------------------------------------------------

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsWriter::SafetensorsWriter(OutputFile& out, std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : out_(out), order_(std::move(tensors)) {
  std::stable_sort(order_.begin(), order_.end(),
                   [](const TensorSpec& a, const TensorSpec& b) { return dtype_size(a.dtype) > dtype_size(b.dtype); });
  {
    std::vector<std::string_view> names;
    for (const auto& t : order_) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (names[i].empty() || names[i] == "__metadata__")
        fail(NF4_ERR_INVALID_ARGUMENT, "'{}' cannot be a tensor name", names[i]);
      if (i > 0 && names[i] == names[i - 1]) fail(NF4_ERR_INVALID_ARGUMENT, "tensor '{}' appears twice", names[i]);
    }
  }
  // ordered_json keeps __metadata__ first and the tensors in data order, like the reference writer.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = h["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  for (const auto& t : order_) {
    std::int64_t n = 1;
    for (auto d : t.shape) {
      if (d < 0 || (d != 0 && n > NF4_MAX_ELEMENTS / d))
        fail(NF4_ERR_INVALID_ARGUMENT, "tensor '{}': shape entry {} is negative or the shape overflows", t.name, d);
      n *= d;
    }
    const std::int64_t begin = data_bytes_;
    if (t.bytes() > INT64_MAX / 2 - data_bytes_) fail(NF4_ERR_INVALID_ARGUMENT, "tensor '{}': the file would exceed 2^62 bytes", t.name);
    data_bytes_ += t.bytes();
    h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {begin, data_bytes_}}};
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  out_.write(len, 8);
  out_.write(text.data(), text.size());
  header_bytes_ = 8 + static_cast<std::int64_t>(text.size());
}

void SafetensorsWriter::write(const void* data, std::int64_t bytes) {
  if (bytes < 0) fail(NF4_ERR_INVALID_ARGUMENT, "{}: negative write of {} bytes", out_.path(), bytes);
  if (bytes == 0) return;
  // Empty tensors take no bytes: skip over them to the tensor this piece belongs to.
  while (next_ < order_.size() && written_in_current_ == order_[next_].bytes()) {
    ++next_;
    written_in_current_ = 0;
  }
  if (next_ >= order_.size()) fail(NF4_ERR_INVALID_ARGUMENT, "{}: {} bytes written past the last tensor", out_.path(), bytes);
  const TensorSpec& t = order_[next_];
  if (bytes > t.bytes() - written_in_current_)
    fail(NF4_ERR_INVALID_ARGUMENT, "{}: tensor '{}' has {} bytes left, got {}", out_.path(), t.name,
         t.bytes() - written_in_current_, bytes);
  out_.write(data, static_cast<std::size_t>(bytes));
  written_in_current_ += bytes;
  if (written_in_current_ == t.bytes()) {
    ++next_;
    written_in_current_ = 0;
  }
}

void SafetensorsWriter::finish() const {
  for (std::size_t i = next_; i < order_.size(); ++i)
    if (order_[i].bytes() != (i == next_ ? written_in_current_ : 0))
      fail(NF4_ERR_INVALID_ARGUMENT, "{}: tensor '{}' was not written in full", out_.path(), order_[i].name);
}

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  std::map<std::string, const void*> data;
  for (const auto& t : tensors) {
    specs.push_back(t.spec);
    data[t.spec.name] = t.data;
  }
  AtomicFile file(path);
  SafetensorsWriter w(file.file(), std::move(specs), metadata);
  for (const auto& t : w.order()) w.write(data[t.name], t.bytes());
  w.finish();
  file.commit();
}

}  // namespace nf4::io
