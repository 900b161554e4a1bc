// SPDX-License-Identifier: MIT
// The `nf4` command-line tool: each subcommand lives in its own file and registers itself on the
// CLI11 app. A subcommand's callback throws nf4::Error on failure; main() prints it and exits 1.
#pragma once

namespace CLI {
class App;
}

namespace nf4::cli {

void add_convert_command(CLI::App& app);  // convert.cpp
void add_inspect_command(CLI::App& app);  // inspect.cpp
void add_verify_command(CLI::App& app);   // verify.cpp
void add_bench_command(CLI::App& app);    // bench.cpp

// Exit status a subcommand callback asks for (e.g. verify found differences): throw this.
struct ExitCode {
  int code;
};

}  // namespace nf4::cli
