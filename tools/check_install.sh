#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks nf4 the way its users consume it, from an installed copy:
#   1. `cmake --install` of a configured build into a fresh prefix; the installed files are the
#      library, the public headers only, the CLI (and no other program: nf4_lab and the tuner stay
#      in the build tree), the CMake package and nf4.pc;
#   2. libnf4.so.<major> exports the nf4_* C API and nothing else (nm -D) and needs no libfmt at
#      link time, and carries none of the lab (tools/check_no_lab.sh: no bench runner, timing
#      mode, bitsandbytes peer or test-data generator) and no checkpoint I/O (nf4::io); the CLI
#      carries no peer and no test-data generator (tools/check_no_lab.sh --cli);
#   3. examples/ built as an application against the prefix with find_package(nf4) (the C example
#      and, when nf4 has Vulkan, the engine example), and run;
#   4. the C example built with the README's pkg-config line exactly (the program must start without
#      LD_LIBRARY_PATH: nf4.pc carries an rpath), then with warnings as errors, and a C++ (nf4.hpp)
#      program, all run;
#   5. nf4 embedded with add_subdirectory (configure only): no tests, tools or -Werror, no build
#      type forced, only include/ on the consumer's include path.
#
#   tools/check_install.sh [BUILD_DIR]      (default build; built here if it is not up to date)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build="${1:-build}"
work="$(mktemp -d "${TMPDIR:-/tmp}/nf4-install.XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
version="$(tr -d '[:space:]' <VERSION)"
major="${version%%.*}"
fail() { echo "check_install: FAILED: $*" >&2; exit 1; }

echo "== install $build into a fresh prefix"
cmake --build "$build" -j"$(nproc)" --target nf4lib nf4 >/dev/null
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir="$(cmake -L -N "$build" 2>/dev/null | sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p')"
libdir="$prefix/${libdir:-lib}"
so="$libdir/libnf4.so.$major"
[ -f "$so" ] || fail "no $so (is NF4_SHARED off in $build?)"
[ "$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')" = "libnf4.so.$major" ] || fail "SONAME of $so is not libnf4.so.$major"
headers="$(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')"
case "$headers" in
  "./nf4/nf4.h ./nf4/nf4.hpp ./nf4/version.h " | "./nf4/nf4.h ./nf4/nf4.hpp ./nf4/nf4_vulkan.h ./nf4/version.h ") ;;
  *) fail "installed headers are not exactly the public ones: $headers" ;;
esac
for f in "$libdir/cmake/nf4/nf4Config.cmake" "$libdir/cmake/nf4/nf4ConfigVersion.cmake" "$libdir/pkgconfig/nf4.pc" "$prefix/bin/nf4"; do
  [ -f "$f" ] || fail "$f was not installed"
done
[ "$("$prefix/bin/nf4" --version)" = "$version" ] || fail "nf4 --version is '$("$prefix/bin/nf4" --version)', VERSION says $version"
programs="$(ls "$prefix/bin" | tr '\n' ' ')"
[ "$programs" = "nf4 " ] || fail "installed programs are not exactly the CLI: $programs"
tools/check_no_lab.sh --cli "$prefix/bin/nf4"

echo "== exported symbols of libnf4.so.$major"
exported="$(nm -D --defined-only "$so" | awk '{print $NF}')"
others="$(grep -v '^nf4_' <<<"$exported" || true)"
[ -z "$others" ] || fail "libnf4 exports symbols outside the C API: $(head -5 <<<"$others" | tr '\n' ' ')"
api="$(grep -h '^NF4_API ' "$prefix"/include/nf4/*.h | sed -n 's/^[^(]*[ *]\(nf4_[a-z0-9_]*\)(.*/\1/p' | sort -u)"
missing="$(comm -13 <(sort -u <<<"$exported") <(echo "$api"))"
[ -z "$missing" ] || fail "declared in the headers but not exported: $missing"
echo "$(wc -l <<<"$exported") symbols, all nf4_*, every NF4_API function of the installed headers among them"
tools/check_no_lab.sh "$so"

echo "== find_package(nf4): examples/ as an application"
cmake -S examples -B "$work/examples" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/examples" -j"$(nproc)" >/dev/null
"$work/examples/nf4_dequantize_example" cpu | tail -2
if [ -f "$prefix/include/nf4/nf4_vulkan.h" ]; then
  [ -x "$work/examples/nf4_vulkan_engine_example" ] || fail "nf4 has Vulkan but the engine example was not built"
  "$work/examples/nf4_vulkan_engine_example" 64 4096 | tail -1
fi

echo "== pkg-config nf4: a C and a C++ program"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion nf4)" = "$version" ] || fail "pkg-config --modversion nf4 is not $version"
libs="$(pkg-config --libs nf4)"
case " $libs " in *fmt* | *json*) fail "pkg-config --libs nf4 names a private dependency: $libs" ;; esac
# The README's line as written (no rpath or LD_LIBRARY_PATH of this script's own: the program
# finds libnf4 through what nf4.pc gives), then with warnings as errors.
# shellcheck disable=SC2046  # pkg-config output is a list of flags
(cd "$work" && cp "$root/examples/dequantize.c" app.c && unset LD_LIBRARY_PATH &&
  cc app.c $(pkg-config --cflags --libs nf4) && ./a.out cpu | tail -1
) || fail "the README's pkg-config build (cc app.c \$(pkg-config --cflags --libs nf4)) did not build or run"
# shellcheck disable=SC2046,SC2086
cc -std=c99 -pedantic -Wall -Wextra -Werror examples/dequantize.c -o "$work/dequantize-pc" $(pkg-config --cflags nf4) $libs
env -u LD_LIBRARY_PATH "$work/dequantize-pc" cpu | tail -1
cat >"$work/hpp.cpp" <<'EOF'
#include <nf4/nf4.hpp>
#include <cstdio>
int main() {
  nf4::Context ctx(NF4_BACKEND_CPU);
  nf4_tensor t{};  // numel 0: rejected before any work, as an nf4::StatusError
  try {
    ctx.dequantize_host(t);
  } catch (const nf4::StatusError& e) {
    std::printf("nf4.hpp: %s -> %s\n", nf4_status_string(e.status()), e.what());
    return e.status() == NF4_OK;
  }
  return 1;
}
EOF
# shellcheck disable=SC2046,SC2086
c++ -std=c++17 -Wall -Wextra -Werror "$work/hpp.cpp" -o "$work/hpp" $(pkg-config --cflags nf4) $libs
env -u LD_LIBRARY_PATH "$work/hpp"

echo "== add_subdirectory(nf4) in another project (configure only)"
mkdir -p "$work/embed"
cat >"$work/embed/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.22)
project(embeds_nf4 LANGUAGES C CXX)
add_subdirectory("$root" nf4)
add_executable(app "$root/examples/dequantize.c")
target_link_libraries(app PRIVATE nf4::nf4)
foreach(t nf4_tests nf4_cli_tests nf4 nf4_lab nf4_cuda_tune nf4_dequantize_example nf4_bench nf4_testdata nf4_checkpoint)
  if(TARGET \${t})
    message(FATAL_ERROR "embedded nf4 defines \${t}: tests, tools, checkpoint I/O, the lab and examples must be off")
  endif()
endforeach()
if(NF4_WERROR OR CMAKE_BUILD_TYPE)
  message(FATAL_ERROR "embedded nf4 set NF4_WERROR=\${NF4_WERROR} / CMAKE_BUILD_TYPE=\${CMAKE_BUILD_TYPE}")
endif()
get_target_property(inc nf4lib INTERFACE_INCLUDE_DIRECTORIES)
foreach(dir IN LISTS inc)
  string(REGEX REPLACE "^\\\\$<BUILD_INTERFACE:(.*)>\$" "\\\\1" dir "\${dir}")
  if(dir STREQUAL "$root" OR dir MATCHES "^$root/(core|backends|bench|lab|tools|tests)")
    message(FATAL_ERROR "nf4::nf4 puts \${dir} on the consumer's include path")
  endif()
endforeach()
message(STATUS "embedded nf4: include path \${inc}")
EOF
if ! cmake -S "$work/embed" -B "$work/embed/build" -G Ninja -DNF4_CUDA=OFF -DNF4_VULKAN=OFF >"$work/embed.log" 2>&1; then
  cat "$work/embed.log" >&2
  fail "the embedding project did not configure"
fi
grep 'embedded nf4' "$work/embed.log"
echo "check_install: all passed"
