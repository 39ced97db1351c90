#pragma once
// Test helpers: hex strings <-> bytes, so wire fixtures read like packet captures.

#include <cctype>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/hex.hpp"

namespace ddprun::test {

// "03 0500000000000000 696e69742f" -> bytes; spaces are ignored.
inline std::string unhex(std::string_view hex) {
  std::string out;
  int hi = -1;
  for (char c : hex) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    const int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10;
    if (v < 0 || v > 15) throw std::invalid_argument("bad hex digit");
    if (hi < 0) {
      hi = v;
    } else {
      out.push_back(static_cast<char>(hi * 16 + v));
      hi = -1;
    }
  }
  if (hi >= 0) throw std::invalid_argument("odd number of hex digits");
  return out;
}

inline std::string hex(std::string_view bytes) { return to_hex(bytes); }

}  // namespace ddprun::test
