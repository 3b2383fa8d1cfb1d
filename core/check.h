// Error checks that throw with file:line.
//
// ZERO_CHECK(cond, fmt-args...) throws zero::Error when cond is false; what() is the message formatted
// with fmt, and location() the source location of the check ("file:line"), kept apart so a message
// meant for a person need not end in a C++ path (programs add it on request: train_gpt --verbose).
// ZERO_DCHECK is the same check compiled out of release builds (use it in hot loops only).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace zero {

/// The one exception type the library throws for bad input or broken invariants.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string location = {})
      : std::runtime_error(message), location_(std::move(location)) {}
  /// "file:line" of the ZERO_CHECK that threw; empty when the error was thrown directly.
  const std::string& location() const { return location_; }

 private:
  std::string location_;
};

namespace detail {
[[noreturn]] inline void fail(const char* file, int line, const std::string& msg) {
  throw Error(msg, fmt::format("{}:{}", file, line));
}
}  // namespace detail

}  // namespace zero

#define ZERO_CHECK(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) ::zero::detail::fail(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define ZERO_DCHECK(cond, ...) \
  do {                         \
  } while (0)
#else
#define ZERO_DCHECK(cond, ...) ZERO_CHECK(cond, __VA_ARGS__)
#endif
