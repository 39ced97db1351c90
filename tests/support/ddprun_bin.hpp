#pragma once
// Test helper: the ddprun binary under test (the target's DDPRUN_BIN); DDPRUN_TEST_DDPRUN_BIN in the
// environment runs the same tests against another build, e.g. to see a test fail before a fix.

#include <cstdlib>
#include <string>

namespace ddprun::test {

inline std::string ddprun_bin() {
  const char* other = std::getenv("DDPRUN_TEST_DDPRUN_BIN");
  return other && *other ? other : DDPRUN_BIN;
}

}  // namespace ddprun::test
