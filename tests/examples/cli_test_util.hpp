// Helpers the command-line tool tests share: the shared test models and per-case scratch directories.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "test_util.hpp"

namespace kiln::test::cli {

/// A model of ../shared/models; fails the test naming the path when it is missing.
inline std::filesystem::path shared_model(const std::string& name) {
  const std::filesystem::path p = std::filesystem::path(KILN_SHARED_DIR) / "models" / name;
  if (!std::filesystem::exists(p))
    FAIL("missing test fixture '", p.string(), "' (the shared models folder, see ../shared/README.md)");
  return p;
}

/// A fresh directory per test case (ctest runs the cases as parallel processes) under one root per
/// process named after `prefix`, removed at exit.
inline std::filesystem::path temp_dir(const std::string& prefix, const std::string& name) {
  static const struct Root {
    std::filesystem::path p;
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } root{std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))};
  const std::filesystem::path d = root.p / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace kiln::test::cli
