// Error checks that throw with file:line.
//
// ZERO_CHECK(cond, fmt-args...) throws zero::Error when cond is false; the message is formatted with
// fmt and prefixed by the source location. ZERO_DCHECK is the same check compiled out of release builds
// (use it in hot loops only).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace zero {

/// The one exception type the library throws for bad input or broken invariants.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] inline void fail(const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{} ({}:{})", msg, file, line));
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
