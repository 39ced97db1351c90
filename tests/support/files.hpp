#pragma once
// Test helper: a whole file's bytes ("" when it cannot be read).

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace ddprun::test {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace ddprun::test
