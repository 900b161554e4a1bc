// SPDX-License-Identifier: MIT
// The `nf4` command-line tool: each subcommand lives in its own file and registers itself on the
// CLI11 app. A subcommand's callback throws nf4::Error on failure; main() prints it and exits 1.
#pragma once

#include <cstddef>

#include "nf4/nf4.h"

namespace CLI {
class App;
}

namespace nf4 {
class Backend;
}

namespace nf4::cli {

// A peer implementation timed on the same host tensors as the backend (the development binary's
// bitsandbytes, lab/bnb_peer.h): the median in microseconds, < 0 where it cannot run.
using BenchPeer = double (*)(Backend& backend, const char* library, const nf4_tensor* host, std::size_t count, int rotations,
                             int iters);

void add_convert_command(CLI::App& app);  // convert.cpp
void add_inspect_command(CLI::App& app);  // inspect.cpp
void add_verify_command(CLI::App& app);   // verify.cpp
void add_bench_command(CLI::App& app, BenchPeer peer = nullptr);  // bench.cpp; --peer-bnb with a peer

// Exit status a subcommand callback asks for (e.g. verify found differences): throw this.
struct ExitCode {
  int code;
};

}  // namespace nf4::cli
