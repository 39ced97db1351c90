#pragma once
// Test helper: a fresh directory under /tmp, removed with everything in it at scope exit.

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace ddprun::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/ddprun_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

}  // namespace ddprun::test
