#pragma once
// Test helper: a node's --report_file (schema ddprun-report/1, README), read as JSON; null when
// the file is missing, a discarded value when it is not JSON. End-to-end tests check how a job
// ended here rather than in the console's sentences.

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddprun::test {

inline nlohmann::json read_report(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return nullptr;
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace ddprun::test
