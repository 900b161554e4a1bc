// SPDX-License-Identifier: MIT
#include "tools/checkpoint/file_open.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace nf4::io {

namespace {

// The path of an open file as the kernel resolved it (no race with a rename of the link).
std::string real_path_of_fd(int fd, const std::string& path) {
  char buf[PATH_MAX + 1];
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(proc.c_str(), buf, PATH_MAX);
  if (n > 0 && buf[0] == '/') return std::string(buf, static_cast<std::size_t>(n));
  return real_path(path);  // no /proc: resolve the name instead
}

bool inside(const std::string& file, const std::string& root) {
  if (root == "/") return true;
  return file.size() > root.size() && file.compare(0, root.size(), root) == 0 && file[root.size()] == '/';
}

}  // namespace

const char* file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

std::string real_path(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (!r) fail(NF4_ERR_IO, "{}: cannot resolve: {}", path, std::strerror(errno));
  std::string s(r);
  ::free(r);
  return s;
}

InputFile InputFile::open(const std::string& path, const InputPolicy* policy, const std::function<bool()>& close_one) {
  // O_NONBLOCK: opening a FIFO without a writer returns at once (then fstat refuses it);
  // O_NOCTTY: a terminal device never becomes the controlling terminal.
  int fd = -1, err = 0;
  for (;;) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    err = errno;
    if (fd >= 0 || (err != EMFILE && err != ENFILE) || !close_one || !close_one()) break;
  }
  if (fd < 0) fail(NF4_ERR_IO, "{}: cannot open: {}", path, std::strerror(err));
  InputFile f;
  f.fd_ = fd;
  f.path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(NF4_ERR_IO, "{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(NF4_ERR_IO, "{}: {}, not a regular file; refusing to read it", path, file_kind(st.st_mode));
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  f.size_ = static_cast<std::int64_t>(st.st_size);
  if (policy && !policy->root.empty() && !policy->follow_symlinks) {
    const std::string real = real_path_of_fd(fd, path);
    if (!inside(real, policy->root))
      fail(NF4_ERR_IO,
           "{}: a symbolic link to a file outside the input directory {}; refusing to read it (pass --follow-symlinks to "
           "allow links out of the directory, e.g. for a Hugging Face cache snapshot, whose files link into its blobs/)",
           path, policy->root);
  }
  return f;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), size_(o.size_) {}

InputFile& InputFile::operator=(InputFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    size_ = o.size_;
  }
  return *this;
}

void InputFile::read_at(std::int64_t offset, void* dst, std::int64_t bytes) const {
  auto* p = static_cast<std::uint8_t*>(dst);
  std::int64_t done = 0;
  while (done < bytes) {
    // Linux reads at most ~2 GiB per call.
    const std::size_t want = static_cast<std::size_t>(std::min<std::int64_t>(bytes - done, std::int64_t{1} << 30));
    const ssize_t n = ::pread(fd_, p + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(NF4_ERR_IO, "{}: read of {} bytes at offset {} failed: {}", path_, bytes, offset, std::strerror(errno));
    }
    if (n == 0)
      fail(NF4_ERR_IO, "{}: the file ends at byte {}, before the {} bytes at offset {} (was it truncated while being read?)", path_,
           offset + done, bytes, offset);
    done += n;
  }
}

std::string read_text_file(const std::string& path, std::int64_t max_bytes, const InputPolicy* policy) {
  const InputFile f = InputFile::open(path, policy);
  if (f.size() > max_bytes) fail(NF4_ERR_FORMAT, "{}: {} bytes is more than the {} bytes accepted for this file", path, f.size(), max_bytes);
  std::string text(static_cast<std::size_t>(f.size()), '\0');
  f.read_at(0, text.data(), f.size());
  return text;
}

}  // namespace nf4::io
