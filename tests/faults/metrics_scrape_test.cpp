// Slow HTTP clients on the daemon's metrics port: scraping must stay possible.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/support/daemon.hpp"
#include "tests/support/raw_socket.hpp"

namespace ddprun::test {
namespace {

using namespace std::chrono_literals;

uint16_t metrics_port(const Daemon& d) {
  const std::string marker = "metrics on http://127.0.0.1:";
  const std::string log = d.log_with(marker);
  const size_t at = log.find(marker);
  if (at == std::string::npos) return 0;
  return static_cast<uint16_t>(std::stoi(log.substr(at + marker.size())));
}

// One scrape: the status line and whether the body holds the store's metrics.
bool scrape(uint16_t port) {
  RawSocket s(port);
  if (!s.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")) return false;
  std::string answer;
  if (!s.read_until_eof(&answer, 10s)) return false;
  return answer.rfind("HTTP/1.1 200 OK", 0) == 0 && answer.find("ddprun_store_connections") != std::string::npos;
}

// Before: 64 slow connections held every place for 10 s each, and 28 of 30 scrapes failed.
TEST(MetricsScrapeTest, SlowClientsCannotBlockScraping) {
  DaemonOptions o;
  o.args = {"--metrics-port", "0"};
  Daemon d(DAEMON_BIN, o);
  const uint16_t port = metrics_port(d);
  ASSERT_NE(port, 0) << d.log();
  std::vector<std::unique_ptr<RawSocket>> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(std::make_unique<RawSocket>(port));
    slow.back()->send("GET /metrics HTTP/1.1\r\n");  // and never the rest
  }
  int ok = 0;
  for (int i = 0; i < 30; ++i) ok += scrape(port) ? 1 : 0;
  EXPECT_EQ(ok, 30);
  // A slow client itself is closed soon (3 s for its request), not kept for good.
  EXPECT_TRUE(slow.back()->read_until_eof(nullptr, 30s));
}

}  // namespace
}  // namespace ddprun::test
