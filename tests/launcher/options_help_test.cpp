// What --help, --help=markdown and the docs' tables say of ddprun's flags (from the flag rows of
// launcher/cli/flags.cpp), and that what they say is what the parser does.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/command_line.hpp"
#include "common/unique_fd.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options.hpp"
#include "tests/launcher/options_test_support.hpp"

namespace ddprun::launcher {

using cli::flag_table;
using cli::FlagDef;
using cli::LaunchOptions;
using cli::usage_text;
namespace {

using test_options::error_of;
using test_options::parse;

TEST(OptionsTest, HelpListsEveryFlagWithItsDefault) {
  const std::string help = usage_text();
  for (const char* flag : {"--nproc_per_node",
                           "--nnodes",
                           "--node_rank",
                           "--master_addr",
                           "--master_port",
                           "--standalone",
                           "--max_restarts",
                           "--monitor_interval",
                           "--role",
                           "--rdzv_id",
                           "--log_dir",
                           "--redirects",
                           "--tee",
                           "--local_ranks_filter",
                           "--no_python",
                           "--module",
                           "--local_addr",
                           "--signals_to_handle",
                           "--shutdown_timeout",
                           "--virtual_local_rank"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(help.find("(default: 30)"), std::string::npos);
  EXPECT_TRUE(parse({"--help"}).help);
  EXPECT_FALSE(parse({"--help"}).help_markdown);
  // --help is plain text: the rows' `code` marks are for the docs' table.
  EXPECT_EQ(help.find('`'), std::string::npos);
}

// --help=markdown is the docs' table: one row per flag, with the same defaults --help states.
TEST(OptionsTest, HelpMarkdownIsATableOfEveryFlag) {
  EXPECT_TRUE(parse({"--help=markdown"}).help_markdown);
  EXPECT_EQ(error_of({"--help=man"}),
            "--help: expected no value, or 'markdown' (the flag table of the docs), got 'man'");
  const std::string table = cli::flag_table_markdown();
  for (const FlagDef& f : flag_table()) {
    EXPECT_NE(table.find("`" + std::string(f.name)), std::string::npos) << f.name;
  }
  EXPECT_NE(table.find("| `--shutdown_timeout` | `30` |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `--hang_timeout` | `0` (off) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `-r`, `--redirects` |"), std::string::npos) << table;
  EXPECT_NE(table.find("`--merge_lines[=SECONDS]`"), std::string::npos) << table;
  EXPECT_NE(table.find("(also `DDPRUN_REPORT_FILE`; the flag wins)"), std::string::npos) << table;
}

// A flag's other variable stands for it when neither the flag nor PET_<NAME> is given.
TEST(OptionsTest, EachFlagsOtherVariableComesAfterPetAndTheFlag) {
  EXPECT_EQ(parse({"t"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}}).shutdown_timeout, std::chrono::seconds(7));
  EXPECT_EQ(parse({"t"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}, {"PET_SHUTDOWN_TIMEOUT", "8"}}).shutdown_timeout,
            std::chrono::seconds(8));
  EXPECT_EQ(parse({"--shutdown_timeout", "9", "t"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}}).shutdown_timeout,
            std::chrono::seconds(9));
  EXPECT_EQ(error_of({"t"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}}),
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT: expected a number of seconds >= 0, got 'soon'");
  EXPECT_EQ(parse({"t"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}| "}}).log_line_prefix, "${rank}| ");
}

// --help and the docs show each flag's default from LaunchOptions' own initializers (a row's
// `shown`); what they show must be a value the parser turns into that same default, so that a
// user who copies it changes nothing. Defaults that depend on the run are words (`note`).
TEST(OptionsTest, TheDefaultsHelpStatesAreTheOnesTheParserUses) {
  const LaunchOptions none = parse({"train.py"});
  int checked = 0;
  for (const FlagDef& f : flag_table()) {
    if (f.set.shown() == nullptr) continue;
    const std::string text = f.default_text(LaunchOptions{});
    const std::string literal = text.substr(0, text.find(" ("));  // "0 (off)": the value is "0"
    ASSERT_TRUE(f.takes_value()) << f.name;
    LaunchOptions given = parse({f.name, literal, "train.py"});
    given.node_rank_given = none.node_rank_given;  // records that the flag was given, not a value
    EXPECT_TRUE(given == none) << f.name << " " << literal << ": --help states a default the parser does not use";
    ++checked;
  }
  EXPECT_GE(checked, 14);
  // And the sentence for --master_port: one node picks a free port, several nodes use 29500.
  EXPECT_FALSE(none.master_port.has_value());
}

// --help is wrapped as argparse wraps it: every line within the width, each option's help from
// column 24 (beside the names when they fit before it), and nothing lost to the wrapping.
TEST(OptionsTest, HelpIsWrappedToTheWidthItIsGiven) {
  for (const size_t width : {58u, 78u, 118u}) {
    std::istringstream help(usage_text(width));
    size_t lines = 0;
    for (std::string line; std::getline(help, line); ++lines) {
      EXPECT_LE(line.size(), width) << "width " << width << ": '" << line << "'";
    }
    EXPECT_GT(lines, 100u);
  }
  const std::string help = usage_text(78);
  EXPECT_NE(help.find("\n  --nnodes N            number of nodes"), std::string::npos) << help;
  EXPECT_NE(help.find("\n  --rdzv_endpoint HOST:PORT\n                        a ddprun-rendezvous"), std::string::npos)
      << help;
  // The same text at any width (a word longer than a line is cut, as Python's textwrap cuts it).
  auto text_of = [](std::string s) {
    s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }), s.end());
    return s;
  };
  EXPECT_EQ(text_of(usage_text(58)), text_of(usage_text(200)));
}

// The width: COLUMNS when it is a positive number, else the terminal's, else 80; less 2 (argparse's).
TEST(OptionsTest, HelpWidthIsColumnsOrTheTerminalsOr80) {
  auto env = [](const char* columns) {
    return [columns](const std::string& name) -> std::optional<std::string> {
      if (name == "COLUMNS" && columns) return std::string(columns);
      return std::nullopt;
    };
  };
  const UniqueFd null(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  ASSERT_TRUE(null);
  EXPECT_EQ(command_line::help_width(null.get(), env(nullptr)), 78u);
  EXPECT_EQ(command_line::help_width(null.get(), env("100")), 98u);
  EXPECT_EQ(command_line::help_width(null.get(), env(" 90 ")), 88u);
  EXPECT_EQ(command_line::help_width(null.get(), env("wide")), 78u);
  EXPECT_EQ(command_line::help_width(null.get(), env("0")), 78u);
  // A terminal of 132 columns.
  const UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  ASSERT_TRUE(master);
  ASSERT_EQ(::grantpt(master.get()), 0);
  ASSERT_EQ(::unlockpt(master.get()), 0);
  const UniqueFd terminal(::open(::ptsname(master.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
  ASSERT_TRUE(terminal);
  winsize ws{};
  ws.ws_row = 40;
  ws.ws_col = 132;
  ASSERT_EQ(::ioctl(terminal.get(), TIOCSWINSZ, &ws), 0);
  EXPECT_EQ(command_line::help_width(terminal.get(), env(nullptr)), 130u);
  EXPECT_EQ(command_line::help_width(terminal.get(), env("60")), 58u);
}

}  // namespace
}  // namespace ddprun::launcher
