// Helpers for tests that run the project's real binaries: a shell command with its exit code and its
// combined output, a scratch directory per test (with a small text to train on), and readers of what
// the programs print and log.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
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

/// A directory from make_test_dir(prefix) holding text.txt: 60 numbered lines of verse (3,950 bytes,
/// 30 distinct characters), enough for a tiny model's batches and its evaluation split.
inline std::filesystem::path make_text_dir(const std::string& prefix) {
  const auto dir = make_test_dir(prefix);
  std::string text;
  for (int i = 0; i < 60; ++i) text += "To be, or not to be, that is the question: whether 'tis nobler " + std::to_string(i) + "\n";
  std::ofstream(dir / "text.txt") << text;
  return dir;
}

/// Lines of `out` that start with "error:" (what our ranks print; mpirun adds banners of its own).
inline int error_lines(const std::string& out) {
  std::istringstream in(out);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.rfind("error:", 0) == 0;
  return n;
}

/// train_gpt's --log-file (JSON lines): the per-step lines keyed by step, evaluation lines left out. A step
/// logged twice fails the test.
inline std::map<std::int64_t, nlohmann::json> read_step_log(const std::filesystem::path& path) {
  std::map<std::int64_t, nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    EXPECT_FALSE(out.count(j["step"].get<std::int64_t>())) << "step logged twice: " << line;
    out[j["step"].get<std::int64_t>()] = j;
  }
  return out;
}

// The JSON header of safetensors file `path`, read independently of core/safetensors.h (the format: an
// 8-byte little-endian header length, the header, then the data section); `data_start` gets the byte
// offset of the data section when not null.
inline nlohmann::json safetensors_header(const std::filesystem::path& path, std::uint64_t* data_start = nullptr) {
  std::ifstream in(path, std::ios::binary);
  unsigned char len_bytes[8] = {};
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  std::string header(len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  if (data_start != nullptr) *data_start = 8 + len;
  return nlohmann::json::parse(header);
}

}  // namespace zero::testing
