#include "launcher/workers/worker_exit.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/system.hpp"

namespace ddprun::launcher::workers {

int shell_exit_code(const WorkerExit& e) { return e.signal != 0 ? 128 + e.signal : e.exit_code; }

std::string describe_exit(const WorkerExit& e) {
  if (e.signal != 0) return "signal " + std::to_string(e.signal) + " (" + signal_name(e.signal) + ")";
  return "exit code " + std::to_string(e.exit_code);
}

bool lost_a_peer(const WorkerExit& e) {
  static constexpr const char* kSigns[] = {"connection closed by peer", "connection reset by peer", "broken pipe",
                                           "remote process exited",     "ncclremoteerror",          "socket closed"};
  auto says_so = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    return std::any_of(std::begin(kSigns), std::end(kSigns),
                       [&](const char* sign) { return text.find(sign) != std::string::npos; });
  };
  if (e.error_text && says_so(*e.error_text)) return true;
  if (const auto text = read_error_file(e.error_file); text && says_so(*text)) return true;
  return std::any_of(e.stderr_tail.begin(), e.stderr_tail.end(), says_so);
}

std::optional<std::string> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  if (text.empty()) return std::nullopt;
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "(unparseable error file) " + text.substr(0, 2000);
  std::string out;
  const auto& m = j.contains("message") ? j["message"] : j;
  if (m.is_string()) {
    out = m.get<std::string>();
  } else if (m.is_object()) {
    if (m.contains("message") && m["message"].is_string()) out = m["message"].get<std::string>();
    if (m.contains("extraInfo") && m["extraInfo"].is_object() && m["extraInfo"].contains("py_callstack") &&
        m["extraInfo"]["py_callstack"].is_string()) {
      out += "\n" + m["extraInfo"]["py_callstack"].get<std::string>();
    }
  }
  if (out.empty()) out = text.substr(0, 2000);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace ddprun::launcher::workers
