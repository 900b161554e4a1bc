// SPDX-License-Identifier: MIT
// How the `nf4` tool parses its command line and turns the outcome into an exit status; shared by
// tools/main.cpp and the in-process CLI tests, so both see the same statuses and messages.
//   0    success (also --help, --version)
//   1    an error (its message on stderr), or a check that found differences (verify), or a
//        failed write to standard output (a full disk, a closed pipe): the output is incomplete
//   2    a usage error: unknown option or command, missing or extra argument, an option value
//        that is not allowed; the message and the command's usage line go to stderr
//   130  convert interrupted by SIGINT, 143 by SIGTERM
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "core/error.h"
#include "tools/checkpoint/json_limits.h"
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

// Edit distance, for "did you mean" (command names are short).
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The first argument must be a command or one of the top-level flags; CLI11 reports anything else
// only as "A subcommand is required", naming neither the misspelt command nor the unknown option.
inline std::string first_argument_problem(const CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2) return {};
  const std::string first = argv[1];
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  if (first.rfind("-", 0) == 0) {
    if (first == "-h" || first == "--help" || first == "--version") return {};
    return fmt::format("unknown option '{}' (nf4 takes a command first: {})", io::terminal_text(first), list);
  }
  std::string best;
  std::size_t best_distance = 3;  // suggest only near misses
  for (const auto& n : names) {
    if (n == first) return {};
    if (const std::size_t d = edit_distance(first, n); d < best_distance) best_distance = d, best = n;
  }
  return fmt::format("unknown command '{}'{}; the commands are {}", io::terminal_text(first),
                     best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best), list);
}

// Standard output is buffered: a full disk or a closed pipe shows up at the flush. The command's
// output is then incomplete, which is an error even when the command itself succeeded.
inline int check_stdout(int status) {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  const int e = errno;
  if (!flush_failed && !std::ferror(stdout)) return status;
  // The failing write may have been an earlier one, whose errno is gone: then no reason is given.
  std::fprintf(stderr, "nf4: error: writing to standard output failed%s%s; the output is incomplete\n", e ? ": " : "",
               e ? std::strerror(e) : "");
  return status == 0 ? 1 : status;
}

// Help in plain words: CLI11 renders an option's value from its type, validators and default
// ("--batch-mb FLOAT:FLOAT in [1 - 1.04858e+06]=256"). Instead each value is named after its
// option ("--batch-mb MIB" where the option says so with a placeholder of its own, else
// "--dtype DTYPE"), and the default goes into the description in words; descriptions state the
// allowed range themselves. Positionals show "(required)".
inline void plain_help(CLI::App& app) {
  const auto fix = [](CLI::App& a) {
    for (CLI::Option* o : a.get_options([](const CLI::Option*) { return true; })) {
      const bool flag = o->get_type_size() == 0 || o->get_items_expected_max() == 0;
      if (flag || !o->get_option_text().empty()) continue;  // flags take no value; already plain
      if (o->get_positional()) {
        o->option_text(o->get_required() ? "(required)" : "");
        continue;
      }
      std::string name = o->get_lnames().empty() ? o->get_name() : o->get_lnames().front();
      for (auto& c : name) c = c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      o->option_text(name);
      std::string d = o->get_default_str();
      if (!d.empty()) {
        if (d.front() == '[' && d.back() == ']') d = d.substr(1, d.size() - 2);
        o->description(o->get_description() + " (default: " + d + ")");
      }
    }
  };
  fix(app);
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) fix(*sub);
  app.get_formatter()->label("REQUIRED", "(required)");
}

// Parses and runs the command; returns the exit status (see the top of this file).
inline int run_app(CLI::App& app, int argc, const char* const* argv) {
  const auto usage_error = [&](const char* message) {
    std::fprintf(stderr, "nf4: error: %s\n%sRun with --help for more information.\n", message, usage_line(app).c_str());
    return kExitUsage;
  };
  if (const std::string problem = first_argument_problem(app, argc, argv); !problem.empty()) return usage_error(problem.c_str());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return check_stdout(app.exit(e));  // --help, --version
    return usage_error(e.what());
  } catch (const UsageError& e) {
    return usage_error(e.what());
  } catch (const ExitCode& e) {
    return check_stdout(e.code);
  } catch (const std::exception& e) {  // nf4::Error and anything else
    std::fprintf(stderr, "nf4: error: %s\n", e.what());
    return 1;
  }
  return check_stdout(0);
}

}  // namespace nf4::cli
