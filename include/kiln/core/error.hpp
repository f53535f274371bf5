// kiln/core/error.hpp - the one exception type kiln throws, and message helpers.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

/// Every error kiln reports is a kiln::Error (or derived). The message names the operation or file,
/// the offending field and the values involved.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Views handed to an op disagree in shape, dtype or layout.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// A model file (GGUF, safetensors, config.json, ...) is malformed, truncated or unsupported.
class FormatError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

/// Throws E with the streamed concatenation of args.
template <class E = Error, class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw E(detail::concat(args...));
}

}  // namespace kiln

/// KILN_CHECK(cond, parts...) throws kiln::Error("parts...") when cond is false. Always on (not an assert).
#define KILN_CHECK(cond, ...)                       \
  do {                                              \
    if (!(cond)) [[unlikely]] ::kiln::fail(__VA_ARGS__); \
  } while (0)

#define KILN_CHECK_SHAPE(cond, ...)                                   \
  do {                                                                \
    if (!(cond)) [[unlikely]] ::kiln::fail<::kiln::ShapeError>(__VA_ARGS__); \
  } while (0)
