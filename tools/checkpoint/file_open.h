// SPDX-License-Identifier: MIT
// Opening checkpoint inputs safely: only regular files (checked without blocking, so a FIFO or a
// device named like a shard is refused instead of hanging or reading without end), read with
// pread (a file truncated by someone else while it is read gives an I/O error, not SIGBUS), and,
// for files found inside a model directory, only files that really are inside that directory
// unless the caller allows symbolic links out of it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace nf4::io {

// Where the files of one input may live.
struct InputPolicy {
  std::string root;              // real path of the input directory; empty: no containment check
  bool follow_symlinks = false;  // allow files that resolve outside `root`
};

// "a FIFO", "a character device", "a directory", ... for a stat mode (st_mode).
const char* file_kind(unsigned mode);

// The real path of an existing file or directory (symlinks resolved). Throws NF4_ERR_IO.
std::string real_path(const std::string& path);

// A regular file open for reading (move-only).
class InputFile {
 public:
  InputFile() = default;
  // Throws nf4::Error(NF4_ERR_IO) naming `path`: cannot open, not a regular file, or (with a
  // policy that has a root) resolving outside it. When the process is out of file descriptors
  // (EMFILE, ENFILE) and `close_one` is given, it is called to close one of the caller's other
  // files and the open is retried, until it succeeds or `close_one` returns false: the number of
  // files a reader may keep open is a guess, since GPU drivers hold descriptors of their own.
  static InputFile open(const std::string& path, const InputPolicy* policy = nullptr,
                        const std::function<bool()>& close_one = {});
  ~InputFile();
  InputFile(InputFile&& o) noexcept;
  InputFile& operator=(InputFile&& o) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::int64_t size() const { return size_; }  // at open time
  // Reads exactly `bytes` at `offset` (retrying short reads and EINTR). Throws NF4_ERR_IO when
  // the file has become shorter than that (truncated while being read) or the read fails.
  void read_at(std::int64_t offset, void* dst, std::int64_t bytes) const;

 private:
  int fd_ = -1;
  std::string path_;
  std::int64_t size_ = 0;
};

// A whole small file as text (config.json, an index): at most `max_bytes`, otherwise
// NF4_ERR_FORMAT naming the file and the limit. Same opening rules as InputFile::open.
std::string read_text_file(const std::string& path, std::int64_t max_bytes, const InputPolicy* policy = nullptr);

}  // namespace nf4::io
