#pragma once
// Test helper: a node's --report_file (schema ddprun-report/1, docs/guide.md), read as JSON. End-to-end
// tests check how a job ended here (outcome, exit code, root cause, attempts) rather than in the
// console's sentences, which stay free to change.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/files.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {

// Null when the file is missing, a discarded value when it is not JSON.
inline nlohmann::json read_report(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) return nullptr;
  return nlohmann::json::parse(read_file(p), nullptr, /*allow_exceptions=*/false);
}

// One report file per node of a test's job, in a directory removed at scope exit.
class Reports {
 public:
  std::filesystem::path path(int node) const { return dir_.path / ("node" + std::to_string(node) + ".json"); }
  // The flags that make node `node` write its report here.
  std::vector<std::string> flags(int node, std::vector<std::string> more = {}) const {
    more.insert(more.begin(), {"--report_file", path(node).string()});
    return more;
  }
  nlohmann::json of(int node) const { return read_report(path(node)); }

 private:
  TempDir dir_;
};

}  // namespace ddprun::test
