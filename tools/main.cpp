// SPDX-License-Identifier: MIT
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "core/error.h"
#include "nf4/nf4.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"nf4: dequantize bitsandbytes 4-bit (NF4/FP4) weights, bit-identical to bitsandbytes"};
  app.set_version_flag("--version", nf4_version());
  app.require_subcommand(1);
  nf4::cli::add_convert_command(app);
  nf4::cli::add_inspect_command(app);
  nf4::cli::add_verify_command(app);
  nf4::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const nf4::cli::ExitCode& e) {
    return e.code;
  } catch (const nf4::Error& e) {
    std::fprintf(stderr, "nf4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nf4: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
