// SPDX-License-Identifier: MIT
// nf4_lab: the development binary, built with the tools and never installed. Its `bench` is the
// installed CLI's (tools/bench.cpp) with the peers it times on the same tensors: bitsandbytes'
// CUDA library (--peer-bnb), where the CUDA backend is built.
#include <CLI/CLI.hpp>

#include "nf4/nf4.h"
#include "tools/cli_main.h"
#include "tools/commands.h"
#if defined(NF4_HAVE_CUDA)
#include "lab/bnb_peer.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"nf4_lab: nf4's development commands (not installed)"};
  app.set_version_flag("--version", nf4_version());
  app.require_subcommand(1);
#if defined(NF4_HAVE_CUDA)
  nf4::cli::add_bench_command(app, nf4::lab::time_bitsandbytes_us);
#else
  nf4::cli::add_bench_command(app);
#endif
  nf4::cli::plain_help(app);
  return nf4::cli::run_app(app, argc, argv);
}
