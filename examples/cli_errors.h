// Command-line errors of the example programs as one line: "error: <what> (see --help)", exit code 2,
// the way train_gpt reports them (CLI11's own report is two lines and exits with its internal codes).
#pragma once

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

namespace zero::examples {

/// For `catch (const CLI::ParseError& e) { return parse_error_exit(app, e); }`: --help and --version
/// print as CLI11 prints them and return 0; anything else prints one error line and returns 2.
inline int parse_error_exit(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  std::cerr << "error: " << e.what() << " (see --help)\n";
  return 2;
}

/// A validator for an unsigned flag such as --seed: CLI11 would otherwise accept "-1" (wrapping it) or
/// name a range up to 1.8e308.
inline const CLI::Validator kNonNegativeInteger(
    [](std::string& value) -> std::string {
      if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
        return "must be a non-negative integer, got '" + value + "'";
      return "";
    },
    "UINT");

}  // namespace zero::examples
