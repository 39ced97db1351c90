// host:port, one way everywhere (common/host_port.hpp): every spelling ddprun takes, on a table.
#include "common/host_port.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace ddprun {
namespace {

TEST(HostPortTest, EverySpellingOnATable) {
  struct Row {
    const char* text;
    std::optional<HostPort> want;
  };
  const Row rows[] = {
      {"node0", HostPort{"node0", std::nullopt}},
      {"node0:29400", HostPort{"node0", 29400}},
      {"10.0.0.1", HostPort{"10.0.0.1", std::nullopt}},
      {"10.0.0.1:1", HostPort{"10.0.0.1", 1}},
      {"[::1]", HostPort{"::1", std::nullopt}},
      {"[::1]:29400", HostPort{"::1", 29400}},
      {"[fe80::1%eth0]:80", HostPort{"fe80::1%eth0", 80}},
      // A bare IPv6 address has two colons or more: a host without a port, never split.
      {"::1", HostPort{"::1", std::nullopt}},
      {"fe80::1", HostPort{"fe80::1", std::nullopt}},
      {"2001:db8::7:29400", HostPort{"2001:db8::7:29400", std::nullopt}},
      {"", std::nullopt},
      {":29400", std::nullopt},
      {"node0:", std::nullopt},
      {"node0:http", std::nullopt},
      {"node0:0", std::nullopt},
      {"node0:65536", std::nullopt},
      {"node0:-1", std::nullopt},
      {"[::1", std::nullopt},
      {"[::1]29400", std::nullopt},
      {"[]:1", std::nullopt},
      {"[::1]:", std::nullopt},
  };
  for (const Row& row : rows) {
    std::string why;
    const auto got = parse_host_port(row.text, &why);
    EXPECT_EQ(got, row.want) << "'" << row.text << "'";
    if (!row.want) {
      EXPECT_FALSE(why.empty()) << "'" << row.text << "' is refused without saying why";
    }
  }
}

TEST(HostPortTest, IPv6IsWrittenInBracketsAndReadsBack) {
  EXPECT_EQ(format_host_port("::1", 29400), "[::1]:29400");
  EXPECT_EQ(format_host_port("10.0.0.1", 80), "10.0.0.1:80");
  EXPECT_EQ(format_host_port("node0", 1), "node0:1");
  for (const char* host : {"::1", "fe80::1", "10.0.0.1", "node0", "::ffff:10.0.0.1"}) {
    EXPECT_EQ(parse_host_port(format_host_port(host, 443)), (HostPort{host, 443})) << host;
  }
}

}  // namespace
}  // namespace ddprun
