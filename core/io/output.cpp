// SPDX-License-Identifier: MIT
#include "core/io/output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "core/error.h"

namespace nf4::io {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// ".NAME.nf4-tmp-PID-N-RANDOM": hidden, recognisable, unique within and across processes.
std::string temp_name(const std::string& final_path) {
  static std::atomic<unsigned> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string dir = parent_dir(final_path);
  return fmt::format("{}/.{}.nf4-tmp-{}-{}-{:08x}", dir, base_name(final_path), ::getpid(), counter++,
                     static_cast<std::uint32_t>(rng()));
}

}  // namespace

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  const int r = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the data itself was already synced.
  if (r != 0 && e != EINVAL && e != EROFS) fail(NF4_ERR_IO, "{}: cannot sync the directory: {}", dir, errno_text(e));
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// ---- OutputFile -------------------------------------------------------------------------------

OutputFile OutputFile::create(const std::string& path, bool exclusive) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, 0666);
  if (fd < 0) fail(NF4_ERR_IO, "{}: cannot create: {}", path, errno_text(errno));
  return OutputFile(fd, path);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

OutputFile::OutputFile(OutputFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), label_(std::move(o.label_)), written_(o.written_) {}

OutputFile& OutputFile::operator=(OutputFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    label_ = std::move(o.label_);
    written_ = o.written_;
  }
  return *this;
}

void OutputFile::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) fail(NF4_ERR_IO, "{}: write after close", label_);
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (bytes > 0) {
    // Linux writes at most ~2 GiB per call; larger requests just come back short.
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(NF4_ERR_IO, "{}: write failed after {} bytes: {}", label_, written_, errno_text(errno));
    }
    if (n == 0) fail(NF4_ERR_IO, "{}: write made no progress after {} bytes", label_, written_);
    p += n;
    bytes -= static_cast<std::size_t>(n);
    written_ += n;
  }
}

void OutputFile::sync() {
  if (fd_ < 0) fail(NF4_ERR_IO, "{}: sync after close", label_);
  while (::fsync(fd_) != 0) {
    if (errno == EINTR) continue;
    // /dev/null and pipes cannot be synced; that is not a lost write.
    if (errno == EINVAL || errno == EROFS) break;
    fail(NF4_ERR_IO, "{}: fsync failed: {}", label_, errno_text(errno));
  }
}

void OutputFile::close() {
  if (fd_ < 0) return;
  const int r = ::close(std::exchange(fd_, -1));
  if (r != 0 && errno != EINTR) fail(NF4_ERR_IO, "{}: close failed: {}", label_, errno_text(errno));
}

// ---- AtomicFile -------------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string final_path) : final_path_(std::move(final_path)) {
  for (int attempt = 0;; ++attempt) {
    temp_path_ = temp_name(final_path_);
    const int fd = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      file_ = OutputFile(fd, temp_path_);
      break;
    }
    const int e = errno;
    if (e != EEXIST || attempt >= 100)
      fail(NF4_ERR_IO, "{}: cannot create a temporary file in '{}': {}", final_path_, parent_dir(final_path_), errno_text(e));
  }
  file_.set_label(fmt::format("{} (temporary file {})", final_path_, temp_path_));
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    file_ = OutputFile();  // close first
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFile::commit() {
  file_.sync();
  file_.close();
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0)
    fail(NF4_ERR_IO, "{}: cannot rename the temporary file {} into place: {}", final_path_, temp_path_, errno_text(errno));
  committed_ = true;
  sync_dir(parent_dir(final_path_));
}

// ---- TempDir ----------------------------------------------------------------------------------

TempDir::TempDir(std::string final_path) : final_path_(std::move(final_path)) {
  for (int attempt = 0;; ++attempt) {
    path_ = temp_name(final_path_);
    if (::mkdir(path_.c_str(), 0777) == 0) break;
    const int e = errno;
    if (e != EEXIST || attempt >= 100)
      fail(NF4_ERR_IO, "{}: cannot create a temporary directory in '{}': {}", final_path_, parent_dir(final_path_),
           errno_text(e));
  }
}

TempDir::~TempDir() {
  if (committed_) return;
  for (const auto& n : names_) ::unlink((path_ + "/" + n).c_str());
  ::rmdir(path_.c_str());
}

OutputFile TempDir::create(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    fail(NF4_ERR_INVALID_ARGUMENT, "'{}' is not a plain file name", name);
  OutputFile f = OutputFile::create(path_ + "/" + name, /*exclusive=*/true);
  names_.push_back(name);
  f.set_label(fmt::format("{}/{} (temporary directory {})", final_path_, name, path_));
  return f;
}

void TempDir::commit(const std::string& last) {
  sync_dir(path_);
  struct stat st {};
  if (::stat(final_path_.c_str(), &st) != 0) {
    if (::rename(path_.c_str(), final_path_.c_str()) != 0)
      fail(NF4_ERR_IO, "{}: cannot rename the temporary directory {} into place: {}", final_path_, path_, errno_text(errno));
    committed_ = true;
    sync_dir(parent_dir(final_path_));
    return;
  }
  if (!S_ISDIR(st.st_mode)) fail(NF4_ERR_IO, "{}: exists and is not a directory", final_path_);
  std::vector<std::string> order;
  for (const auto& n : names_)
    if (n != last) order.push_back(n);
  for (const auto& n : names_)
    if (n == last) order.push_back(n);
  for (const auto& n : order) {
    const std::string from = path_ + "/" + n, to = final_path_ + "/" + n;
    if (::rename(from.c_str(), to.c_str()) != 0)
      fail(NF4_ERR_IO, "{}: cannot move {} into place: {}", to, from, errno_text(errno));
  }
  committed_ = true;
  ::rmdir(path_.c_str());
  sync_dir(final_path_);
}

}  // namespace nf4::io
