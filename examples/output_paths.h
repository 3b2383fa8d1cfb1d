// Output paths tried before any work (train_gpt's --save-dir, --log-file, --metrics, --trace; zero_explain's
// --svg): a path that cannot be written stops the program with one line naming its flag, before anything
// was computed or overwritten.
#pragma once

#include <filesystem>
#include <string>

namespace zero::examples {

/// Creates the directory `dir` and its parents for output `path` of `flag`. Throws zero::Error naming the
/// flag and the path when it cannot.
void make_directory(const char* flag, const std::string& path, const std::filesystem::path& dir);

/// Opens `file` for appending, creating it if needed, and removes it again if it did not exist. Throws
/// zero::Error "FLAG 'PATH': cannot WHAT (reason)".
void probe_write(const char* flag, const std::string& path, const std::filesystem::path& file, const char* what);

/// An output file of `flag`: not a directory, its directory created, the file (or, for `via_tmp`, the
/// temporary file PATH.tmp written first and renamed over it) writable. Throws zero::Error with one line.
void probe_file(const char* flag, const std::string& path, bool via_tmp);

}  // namespace zero::examples
