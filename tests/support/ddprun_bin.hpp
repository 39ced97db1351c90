#pragma once
// Test helper: the ddprun binary under test (the target's DDPRUN_BIN); DDPRUN_TEST_DDPRUN_BIN in the
// environment runs the same tests against another build, e.g. to see a test fail before a fix.

#include <cstdlib>
#include <string>
#include <vector>

namespace ddprun::test {

inline std::string ddprun_bin() {
  const char* other = std::getenv("DDPRUN_TEST_DDPRUN_BIN");
  return other && *other ? other : DDPRUN_BIN;
}

// A ddprun command line: the binary under test, then `args`.
inline std::vector<std::string> ddprun(std::vector<std::string> args) {
  args.insert(args.begin(), ddprun_bin());
  return args;
}

}  // namespace ddprun::test
