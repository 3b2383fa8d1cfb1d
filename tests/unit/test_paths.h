// Where the unit tests find the files they read and the binaries they start. A test binary may run
// far from the tree it was built in (scripts/gpu_check.sh --bundle carries it to another machine), so
// nothing here depends on a build-time path alone: an environment variable wins, then the layout
// beside the running binary (bin/ next to share/zero/), and last the source tree CMake was run from.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace zero::testing {

/// The folder holding the running test binary (Linux: /proc/self/exe).
inline std::filesystem::path exe_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::current_path() : exe.parent_path();
}

namespace detail {
// $env if set and non-empty, else exe_dir()/../share/zero/relative if it is a folder, else fallback.
inline std::string locate(const char* env, const char* relative, const char* fallback) {
  if (const char* v = std::getenv(env); v != nullptr && *v != '\0') return v;
  std::error_code ec;
  const auto beside = exe_dir().parent_path() / "share" / "zero" / relative;
  if (std::filesystem::is_directory(beside, ec)) return beside.string();
  return fallback;
}
}  // namespace detail

/// The example binaries (train_gpt, sample_gpt, zero_explain, zero_leave_early): $ZERO_BIN_DIR, else
/// the test binary's own folder (CMake puts every executable into one bin/).
inline std::string bin_dir() {
  if (const char* v = std::getenv("ZERO_BIN_DIR"); v != nullptr && *v != '\0') return v;
  return exe_dir().string();
}

/// tests/data (committed reference files): $ZERO_TEST_DATA_DIR, else <bin>/../share/zero/tests/data,
/// else the source tree's.
inline std::string test_data_dir() {
  return detail::locate("ZERO_TEST_DATA_DIR", "tests/data", ZERO_TEST_DATA_DIR);
}

/// examples/configs: $ZERO_EXAMPLE_CONFIG_DIR, else <bin>/../share/zero/examples/configs, else the
/// source tree's.
inline std::string example_config_dir() {
  return detail::locate("ZERO_EXAMPLE_CONFIG_DIR", "examples/configs", ZERO_EXAMPLE_CONFIG_DIR);
}

/// docs/ (the tests that check a doc against the code): $ZERO_DOCS_DIR, else
/// <bin>/../share/zero/docs, else the source tree's.
inline std::string docs_dir() { return detail::locate("ZERO_DOCS_DIR", "docs", ZERO_DOCS_DIR); }

}  // namespace zero::testing
