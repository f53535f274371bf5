// kiln/core/error.hpp - the one exception type kiln throws, and message helpers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdio>
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

/// Where kiln::warn's messages go: a function taking the message (without the "kiln: warning: " prefix and
/// newline), or nullptr for stderr (the default).
using WarningHandler = void (*)(std::string_view message);

namespace detail {
inline std::atomic<WarningHandler>& warning_handler() {
  static std::atomic<WarningHandler> h{nullptr};
  return h;
}
}  // namespace detail

/// Routes kiln's warnings (values accepted but suspicious: a context beyond the trained one, special token
/// ids outside the vocabulary) to h; nullptr restores stderr. Returns the previous handler.
inline WarningHandler set_warning_handler(WarningHandler h) { return detail::warning_handler().exchange(h); }

/// Reports a warning: "kiln: warning: <args>" on stderr, or the message to the installed handler.
template <class... Args>
void warn(const Args&... args) {
  const std::string m = detail::concat(args...);
  if (const WarningHandler h = detail::warning_handler().load()) h(m);
  else std::fprintf(stderr, "kiln: warning: %s\n", m.c_str());
}

/// Throws E with the streamed concatenation of args.
template <class E = Error, class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw E(detail::concat(args...));
}

}  // namespace kiln

/// KILN_CHECK(cond, parts...) throws kiln::Error("parts...") when cond is false. Always on (not an assert).
#define KILN_CHECK(cond, ...)    \
  do {                           \
    if (!(cond)) [[unlikely]]    \
      ::kiln::fail(__VA_ARGS__); \
  } while (0)

#define KILN_CHECK_SHAPE(cond, ...)                  \
  do {                                               \
    if (!(cond)) [[unlikely]]                        \
      ::kiln::fail<::kiln::ShapeError>(__VA_ARGS__); \
  } while (0)
