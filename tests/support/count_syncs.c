// SPDX-License-Identifier: MIT
// Preloaded into a process (LD_PRELOAD) by the fault tests: counts its fsync, fdatasync and
// syncfs calls, passing each on, and writes "fsync N\nsyncfs M\n" to $NF4_COUNT_SYNCS_OUT when it
// exits, so a test can tell one sync per directory from one per file without timing a disk.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static atomic_long file_syncs, fs_syncs;

static void* next_symbol(const char* name) { return dlsym(RTLD_NEXT, name); }

int fsync(int fd) {
  atomic_fetch_add(&file_syncs, 1);
  int (*real)(int) = (int (*)(int))next_symbol("fsync");
  return real(fd);
}

int fdatasync(int fd) {
  atomic_fetch_add(&file_syncs, 1);
  int (*real)(int) = (int (*)(int))next_symbol("fdatasync");
  return real(fd);
}

int syncfs(int fd) {
  atomic_fetch_add(&fs_syncs, 1);
  int (*real)(int) = (int (*)(int))next_symbol("syncfs");
  return real(fd);
}

__attribute__((destructor)) static void report(void) {
  const char* path = getenv("NF4_COUNT_SYNCS_OUT");
  if (!path) return;
  FILE* f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "fsync %ld\nsyncfs %ld\n", atomic_load(&file_syncs), atomic_load(&fs_syncs));
  fclose(f);
}
