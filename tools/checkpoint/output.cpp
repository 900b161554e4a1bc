// SPDX-License-Identifier: MIT
#include "tools/checkpoint/output.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "core/error.h"

namespace nf4::io {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// ".NAME.nf4-KIND-PID-START-N-RANDOM": hidden, unique within and across processes, and naming
// the process that made it (START: its start time, so a reused pid is not mistaken for it).
std::string temp_name(const std::string& final_path, const char* kind) {
  static std::atomic<unsigned> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string dir = parent_dir(final_path);
  return fmt::format("{}/.{}.nf4-{}-{}-{}-{:08x}", dir, base_name(final_path), kind, process_token(), counter++,
                     static_cast<std::uint32_t>(rng()));
}

// Start time of process `pid` in clock ticks after boot (field 22 of /proc/PID/stat); 0 if
// unknown, -1 if there is no such process.
long long start_time_of(pid_t pid) {
  const std::string path = fmt::format("/proc/{}/stat", pid);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    return ::kill(pid, 0) != 0 && errno == ESRCH ? -1 : 0;
  }
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (!p) return 0;
  int field = 2;
  for (++p; *p; ++p)
    if (*p == ' ' && ++field == 22) return std::strtoll(p + 1, nullptr, 10);
  return 0;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace

std::string process_token() {
  static const std::string token = [] {
    const long long start = start_time_of(::getpid());
    return fmt::format("{}-{}", ::getpid(), start > 0 ? start : 0);
  }();
  return token;
}

std::size_t remove_stale_temporaries(const std::string& final_path) {
  const std::string dir = parent_dir(final_path);
  std::size_t removed = 0;
  for (const char* kind : {"tmp", "old"}) {
    const std::string prefix = fmt::format(".{}.nf4-{}-", base_name(final_path), kind);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      // PID-START-N-RANDOM
      unsigned long long pid = 0, start = 0, n = 0;
      unsigned random = 0;
      char end = 0;
      if (std::sscanf(name.c_str() + prefix.size(), "%llu-%llu-%llu-%8x%c", &pid, &start, &n, &random, &end) != 4) continue;
      if (pid == 0 || pid > static_cast<unsigned long long>(INT32_MAX)) continue;
      const long long now = start_time_of(static_cast<pid_t>(pid));
      const bool gone = now < 0 || (now > 0 && start > 0 && static_cast<unsigned long long>(now) != start);
      if (!gone) continue;
      remove_tree(fmt::format("{}/{}", dir, name));
      ++removed;
    }
  }
  return removed;
}

// ---- OutputLock -------------------------------------------------------------------------------

OutputLock::OutputLock(const std::string& final_path) {
  path_ = fmt::format("{}/.{}.nf4-lock", parent_dir(final_path), base_name(final_path));
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0)
      fail(NF4_ERR_IO, "{}: cannot create its lock file {}: {}", final_path, path_, errno_text(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      ::close(fd);
      if (e == EWOULDBLOCK)
        fail(NF4_ERR_IO, "{}: another nf4 process is writing it (it holds the lock {}); wait for it to finish or stop it",
             final_path, path_);
      fail(NF4_ERR_IO, "{}: cannot lock {}: {}", final_path, path_, errno_text(e));
    }
    // The previous holder unlinks the file before releasing it: a lock on an unlinked file
    // guards nothing, so make sure the locked file is the one the name leads to.
    struct stat a {}, b {};
    if (::fstat(fd, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      fd_ = fd;
      break;
    }
    ::close(fd);
    if (attempt >= 100) fail(NF4_ERR_IO, "{}: cannot take the lock {}: it keeps being replaced", final_path, path_);
  }
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
}

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
    temp_path_ = temp_name(final_path_, "tmp");
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
    path_ = temp_name(final_path_, "tmp");
    if (::mkdir(path_.c_str(), 0777) == 0) break;
    const int e = errno;
    if (e != EEXIST || attempt >= 100)
      fail(NF4_ERR_IO, "{}: cannot create a temporary directory in '{}': {}", final_path_, parent_dir(final_path_),
           errno_text(e));
  }
}

TempDir::~TempDir() {
  if (!committed_) remove_tree(path_);
}

std::string TempDir::checked_path(const std::string& rel) const {
  bool plain = !rel.empty();
  for (std::size_t at = 0; plain && at <= rel.size();) {
    const std::size_t slash = std::min(rel.find('/', at), rel.size());
    const std::string_view part = std::string_view(rel).substr(at, slash - at);
    plain = !part.empty() && part != "." && part != "..";
    at = slash + 1;
  }
  if (!plain) fail(NF4_ERR_INVALID_ARGUMENT, "'{}' is not a relative path of plain names", rel);
  return path_ + "/" + rel;
}

void TempDir::make_dir(const std::string& rel) {
  const std::string p = checked_path(rel);
  if (::mkdir(p.c_str(), 0777) != 0)
    fail(NF4_ERR_IO, "{}/{}: cannot create the directory (temporary directory {}): {}", final_path_, rel, path_, errno_text(errno));
  dirs_.push_back(p);
}

OutputFile TempDir::create(const std::string& rel) {
  OutputFile f = OutputFile::create(checked_path(rel), /*exclusive=*/true);
  f.set_label(fmt::format("{}/{} (temporary directory {})", final_path_, rel, path_));
  return f;
}

void TempDir::commit() {
  {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail(NF4_ERR_IO, "{}: cannot open the temporary directory {}: {}", final_path_, path_, errno_text(errno));
    const int r = ::syncfs(fd);
    const int e = errno;
    ::close(fd);
    if (r != 0) fail(NF4_ERR_IO, "{}: cannot sync the files written into {}: {}", final_path_, path_, errno_text(e));
  }
  for (const auto& d : dirs_) sync_dir(d);
  sync_dir(path_);
  struct stat st {};
  if (::lstat(final_path_.c_str(), &st) != 0) {
    if (::rename(path_.c_str(), final_path_.c_str()) != 0)
      fail(NF4_ERR_IO, "{}: cannot rename the temporary directory {} into place: {}", final_path_, path_, errno_text(errno));
    committed_ = true;
    sync_dir(parent_dir(final_path_));
    return;
  }
  if (!S_ISDIR(st.st_mode)) fail(NF4_ERR_IO, "{}: exists and is not a directory", final_path_);
  // Swap the two directories in one step where the kernel can, so that final_path is always
  // entirely the old directory or entirely the new one; then delete the old one.
#if defined(SYS_renameat2) && defined(RENAME_EXCHANGE)
  if (::syscall(SYS_renameat2, AT_FDCWD, path_.c_str(), AT_FDCWD, final_path_.c_str(), RENAME_EXCHANGE) == 0) {
    committed_ = true;
    sync_dir(parent_dir(final_path_));
    remove_tree(path_);  // the old directory, now under the temporary name
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EPERM)
    fail(NF4_ERR_IO, "{}: cannot swap the temporary directory {} into place: {}", final_path_, path_, errno_text(errno));
#endif
  // No exchange on this file system: move the old directory aside, then the new one in (for a
  // moment there is no final_path, but never a mix of the two).
  const std::string old = temp_name(final_path_, "old");
  if (::rename(final_path_.c_str(), old.c_str()) != 0)
    fail(NF4_ERR_IO, "{}: cannot move the old directory aside to {}: {}", final_path_, old, errno_text(errno));
  if (::rename(path_.c_str(), final_path_.c_str()) != 0) {
    const int e = errno;
    ::rename(old.c_str(), final_path_.c_str());
    fail(NF4_ERR_IO, "{}: cannot rename the temporary directory {} into place: {}", final_path_, path_, errno_text(e));
  }
  committed_ = true;
  sync_dir(parent_dir(final_path_));
  remove_tree(old);
}

}  // namespace nf4::io
