// SPDX-License-Identifier: MIT
// Writing files so that a reader never sees a partial one. Every failure of open, write, fsync,
// close or rename becomes nf4::Error(NF4_ERR_IO) naming the file and the system's reason (a full
// disk reads "No space left on device"). Outputs are first written under a temporary name in the
// destination's own directory (a rename is only atomic within one file system), fsync'd, then
// renamed into place; a temporary that is not committed is removed when its owner dies, so an
// error or an interrupt (which the caller turns into an exception) leaves nothing behind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nf4::io {

// A file open for writing (move-only; closes on destruction, ignoring errors then).
class OutputFile {
 public:
  OutputFile() = default;
  // Creates `path` (mode 0666 minus the umask). exclusive: fail if it exists.
  static OutputFile create(const std::string& path, bool exclusive);
  ~OutputFile();
  OutputFile(OutputFile&& o) noexcept;
  OutputFile& operator=(OutputFile&& o) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Writes all bytes (retrying short writes and EINTR).
  void write(const void* data, std::size_t bytes);
  void sync();   // fsync: data and size are on disk (a full disk may only show up here)
  void close();  // reports close errors (NFS reports deferred write errors at close)
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  std::int64_t bytes_written() const { return written_; }
  // The name used in error messages (defaults to the path).
  void set_label(std::string label) { label_ = std::move(label); }

 private:
  friend class AtomicFile;
  OutputFile(int fd, std::string path) : fd_(fd), path_(path), label_(std::move(path)) {}
  int fd_ = -1;
  std::string path_, label_;
  std::int64_t written_ = 0;
};

// A file that appears at `final_path` only when commit() succeeds.
class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  OutputFile& file() { return file_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }
  // fsync, close, rename over final_path (replacing a file there), fsync the directory.
  void commit();

 private:
  std::string final_path_, temp_path_;
  OutputFile file_;
  bool committed_ = false;
};

// An exclusive lock on an output path for as long as this object lives: a lock file
// ".NAME.nf4-lock" beside it, flock'ed, removed on destruction. A second process asking for the
// same path fails at once with NF4_ERR_IO saying that another nf4 process is writing it.
class OutputLock {
 public:
  explicit OutputLock(const std::string& final_path);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Temporary names carry the creating process's token "PID-START" (START: its start time after
// boot), so a later run can tell the leftovers of a killed process from live ones.
std::string process_token();
// Removes the temporary files and directories of `final_path` whose process is gone (killed by
// SIGKILL, a power cut). Call while holding final_path's OutputLock. Returns how many.
std::size_t remove_stale_temporaries(const std::string& final_path);

// A temporary directory next to `final_path` that receives several files, then moves into place.
class TempDir {
 public:
  explicit TempDir(std::string final_path);
  ~TempDir();  // removes the directory and everything in it unless committed
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Creates the subdirectory `rel` ("a" or "a/b", plain names; parents first).
  void make_dir(const std::string& rel);
  // Creates `rel` (a plain file name, or one inside a directory made by make_dir). The caller
  // closes it; there is no need to sync it: commit() syncs everything written once.
  OutputFile create(const std::string& rel);
  // Syncs the file system holding the directory once (syncfs: every file written into it, however
  // many, instead of an fsync per file), then each directory, then makes it visible at
  // final_path. If nothing exists there, it is renamed into place.
  // If a directory exists there (the caller allowed replacing it), the two are exchanged in one
  // step (renameat2 RENAME_EXCHANGE; where the file system cannot, the old one is renamed aside
  // first) and the old directory is deleted: final_path is never a mix of old and new files.
  void commit();

 private:
  std::string checked_path(const std::string& rel) const;
  std::string final_path_, path_;
  std::vector<std::string> dirs_;
  bool committed_ = false;
};

// Path helpers (no file-system access).
std::string parent_dir(const std::string& path);  // "." for a bare name
std::string base_name(const std::string& path);
// fsync a directory so a rename inside it survives a crash (errors ignored where unsupported).
void sync_dir(const std::string& dir);
// True when both paths exist and name the same file or directory (device and inode).
bool same_file(const std::string& a, const std::string& b);

}  // namespace nf4::io
