#pragma once
// Test helper: the processes of this machine whose command line holds a tag (a test's marker in
// its programs' arguments), to check that nothing of a test is left running.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ddprun::test {

// The processes whose command line holds `tag`, each as "pid: command line".
inline std::vector<std::string> processes_mentioning(const std::string& tag) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // A process can exit between the listing and the read: libstdc++'s filebuf then throws
    // ("error reading the file: No such process") whatever the stream's exception mask says.
    std::string cmdline;
    try {
      std::ifstream in(e.path() / "cmdline");
      cmdline.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } catch (const std::ios_base::failure&) {
      continue;
    }
    if (cmdline.find(tag) == std::string::npos) continue;
    for (char& ch : cmdline) ch = ch == '\0' ? ' ' : ch;
    found.push_back(name + ": " + cmdline);
  }
  return found;
}

}  // namespace ddprun::test
