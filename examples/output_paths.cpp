#include "examples/output_paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace zero::examples {

namespace fs = std::filesystem;

void make_directory(const char* flag, const std::string& path, const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZERO_CHECK(fs::is_directory(dir), "{} '{}': cannot create the directory '{}' ({})", flag, path, dir.string(),
             ec ? ec.message() : "a file of that name exists");
}

void probe_write(const char* flag, const std::string& path, const fs::path& file, const char* what) {
  std::error_code ec;
  const bool existed = fs::exists(file, ec);
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0, "{} '{}': cannot {} ({})", flag, path, what, std::strerror(errno));
  ::close(fd);
  if (!existed) fs::remove(file, ec);
}

void probe_file(const char* flag, const std::string& path, bool via_tmp) {
  ZERO_CHECK(!fs::is_directory(path), "{} '{}' is a directory; give a file path", flag, path);
  const fs::path p = fs::absolute(path);
  make_directory(flag, path, p.parent_path());
  if (via_tmp)
    probe_write(flag, path, p.string() + ".tmp", "create a file in its directory");
  else
    probe_write(flag, path, p, "open it for writing");
}

}  // namespace zero::examples
