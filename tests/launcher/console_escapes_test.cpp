// What reaches ddprun's console from outside (a worker's error file and stderr in the failure
// report, a node check's output in the ERROR line) shows its control characters as \xNN rather than
// sending them to the terminal to act on; the --report_file document keeps the raw text (JSON
// escapes it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/report.hpp"
#include "tests/support/subprocess.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// The control characters in `text` but newlines and tabs, as "\xNN ..." ("" when none).
std::string controls_in(const std::string& text) {
  std::string found;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x ", u);
      found += hex;
    }
  }
  return found;
}

// A worker that clears the screen and retitles the window from its error file and its stderr,
// then fails.
constexpr const char* kHostileWorker =
    R"(printf '\033]0;pwned\007\033[2Jscreen gone\n' >&2; )"
    R"(printf '{"message": {"message": "RuntimeError: \\u001b[31mred\\u001b[0m", )"
    R"("extraInfo": {"py_callstack": "x", "timestamp": "0"}}}' > "$TORCHELASTIC_ERROR_FILE"; exit 1)";

TEST(ConsoleEscapesTest, TheFailureReportShowsAWorkersEscapeSequencesAndTheReportFileKeepsThem) {
  TempDir dir;
  const auto file = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", file.string(), "sh", "-c", kHostileWorker}));
  const Finished f = p.wait(60s);
  ASSERT_EQ(f.exit_code, 1) << f.err;
  // The report, from its title to its closing rule (the worker's own lines before it are its
  // output, passed through as it wrote them).
  const auto from = f.err.find("FAILED\n");
  ASSERT_NE(from, std::string::npos) << f.err;
  const std::string report = f.err.substr(from);
  EXPECT_EQ(controls_in(report), "") << report;
  EXPECT_NE(report.find("RuntimeError: \\x1b[31mred\\x1b[0m"), std::string::npos) << report;
  EXPECT_NE(report.find("| \\x1b]0;pwned\\x07\\x1b[2Jscreen gone"), std::string::npos) << report;

  const json r = read_report(file);
  ASSERT_TRUE(r.is_object()) << f.err;
  const json& root = r["root_cause"];
  ASSERT_TRUE(root.is_object()) << r.dump(2);
  ASSERT_TRUE(root["error"].is_string()) << r.dump(2);
  EXPECT_EQ(root["error"].get<std::string>().rfind("RuntimeError: \x1b[31mred\x1b[0m", 0), 0u) << r.dump(2);
  ASSERT_FALSE(root["stderr_tail"].empty()) << r.dump(2);
  EXPECT_EQ(root["stderr_tail"].back().get<std::string>(), "\x1b]0;pwned\x07\x1b[2Jscreen gone") << r.dump(2);
}

TEST(ConsoleEscapesTest, ANodeChecksReasonIsShownWithItsEscapeSequences) {
  TempDir dir;
  const auto file = dir.path / "report.json";
  Subprocess p(ddprun({"--nproc_per_node", "1", "--report_file", file.string(), "--node_check",
                       R"(printf '\033[2J\033]0;x\007disk gone\n'; exit 1)", "sh", "-c", "exit 0"}));
  const Finished f = p.wait(60s);
  EXPECT_NE(f.exit_code, 0) << f.err;
  const json r = read_report(file);
  ASSERT_TRUE(r.is_object()) << f.err;
  EXPECT_EQ(r["outcome"], "node_check_failed") << r.dump(2);
  // No worker ran: everything on ddprun's stderr is its own.
  EXPECT_EQ(controls_in(f.err), "") << f.err;
  EXPECT_NE(f.err.find("\\x1b[2J\\x1b]0;x\\x07disk gone"), std::string::npos) << f.err;
}

}  // namespace
}  // namespace ddprun::test
