// ddprun-rendezvous's command line (rendezvous/daemon/daemon_flags): --help shows the defaults the
// server really starts with, every spelling of a flag is that flag, and the subcommands' flags.
#include "rendezvous/daemon/daemon_flags.hpp"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <tuple>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace ddprun::rdzv::daemon {
namespace {

// Everything a flag of the server can set.
auto settings(const ServeConfig& c) {
  const server::ServerOptions& o = c.options;
  return std::make_tuple(o.host, o.port, o.handshake_timeout, o.max_pending_handshakes, o.limits.max_key_bytes,
                         o.limits.max_value_bytes, o.limits.max_request_bytes, o.limits.max_keys_per_request,
                         o.limits.max_reply_bytes, o.store_limits.max_total_keys, o.store_limits.max_store_bytes,
                         o.store_limits.max_job_keys, o.store_limits.max_job_bytes, o.job_ttl, o.state_file,
                         c.port_file, c.token_file, c.metrics_port, c.insecure, o.cede_when_busy);
}

TEST(DaemonFlagsTest, EachDefaultHelpShowsIsTheOneTheServerStartsWith) {
  const ServeConfig none = parse_serve_flags({});
  std::istringstream help(usage_text());
  // "  --port N               port to listen on; ... (default: 29400)", the default maybe on the
  // option's last line.
  const std::regex option(R"(^  (--[a-z-]+)( [A-Z]+)?)"), shown(R"(\(default: ([^)]+)\)$)");
  std::string line, flag;
  int checked = 0;
  while (std::getline(help, line)) {
    std::smatch m;
    if (std::regex_search(line, m, option)) flag = m[1];
    if (!std::regex_search(line, m, shown) || flag.empty() || flag == "--log-level") continue;
    const ServeConfig given = parse_serve_flags({flag, m[1]});
    EXPECT_TRUE(settings(given) == settings(none)) << flag << " " << m[1] << ": not the server's default";
    ++checked;
  }
  EXPECT_GE(checked, 12);
}

// --help=markdown is the table of docs/operations.md: every flag, the defaults --help states.
TEST(DaemonFlagsTest, HelpMarkdownIsATableOfEveryFlag) {
  EXPECT_TRUE(parse_serve_flags({"--help=markdown"}).help_markdown);
  EXPECT_FALSE(parse_serve_flags({"--help"}).help_markdown);
  EXPECT_THROW(parse_serve_flags({"--help=man"}), ConfigError);
  const std::string table = flag_table_markdown();
  EXPECT_NE(table.find("| `--port N` | `29400` |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `--state-file PATH` | memory only |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `--insecure` | off |"), std::string::npos) << table;
  EXPECT_EQ(usage_text().find('`'), std::string::npos) << "--help is plain text";
}

// --log-level's default is the level in effect (DDPRUN_LOG_LEVEL's), and it is what --log-level sets.
TEST(DaemonFlagsTest, TheLogLevelShownIsTheOneInEffect) {
  const log::Level before = log::current();
  log::set_level(log::Level::Warn);
  EXPECT_NE(usage_text().find("(default: warn)"), std::string::npos) << usage_text();
  parse_serve_flags({"--log-level", "debug"});
  EXPECT_EQ(log::current(), log::Level::Debug);
  EXPECT_NE(usage_text().find("(default: debug)"), std::string::npos);
  log::set_level(before);
}

// Per-job quotas follow smaller store-wide limits unless given: --max-total-keys 5000 used to
// leave a per-job quota of 131072 keys, so one job's token could fill the store and refuse the next.
TEST(DaemonFlagsTest, PerJobQuotasDefaultToAShareOfTheStoreWideLimits) {
  const core::StoreLimits plain = parse_serve_flags({}).options.store_limits;
  EXPECT_EQ(plain.max_job_keys, 131072u);
  EXPECT_EQ(plain.max_job_bytes, uint64_t{256} << 20);
  const core::StoreLimits small =
      parse_serve_flags({"--max-total-keys", "5000", "--max-store-bytes", "1000000"}).options.store_limits;
  EXPECT_EQ(small.max_job_keys, 1250u);
  EXPECT_EQ(small.max_job_bytes, 250000u);
  const core::StoreLimits given =
      parse_serve_flags({"--job-max-keys", "3000", "--max-total-keys", "5000", "--job_max_bytes=0"})
          .options.store_limits;
  EXPECT_EQ(given.max_job_keys, 3000u);
  EXPECT_EQ(given.max_job_bytes, 0u);  // 0: no quota, as asked
}

TEST(DaemonFlagsTest, DashesAndUnderscoresAndInlineValuesSpellOneFlag) {
  const ServeConfig a = parse_serve_flags({"--max-key-bytes", "64", "--job_ttl=5", "--handshake-timeout=2.5"});
  EXPECT_EQ(a.options.limits.max_key_bytes, 64u);
  EXPECT_EQ(a.options.job_ttl, std::chrono::seconds(5));
  EXPECT_EQ(a.options.handshake_timeout, std::chrono::milliseconds(2500));
  EXPECT_TRUE(parse_serve_flags({"--insecure"}).insecure);
  EXPECT_TRUE(parse_serve_flags({}).options.cede_when_busy);
  EXPECT_FALSE(parse_serve_flags({"--no_cede"}).options.cede_when_busy);
  EXPECT_TRUE(parse_serve_flags({"-h", "--bogus"}).help);
}

TEST(DaemonFlagsTest, MistakesNameTheFlagAndWhatItExpects) {
  auto error_of = [](std::vector<std::string> args) {
    try {
      parse_serve_flags(args);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // In ddprun's words (tests/launcher/options_test.cpp holds ddprun to the same): "FLAG: expected WHAT, got 'TEXT'".
  EXPECT_EQ(error_of({"--port", "70000"}), "--port: expected a port from 0 to 65535, got '70000'");
  EXPECT_EQ(error_of({"--metrics-port", "x"}), "--metrics-port: expected a port from 0 to 65535, got 'x'");
  EXPECT_EQ(error_of({"--job-ttl", "-1"}), "--job-ttl: expected a number of seconds >= 0, got '-1'");
  EXPECT_EQ(error_of({"--max-keys", "many"}), "--max-keys: expected a whole number from 0 to 16777216, got 'many'");
  EXPECT_EQ(error_of({"--insecure=yes"}), "--insecure takes no value, got 'yes'");
  EXPECT_EQ(error_of({"--job-ttl"}).rfind("--job-ttl needs a value", 0), 0u);
  EXPECT_EQ(error_of({"--bogus"}), "unknown option '--bogus'");
  EXPECT_EQ(error_of({"serve"}), "unexpected argument 'serve' (the subcommands are status and token)");
}

TEST(DaemonFlagsTest, SubcommandsTakeTheirOwnFlags) {
  const StatusFlags s = parse_status_flags({"--endpoint=10.0.0.1:29400", "--token_file", "/etc/s"});
  EXPECT_EQ(s.endpoint, "10.0.0.1:29400");
  EXPECT_EQ(s.token_file, "/etc/s");
  EXPECT_THROW(parse_status_flags({}), ConfigError);
  EXPECT_THROW(parse_status_flags({"--endpoint", "h", "--port", "1"}), ConfigError);
  const TokenFlags t = parse_token_flags({"--token-file", "/etc/s", "--run_id", "job7", "--output", "/tmp/t"});
  EXPECT_EQ(t.run_id, "job7");
  EXPECT_EQ(t.output, "/tmp/t");
  EXPECT_EQ(parse_token_flags({"--token-file", "/etc/s", "--rdzv-id", "j"}).run_id, "j");
}

}  // namespace
}  // namespace ddprun::rdzv::daemon
