#include "launcher/workers/report.hpp"

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/printable.hpp"
#include "common/system.hpp"

namespace ddprun::launcher::workers {

namespace {

std::string format_time(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[48];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return std::string(buf) + "." + (ms < 100 ? (ms < 10 ? "00" : "0") : "") + std::to_string(ms);
}

// A line a worker wrote, as the console shows it: its control characters shown, never acted on
// (common/printable.hpp), since an escape sequence in an error file or on stderr could otherwise
// clear the screen or rewrite the lines of this report. A CR that ends it (a CRLF line) goes.
std::string shown(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return printable_line(line);
}

void indent_block(std::ostringstream& out, const std::string& label, const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    out << (first ? "  " + label : std::string(label.size() + 2, ' ')) << shown(line) << "\n";
    first = false;
  }
}

// What to do about failures whose cause is known from their message alone, or "".
std::string known_fix(const std::string& text) {
  if (text.find("use_libuv was requested") != std::string::npos) {
    return "this PyTorch was built without libuv, and a TCPStore was created with use_libuv=True (the default "
           "of PyTorch >= 2.4), which it refuses even for a client. init_process_group's env:// client of "
           "ddprun's store is fixed by ddprun's Python hook unless DDPRUN_TORCH_HOOK=0 is set or the program "
           "replaced PYTHONPATH; a TCPStore the program creates itself needs use_libuv=False (USE_LIBUV=0 covers "
           "torch.distributed's own servers)";
  }
  return "";
}

void format_one(std::ostringstream& out, const WorkerExit& e) {
  out << "  rank       : " << e.rank << " (local_rank " << e.local_rank << ")\n"
      << "  host       : " << shown(e.host)
      << (e.node_rank >= 0 ? " (node_rank " + std::to_string(e.node_rank) + ")" : "") << "\n"
      << "  pid        : " << e.pid << "\n"
      << "  exit       : " << describe_exit(e) << "\n"
      << "  time       : " << format_time(e.time) << "\n";
  std::string fix;
  if (const auto& msg = e.error_text) {
    indent_block(out, "error_file : ", e.error_file);
    indent_block(out, "error      : ", *msg);
    fix = known_fix(*msg);
  }
  for (size_t i = 0; i < e.stderr_tail.size() && fix.empty(); ++i) fix = known_fix(e.stderr_tail[i]);
  if (!fix.empty()) indent_block(out, "what to do : ", fix);
  if (!e.diagnosis.empty()) indent_block(out, "watchdog   : ", e.diagnosis);
  if (!e.stderr_tail.empty()) {
    out << "  last stderr lines:\n";
    for (const auto& l : e.stderr_tail) out << "    | " << shown(l) << "\n";
  } else {
    out << "  last stderr lines: (none)\n";
  }
}

}  // namespace

std::string format_failure_report(const std::string& program, const std::vector<WorkerExit>& failures,
                                  const std::vector<int>& stopped_ranks) {
  std::ostringstream out;
  const std::string rule(72, '=');
  out << rule << "\n" << program << " FAILED\n" << std::string(72, '-') << "\n";
  if (failures.empty()) return out.str() + rule + "\n";
  out << "Root cause (first failure):\n";
  format_one(out, failures.front());
  if (failures.size() > 1) {
    out << std::string(72, '-') << "\nOther failures, in order:\n";
    for (size_t i = 1; i < failures.size(); ++i) {
      out << "[" << i << "]\n";
      format_one(out, failures[i]);
    }
  }
  if (!stopped_ranks.empty()) {
    out << std::string(72, '-') << "\nStopped by ddprun after the failure: rank";
    out << (stopped_ranks.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < stopped_ranks.size(); ++i) out << (i ? "," : "") << stopped_ranks[i];
    out << "\n";
  }
  out << rule << "\n";
  return out.str();
}

}  // namespace ddprun::launcher::workers
