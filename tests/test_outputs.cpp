// SPDX-License-Identifier: MIT
// Outputs (tools/checkpoint/output.h): a full disk reported naming the file, atomic files and temporary
// directories (visible only when committed, an existing directory replaced as a whole), the output
// lock, and the removal of leftover temporaries of dead processes.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/checkpoint/output.h"
#include "tests/support/io.h"

using namespace nf4;
using nf4::test::contains;
using nf4::test::error_of;
using nf4::test::ScratchDir;

TEST_CASE("a full disk is reported as 'No space left on device' naming the file") {
  if (::access("/dev/full", W_OK) != 0) {
    MESSAGE("skipped: /dev/full is not writable here");
    return;
  }
  io::OutputFile f = io::OutputFile::create("/dev/full", /*exclusive=*/false);
  std::vector<std::uint8_t> data(1 << 16);
  try {
    f.write(data.data(), data.size());
    FAIL("write to /dev/full succeeded");
  } catch (const Error& e) {
    CHECK(e.status() == NF4_ERR_IO);
    CHECK_MESSAGE(contains(e.what(), "No space left on device"), e.what());
    CHECK_MESSAGE(contains(e.what(), "/dev/full"), e.what());
  }
}

TEST_CASE("atomic file: visible only after commit, temporary removed otherwise, mode follows the umask") {
  ScratchDir dir;
  const std::string target = dir / "out.bin";
  {
    io::AtomicFile f(target);
    f.file().write("abc", 3);
    CHECK(test::read_bytes(target).empty());
    CHECK(dir.entries().size() == 1);  // only the temporary
    CHECK(contains(dir.entries()[0], ".nf4-tmp-"));
  }
  CHECK(dir.entries().empty());
  {
    io::AtomicFile f(target);
    f.file().write("abc", 3);
    f.commit();
  }
  CHECK(dir.entries() == std::vector<std::string>{"out.bin"});
  CHECK(test::read_bytes(target) == std::vector<std::uint8_t>{'a', 'b', 'c'});
  struct stat st {};
  REQUIRE(::stat(target.c_str(), &st) == 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  CHECK((st.st_mode & 0777) == (0666 & ~mask));
  // Replacing an existing file.
  {
    io::AtomicFile f(target);
    f.file().write("xy", 2);
    f.commit();
  }
  CHECK(test::read_bytes(target) == std::vector<std::uint8_t>{'x', 'y'});
  CHECK_THROWS_AS(io::AtomicFile(dir / "no-such-dir/out.bin"), Error);
}

TEST_CASE("temporary directory: renamed into place, swapped with an existing one as a whole, or removed") {
  ScratchDir dir;
  const std::string out = dir / "out";
  {
    io::TempDir t(out);
    io::OutputFile a = t.create("a.txt");
    a.write("1", 1);
    a.close();
    CHECK_THROWS_AS(t.create("../evil"), Error);
  }
  CHECK(dir.entries().empty());
  {
    io::TempDir t(out);
    t.create("a.txt").write("1", 1);
    t.create("index.json").write("{}", 2);
    t.commit();
  }
  CHECK(dir.entries() == std::vector<std::string>{"out"});
  CHECK(dir.entries("out") == (std::vector<std::string>{"a.txt", "index.json"}));
  test::write_bytes(out + "/old.txt", {'k'});
  struct stat before {};
  REQUIRE(::stat(out.c_str(), &before) == 0);
  {
    io::TempDir t(out);
    t.create("a.txt").write("2", 1);
    // Until the commit, OUT is entirely the old directory.
    CHECK(dir.entries("out") == (std::vector<std::string>{"a.txt", "index.json", "old.txt"}));
    t.commit();
  }
  // Then entirely the new one (another directory, not files moved into the old), the old removed.
  CHECK(dir.entries() == std::vector<std::string>{"out"});
  CHECK(dir.entries("out") == (std::vector<std::string>{"a.txt"}));
  CHECK(test::read_bytes(out + "/a.txt") == std::vector<std::uint8_t>{'2'});
  struct stat after {};
  REQUIRE(::stat(out.c_str(), &after) == 0);
  CHECK(after.st_ino != before.st_ino);
}

TEST_CASE("output lock: a second holder fails at once with a clear message; the lock file goes away") {
  ScratchDir dir;
  const std::string out = dir / "out";
  {
    io::OutputLock first(out);
    CHECK(dir.entries() == std::vector<std::string>{".out.nf4-lock"});
    const auto err = error_of([&] { io::OutputLock second(out); });
    CHECK(err.first == NF4_ERR_IO);
    CHECK_MESSAGE(contains(err.second, "another nf4 process is writing it"), err.second);
  }
  CHECK(dir.entries().empty());
  io::OutputLock again(out);  // free again
}

TEST_CASE("leftover temporaries of a dead process are removed; those of live processes are kept") {
  ScratchDir dir;
  const std::string out = dir / "out";
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int st = 0;
  ::waitpid(child, &st, 0);  // a pid that is gone
  const std::string dead_dir = ".out.nf4-tmp-" + std::to_string(child) + "-12345-0-0badf00d";
  const std::string dead_old = ".out.nf4-old-" + std::to_string(child) + "-12345-3-0badf00d";
  const std::string live = ".out.nf4-tmp-" + io::process_token() + "-7-12345678";
  const std::string other = ".other.nf4-tmp-" + std::to_string(child) + "-12345-0-0badf00d";
  for (const auto& d : {dead_dir, dead_old}) {
    std::filesystem::create_directory(dir / d);
    test::write_bytes(dir / (d + "/model.safetensors"), {1, 2, 3});
  }
  test::write_bytes(dir / live, {1});
  test::write_bytes(dir / other, {1});
  CHECK(io::remove_stale_temporaries(out) == 2);
  CHECK(dir.entries() == (std::vector<std::string>{other, live}));
}
