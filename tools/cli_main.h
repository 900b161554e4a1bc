// SPDX-License-Identifier: MIT
// How the `nf4` tool parses its command line and turns the outcome into an exit status; shared by
// tools/main.cpp and the in-process CLI tests, so both see the same statuses and messages.
//   0    success (also --help, --version)
//   1    an error (its message on stderr), or a check that found differences (verify)
//   2    a usage error: unknown option or command, missing or extra argument, an option value
//        that is not allowed; the message and the command's usage line go to stderr
//   130  convert interrupted by SIGINT, 143 by SIGTERM
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "core/error.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace nf4::cli {

inline constexpr int kExitUsage = 2;

// "Usage: nf4 convert [OPTIONS] IN OUT" for the deepest command the parse reached.
inline std::string usage_line(const CLI::App& app) {
  const CLI::App* a = &app;
  std::string name = "nf4";
  for (auto subs = a->get_subcommands(); !subs.empty(); subs = a->get_subcommands()) {
    a = subs.front();
    name += " " + a->get_name();
  }
  if (const auto f = std::dynamic_pointer_cast<CLI::Formatter>(a->get_formatter())) return f->make_usage(a, name);
  return "Usage: " + name + " ...\n";
}

// Parses and runs the command; returns the exit status (see the top of this file).
inline int run_app(CLI::App& app, int argc, const char* const* argv) {
  const auto usage_error = [&](const char* message) {
    std::fprintf(stderr, "nf4: error: %s\n%sRun with --help for more information.\n", message, usage_line(app).c_str());
    return kExitUsage;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    return usage_error(e.what());
  } catch (const UsageError& e) {
    return usage_error(e.what());
  } catch (const ExitCode& e) {
    return e.code;
  } catch (const std::exception& e) {  // nf4::Error and anything else
    std::fprintf(stderr, "nf4: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace nf4::cli
