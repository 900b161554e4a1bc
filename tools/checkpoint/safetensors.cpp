// SPDX-License-Identifier: MIT
#include "tools/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <list>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tools/checkpoint/cancel.h"
#include "tools/checkpoint/json_limits.h"
#include "tools/checkpoint/output.h"

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

namespace {

// The header parsed as a stream of JSON events straight into TensorInfo records: memory is what
// the records need (no document tree, whatever the header holds), nesting is bounded, repeated
// keys are refused, and the cancellation hook runs every few thousand tensors.
class HeaderParser {
 public:
  using json = nlohmann::json;
  explicit HeaderParser(std::int64_t data_bytes) : data_bytes_(data_bytes) {}

  bool null() { return scalar(Kind::Other); }
  bool boolean(bool) { return scalar(Kind::Other); }
  bool number_integer(json::number_integer_t) { return scalar(Kind::Other); }
  bool number_unsigned(json::number_unsigned_t v) {
    unsigned_ = v;
    return scalar(Kind::Unsigned);
  }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar(Kind::Other); }
  bool string(json::string_t& v) {
    string_ = std::move(v);
    return scalar(Kind::String);
  }
  bool binary(json::binary_t&) { return error("header is not valid JSON"); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (depth_ == 1) {
      name_ = std::move(k);
      if (name_ == "__metadata__" && seen_metadata_) return error("'__metadata__' appears twice in the header");
    } else if (depth_ == 2 && in_metadata_) {
      key_ = std::move(k);
    } else if (depth_ == 2) {
      field_ = k == "dtype" ? Field::DType : k == "shape" ? Field::Shape : k == "data_offsets" ? Field::Offsets : Field::Other;
      if (field_ != Field::Other) {
        const unsigned bit = 1u << static_cast<unsigned>(field_);
        if (fields_seen_ & bit) return error(fmt::format("tensor '{}': '{}' appears twice in its entry", printable(t_.name), k));
        fields_seen_ |= bit;
      }
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    return error(fmt::format("header is not valid JSON (syntax error at byte {})", position));
  }

  Header take() { return std::move(h_); }
  const std::string& error_text() const { return error_; }
  // For errors raised outside the event handlers (cancellation).
  std::exception_ptr exception() const { return exception_; }

 private:
  enum class Kind { Unsigned, String, Other };
  enum class Field { DType, Shape, Offsets, Other };

  bool error(std::string text) {
    if (error_.empty()) error_ = std::move(text);
    return false;
  }
  std::string tensor() const { return printable(t_.name); }

  bool open(bool object) {
    if (depth_ >= kMaxJsonDepth) return error(fmt::format("header nested deeper than {} levels", kMaxJsonDepth));
    ++depth_;
    if (depth_ == 1) {
      if (!object) return error("header is not a JSON object");
      return true;
    }
    if (depth_ == 2) {
      if (name_ == "__metadata__") {
        if (!object) return error("__metadata__ is not an object");
        in_metadata_ = seen_metadata_ = true;
        return true;
      }
      if (!object) return error(fmt::format("tensor '{}': entry is not an object", printable(name_)));
      t_ = TensorInfo{};
      t_.name = std::move(name_);
      dtype_ok_ = false;
      fields_seen_ = 0;
      numel_ = 1;
      offsets_.clear();
      return true;
    }
    if (depth_ == 3 && in_metadata_) return error(fmt::format("__metadata__['{}'] is not a string", printable(key_)));
    if (depth_ == 3 && field_ == Field::DType) return error(fmt::format("tensor '{}': missing or non-string dtype", tensor()));
    if (depth_ == 3 && field_ == Field::Shape) {
      if (!object) return (array_ = Field::Shape, true);
      return error(fmt::format("tensor '{}': missing shape", tensor()));
    }
    if (depth_ == 3 && field_ == Field::Offsets) {
      if (!object) return (array_ = Field::Offsets, true);
      return error(fmt::format("tensor '{}': data_offsets must be [begin, end]", tensor()));
    }
    if (depth_ == 4 && array_ == Field::Shape)
      return error(fmt::format("tensor '{}': shape entries must be non-negative integers", tensor()));
    if (depth_ == 4 && array_ == Field::Offsets)
      return error(fmt::format("tensor '{}': data_offsets must be non-negative integers", tensor()));
    return true;  // inside a field this reader does not use
  }

  bool close() {
    --depth_;
    if (depth_ == 2) array_ = Field::Other;
    if (depth_ == 1 && in_metadata_) {
      in_metadata_ = false;
    } else if (depth_ == 1) {
      return finish_tensor();
    }
    return true;
  }

  bool scalar(Kind kind) {
    if (depth_ == 0) return error("header is not a JSON object");
    if (depth_ == 1) {
      if (name_ == "__metadata__") return error("__metadata__ is not an object");
      return error(fmt::format("tensor '{}': entry is not an object", printable(name_)));
    }
    if (depth_ == 2 && in_metadata_) {
      if (kind != Kind::String) return error(fmt::format("__metadata__['{}'] is not a string", printable(key_)));
      if (!h_.metadata.emplace(std::move(key_), std::move(string_)).second)
        return error(fmt::format("__metadata__ key '{}' appears twice", printable(key_)));
      return (h_.metadata.size() & 4095) != 0 || !cancelled();
    }
    if (depth_ == 2) {
      switch (field_) {
        case Field::DType: {
          if (kind != Kind::String) return error(fmt::format("tensor '{}': missing or non-string dtype", tensor()));
          const auto d = parse_dtype(string_);
          if (!d) return error(fmt::format("tensor '{}': unknown dtype '{}'", tensor(), printable(string_, 16)));
          t_.dtype = *d;
          dtype_ok_ = true;
          return true;
        }
        case Field::Shape: return error(fmt::format("tensor '{}': missing shape", tensor()));
        case Field::Offsets: return error(fmt::format("tensor '{}': data_offsets must be [begin, end]", tensor()));
        case Field::Other: return true;
      }
    }
    if (depth_ == 3 && array_ == Field::Shape) {
      if (kind != Kind::Unsigned) return error(fmt::format("tensor '{}': shape entries must be non-negative integers", tensor()));
      // The bound numel_ <= data_bytes_ / dim + 1, written so that it cannot overflow: data_bytes_
      // is INT64_MAX for a header parsed without its file.
      if (unsigned_ > static_cast<std::uint64_t>(data_bytes_) + 1 ||
          (unsigned_ != 0 && numel_ - 1 > data_bytes_ / static_cast<std::int64_t>(unsigned_)))
        return error(fmt::format("tensor '{}': shape larger than the file", tensor()));
      t_.shape.push_back(static_cast<std::int64_t>(unsigned_));
      numel_ *= static_cast<std::int64_t>(unsigned_);
      return true;
    }
    if (depth_ == 3 && array_ == Field::Offsets) {
      if (kind != Kind::Unsigned) return error(fmt::format("tensor '{}': data_offsets must be non-negative integers", tensor()));
      if (offsets_.size() == 2) return error(fmt::format("tensor '{}': data_offsets must be [begin, end]", tensor()));
      offsets_.push_back(unsigned_);
      return true;
    }
    return true;  // inside a field this reader does not use
  }

  bool finish_tensor() {
    if (!dtype_ok_) return error(fmt::format("tensor '{}': missing or non-string dtype", tensor()));
    if (!(fields_seen_ & (1u << static_cast<unsigned>(Field::Shape)))) return error(fmt::format("tensor '{}': missing shape", tensor()));
    if (offsets_.size() != 2) return error(fmt::format("tensor '{}': data_offsets must be [begin, end]", tensor()));
    const std::uint64_t begin = offsets_[0], end = offsets_[1];
    if (begin > end || end > static_cast<std::uint64_t>(data_bytes_))
      return error(fmt::format("tensor '{}': data_offsets [{}, {}] outside the data section of {} bytes", tensor(), begin, end,
                               data_bytes_));
    t_.begin = static_cast<std::int64_t>(begin);
    t_.end = static_cast<std::int64_t>(end);
    // numel_ is bounded by the data size only to within a factor of the element size (and the
    // data size is INT64_MAX for a header parsed without its file), so the product may overflow.
    std::int64_t expected = 0;
    if (__builtin_mul_overflow(numel_, static_cast<std::int64_t>(dtype_size(t_.dtype)), &expected))
      return error(fmt::format("tensor '{}': shape of {} {} elements larger than the file", tensor(), numel_,
                               dtype_name(t_.dtype)));
    if (t_.bytes() != expected)
      return error(fmt::format("tensor '{}': {} bytes for shape of {} {} elements, expected {}", tensor(), t_.bytes(), numel_,
                               dtype_name(t_.dtype), expected));
    h_.tensors.push_back(std::move(t_));
    numel_ = 1;
    return (h_.tensors.size() & 4095) != 0 || !cancelled();
  }

  // check_cancel() without throwing through the SAX parser: its exception is kept for
  // parse_header to rethrow, and parsing stops.
  bool cancelled() {
    try {
      check_cancel();
    } catch (...) {
      exception_ = std::current_exception();
      return true;
    }
    return false;
  }

  std::int64_t data_bytes_;
  Header h_;
  int depth_ = 0;
  bool in_metadata_ = false, seen_metadata_ = false, dtype_ok_ = false;
  std::string name_, key_, string_;
  std::uint64_t unsigned_ = 0;
  Field field_ = Field::Other, array_ = Field::Other;
  unsigned fields_seen_ = 0;
  TensorInfo t_;
  std::int64_t numel_ = 1;
  std::vector<std::uint64_t> offsets_;
  std::string error_;
  std::exception_ptr exception_;
};

}  // namespace

Header parse_header(std::string_view text, std::int64_t data_bytes) {
  check_json_text(text, "header");
  HeaderParser p(data_bytes);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &p);
  } catch (const nlohmann::json::exception&) {
    fail(NF4_ERR_FORMAT, "header is not valid JSON");
  }
  if (p.exception()) std::rethrow_exception(p.exception());
  if (!ok) fail(NF4_ERR_FORMAT, "{}", p.error_text().empty() ? std::string("header is not valid JSON") : p.error_text());
  Header h = p.take();
  {
    std::vector<std::uint32_t> by_name(h.tensors.size());
    for (std::size_t i = 0; i < by_name.size(); ++i) by_name[i] = static_cast<std::uint32_t>(i);
    std::sort(by_name.begin(), by_name.end(), [&](std::uint32_t a, std::uint32_t b) { return h.tensors[a].name < h.tensors[b].name; });
    for (std::size_t i = 1; i < by_name.size(); ++i)
      if (h.tensors[by_name[i]].name == h.tensors[by_name[i - 1]].name)
        fail(NF4_ERR_FORMAT, "tensor '{}' appears twice in the header (two entries with that key)", printable(h.tensors[by_name[i]].name));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (std::size_t i = 1; i < h.tensors.size(); ++i)
    if (h.tensors[i].begin < h.tensors[i - 1].end)
      fail(NF4_ERR_FORMAT, "tensors '{}' and '{}' overlap in the data section", printable(h.tensors[i - 1].name),
           printable(h.tensors[i].name));
  return h;
}

namespace {

// The SafetensorsFile objects that hold an open file, most recently used first.
struct OpenFiles {
  std::mutex mutex;
  std::list<const SafetensorsFile*> lru;
  std::map<const SafetensorsFile*, std::list<const SafetensorsFile*>::iterator> where;
  std::size_t cap = 0;  // files held at most (0: not set yet; halved when descriptors run short)
};
OpenFiles& open_files() {
  static OpenFiles o;
  return o;
}

// The process's descriptor limit (soft), or 0 where there is none to speak of.
std::uint64_t descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<std::uint64_t>(r.rlim_cur);
}

// Descriptors kept free for everything but the shards: outputs, directories, a GPU driver's, a
// sanitizer's. Descriptors are numbered lowest free first, so a shard opened as descriptor
// limit - kDescriptorReserve or above means the process is that close to its limit.
constexpr std::uint64_t kDescriptorReserve = 16;

// The files the cache may hold after opening descriptor `fd`: kMaxOpenShards, at most a quarter of
// the limit, and halved (to 1 at least) each time a shard lands within the reserve of the limit.
std::size_t shard_cap(OpenFiles& reg, int fd) {
  const std::uint64_t limit = descriptor_limit();
  if (reg.cap == 0) reg.cap = limit == 0 ? kMaxOpenShards : std::clamp<std::size_t>(static_cast<std::size_t>(limit / 4), 1, kMaxOpenShards);
  if (limit != 0 && static_cast<std::uint64_t>(fd) + kDescriptorReserve >= limit) reg.cap = std::max<std::size_t>(1, reg.lru.size() / 2);
  return reg.cap;
}

}  // namespace

std::shared_ptr<const InputFile> SafetensorsFile::open_file() const {
  OpenFiles& reg = open_files();
  std::lock_guard lock(reg.mutex);
  if (const auto it = reg.where.find(this); it != reg.where.end()) {
    reg.lru.splice(reg.lru.begin(), reg.lru, it->second);
    return open_;
  }
  if (!open_) {
    auto f = std::make_shared<InputFile>(InputFile::open(path_, policy_ ? &*policy_ : nullptr, close_idle_shard_locked));
    struct stat st {};
    if (::fstat(f->fd(), &st) != 0 || st.st_dev != device_ || st.st_ino != inode_ || f->size() != static_cast<std::int64_t>(map_bytes_))
      fail(NF4_ERR_IO, "{}: the file was replaced or changed since it was first opened; refusing to read it", path_);
    open_ = std::move(f);
  }
  reg.lru.push_front(this);
  reg.where[this] = reg.lru.begin();
  const std::size_t cap = shard_cap(reg, open_->fd());
  while (reg.lru.size() > cap) {
    const SafetensorsFile* victim = reg.lru.back();
    victim->open_.reset();  // reads in progress keep their own reference until they finish
    reg.where.erase(victim);
    reg.lru.pop_back();
  }
  return open_;
}

bool SafetensorsFile::close_idle_shard_locked() {
  OpenFiles& reg = open_files();
  for (auto it = reg.lru.rbegin(); it != reg.lru.rend(); ++it) {
    const SafetensorsFile* f = *it;
    if (f->open_.use_count() != 1) continue;  // a read in progress holds it
    f->open_.reset();
    reg.where.erase(f);
    reg.lru.erase(std::next(it).base());
    return true;
  }
  return false;
}

SafetensorsFile::SafetensorsFile(const std::string& path, const InputPolicy* policy) : path_(path) {
  if (policy) policy_ = *policy;
  {
    std::lock_guard lock(open_files().mutex);  // close_idle_shard_locked's condition
    open_ = std::make_shared<InputFile>(InputFile::open(path, policy, close_idle_shard_locked));
  }
  const InputFile& file_ = *open_;
  {
    struct stat st {};
    if (::fstat(file_.fd(), &st) != 0) fail(NF4_ERR_IO, "{}: cannot stat: {}", path, std::strerror(errno));
    device_ = st.st_dev;
    inode_ = st.st_ino;
  }
  map_bytes_ = static_cast<std::size_t>(file_.size());
  if (map_bytes_ < 8)
    fail(NF4_ERR_FORMAT, "{}: not a safetensors file ({} bytes, too short for the 8-byte header length)", path, map_bytes_);
  try {
    std::uint8_t len[8];
    file_.read_at(0, len, 8);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];  // little endian
    // The value itself is not quoted: for a file that is not a safetensors file it is 8 bytes of
    // that file's contents. A header is a JSON object, so it starts with '{': a file whose length
    // field or first header byte says otherwise is some other kind of file, and is called that.
    if (n > map_bytes_ - 8)
      fail(NF4_ERR_FORMAT, "not a safetensors file (its first 8 bytes, the header length, point past the end of the {}-byte file)",
           map_bytes_);
    if (n > static_cast<std::uint64_t>(kMaxHeaderBytes))
      fail(NF4_ERR_FORMAT, "the header of {} bytes is more than the 100 MB that safetensors allows", n);
    char first = 0;
    if (n > 0) file_.read_at(8, &first, 1);
    // (Whitespace may come first, and a byte order mark gets its own message from parse_header.)
    if (std::string_view("{ \t\r\n\xEF").find(first) == std::string_view::npos || n == 0)
      fail(NF4_ERR_FORMAT, "not a safetensors file (the {}-byte header after the length field does not start with '{{')", n);
    const std::int64_t data_bytes = static_cast<std::int64_t>(map_bytes_ - 8 - n);
    {
      std::string text(static_cast<std::size_t>(n), '\0');
      file_.read_at(8, text.data(), static_cast<std::int64_t>(n));
      header_ = parse_header(text, data_bytes);
    }
    data_offset_ = 8 + static_cast<std::int64_t>(n);
    if (header_.tensors.size() > UINT32_MAX) fail(NF4_ERR_FORMAT, "{} tensors is more than this reader indexes", header_.tensors.size());
    by_name_.resize(header_.tensors.size());
    for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = static_cast<std::uint32_t>(i);
    std::sort(by_name_.begin(), by_name_.end(),
              [&](std::uint32_t a, std::uint32_t b) { return header_.tensors[a].name < header_.tensors[b].name; });
  } catch (const Error& e) {
    // I/O errors name the file already (InputFile).
    if (e.status() == NF4_ERR_INTERRUPTED || e.status() == NF4_ERR_IO) throw;
    throw Error(e.status(), path + ": " + e.what());
  }
  open_file();  // counted among the open files from now on (the least recently used may close)
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), header_(std::move(o.header_)), by_name_(std::move(o.by_name_)), policy_(std::move(o.policy_)),
      device_(o.device_), inode_(o.inode_), map_bytes_(o.map_bytes_), data_offset_(o.data_offset_) {
  {
    OpenFiles& reg = open_files();
    std::lock_guard lock(reg.mutex);
    open_ = std::move(o.open_);
    if (const auto it = reg.where.find(&o); it != reg.where.end()) {
      *it->second = this;
      reg.where[this] = it->second;
      reg.where.erase(it);
    }
  }
  std::lock_guard lock(o.mutex_);
  map_.store(o.map_.exchange(nullptr));
  aligned_ = std::move(o.aligned_);
}

SafetensorsFile::~SafetensorsFile() {
  {
    OpenFiles& reg = open_files();
    std::lock_guard lock(reg.mutex);
    if (const auto it = reg.where.find(this); it != reg.where.end()) {
      reg.lru.erase(it->second);
      reg.where.erase(it);
    }
    open_.reset();
  }
  if (void* m = map_.load()) ::munmap(m, map_bytes_);
}

const std::uint8_t* SafetensorsFile::mapped_data() const {
  void* m = map_.load(std::memory_order_acquire);
  if (!m) {
    std::lock_guard lock(mutex_);
    m = map_.load(std::memory_order_relaxed);
    if (!m) {
      m = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, open_file()->fd(), 0);
      if (m == MAP_FAILED) fail(NF4_ERR_IO, "{}: cannot map: {}", path_, std::strerror(errno));
      map_.store(m, std::memory_order_release);
    }
  }
  return static_cast<const std::uint8_t*>(m) + data_offset_;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                   [&](std::uint32_t i, std::string_view n) { return header_.tensors[i].name < n; });
  if (it == by_name_.end() || header_.tensors[*it].name != name) return nullptr;
  return &header_.tensors[*it];
}

void SafetensorsFile::read(const TensorInfo& t, std::int64_t offset, void* dst, std::int64_t bytes) const {
  NF4_CHECK(offset >= 0 && bytes >= 0 && offset <= t.bytes() && bytes <= t.bytes() - offset);
  if (bytes == 0) return;
  open_file()->read_at(data_offset_ + t.begin + offset, dst, bytes);
}

const float* SafetensorsFile::f32(const TensorInfo& t) const {
  if (t.dtype != DType::F32) fail(NF4_ERR_FORMAT, "{}: tensor '{}' is {}, expected F32", path_, printable(t.name), dtype_name(t.dtype));
  const std::uint8_t* p = data(t);
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0) return reinterpret_cast<const float*>(p);
  std::lock_guard lock(mutex_);
  auto& copy = aligned_[{t.begin, t.end}];
  if (!copy) {
    auto fresh = std::make_unique<float[]>(static_cast<std::size_t>(t.numel()));
    read(t, 0, fresh.get(), t.bytes());
    copy = std::move(fresh);
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
  // The header text is built directly (a JSON library's ordered object looks keys up linearly,
  // which makes a header of n tensors cost n^2): __metadata__ first, then the tensors in data
  // order, like the reference writer.
  std::string text = "{";
  const auto quote = [&](const std::string& s) {
    try {
      text += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    } catch (const nlohmann::json::exception&) {
      fail(NF4_ERR_INVALID_ARGUMENT, "'{}' is not valid UTF-8 and cannot be written into a header", printable(s));
    }
  };
  std::size_t items = 0;
  if (!metadata.empty()) {
    text += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) text += ',';
      first = false;
      quote(k);
      text += ':';
      quote(v);
      if ((++items & 4095) == 0) check_cancel();
    }
    text += '}';
  }
  for (const auto& t : order_) {
    std::int64_t n = 1;
    for (auto d : t.shape) {
      if (d < 0 || (d != 0 && n > NF4_MAX_ELEMENTS / d))
        fail(NF4_ERR_INVALID_ARGUMENT, "tensor '{}': shape entry {} is negative or the shape overflows", printable(t.name), d);
      n *= d;
    }
    const std::int64_t begin = data_bytes_;
    if (t.bytes() > INT64_MAX / 2 - data_bytes_)
      fail(NF4_ERR_INVALID_ARGUMENT, "tensor '{}': the file would exceed 2^62 bytes", printable(t.name));
    data_bytes_ += t.bytes();
    if (text.size() > 1) text += ',';
    quote(t.name);
    text += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", dtype_name(t.dtype),
                        fmt::join(t.shape, ","), begin, data_bytes_);
    if ((++items & 4095) == 0) check_cancel();
  }
  text += '}';
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
