// SPDX-License-Identifier: MIT
#include <CLI/CLI.hpp>

#include "nf4/nf4.h"
#include "tools/cli_main.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"nf4: dequantize bitsandbytes 4-bit (NF4/FP4) weights, bit-identical to bitsandbytes"};
  app.set_version_flag("--version", nf4_version());
  app.require_subcommand(1);
  nf4::cli::add_convert_command(app);
  nf4::cli::add_inspect_command(app);
  nf4::cli::add_verify_command(app);
  nf4::cli::add_bench_command(app);
  nf4::cli::plain_help(app);
  return nf4::cli::run_app(app, argc, argv);
}
