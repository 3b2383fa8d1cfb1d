// Helpers for tests that run the project's real binaries: a shell command with its exit code and its
// combined output, and a scratch directory per test.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

namespace zero::testing {

struct CommandResult {
  int exit_code;       // the command's exit status, or 128 + the signal that ended it
  std::string output;  // stdout and stderr together
};

/// Runs `cmd` through the shell with stderr folded into stdout.
inline CommandResult run_command(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  EXPECT_NE(pipe, nullptr) << cmd;
  if (pipe == nullptr) return {127, ""};
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

/// `out` without the " (file:line)" that ends an error line in Debug builds (core/check.h: a Debug build
/// always says where an error was raised), so a test can compare a message exactly in any build.
inline std::string without_source_locations(const std::string& out) {
  static const std::regex location(R"( \([^() \n]+\.(cpp|h|cu):[0-9]+\)\n)");
  return std::regex_replace(out, location, "\n");
}

/// A fresh directory under the system's temp dir, named after this process and the running test.
inline std::filesystem::path make_test_dir(const std::string& prefix) {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "_" + std::to_string(::getpid()) + "_" + (test ? test->name() : "none"));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace zero::testing
