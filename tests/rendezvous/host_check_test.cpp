// Which names a page may be asked under (rendezvous/server/host_check.hpp): this host's and
// loopback's names and addresses, the user's list, never another site's (DNS rebinding).
#include "rendezvous/server/host_check.hpp"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio/ip/address.hpp>
#include <string>

#include "common/errors.hpp"

namespace ddprun::rdzv::server {
namespace {

std::string this_host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// An address of this host's interfaces that is no loopback one, or "" when it has none.
std::string an_own_address() {
  ifaddrs* list = nullptr;
  std::string found;
  if (::getifaddrs(&list) != 0) return found;
  for (const ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto a =
        boost::asio::ip::address_v4(ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr));
    if (!a.is_loopback()) found = a.to_string();
  }
  ::freeifaddrs(list);
  return found;
}

TEST(HostCheckTest, ThisHostsNamesAndAddressesAndLoopbacksAreAllowedAndNoOtherName) {
  const HostCheck check;
  const std::string host = this_host();
  std::vector<std::string> allowed = {
      "localhost",      "localhost:8080", "LocalHost:1", "localhost.", "app.localhost:3000",    "127.0.0.1",
      "127.0.0.1:8080", "127.9.9.9:1",    "[::1]",       "[::1]:8080", "[::ffff:127.0.0.1]:80", host,
      host + ":8080",   host + ".:8080",  " localhost "};
  for (const std::string& name : check.own_names()) allowed.push_back(name + ":1");
  if (const std::string own = an_own_address(); !own.empty()) allowed.push_back(own + ":8080");
  for (const std::string& h : allowed) EXPECT_TRUE(check.allows(h)) << h;
  // No Host field: no browser's request (see the header). An empty one names no host of this one.
  EXPECT_TRUE(check.allows(std::nullopt));
  EXPECT_FALSE(check.allows(""));
  EXPECT_FALSE(check.allows("  "));
  EXPECT_TRUE(HostCheck({"*"}).allows(""));

  for (const char* h : {"attacker.example", "attacker.example:8080", "localhost.attacker.example",
                        "127.0.0.1.nip.io:80", "0.0.0.0:8080", "[2001:db8::1]:80", "192.0.2.200", "::1", "[::1",
                        "[::1]x", "local host", "localhost:80:80", "localhost:http", "\x1b[2J"}) {
    EXPECT_FALSE(check.allows(std::string_view(h))) << h;
  }
  EXPECT_FALSE(check.allows(host + ".attacker.example"));
}

TEST(HostCheckTest, TheUsersListAddsNamesDomainsAddressesOrAny) {
  const HostCheck check(
      parse_allowed_hosts("--http_allowed_hosts", "Node7.Example.com, .lab.example,10.0.0.7,[2001:db8::7]"));
  for (const char* h : {"node7.example.com:8080", "NODE7.example.com.", "lab.example", "a.b.lab.example:1",
                        "10.0.0.7:80", "[2001:db8::7]:80", "localhost"}) {
    EXPECT_TRUE(check.allows(std::string_view(h))) << h;
  }
  for (const char* h : {"node8.example.com", "xlab.example", "10.0.0.8", "[2001:db8::8]"}) {
    EXPECT_FALSE(check.allows(std::string_view(h))) << h;
  }
  EXPECT_TRUE(HostCheck({"*"}).allows("anything.example"));

  for (const char* bad : {"", "a,,b", "a,", "a b", "node:port", "[::1", ".", ".10.0.0.1", "x\x1b[2J"}) {
    EXPECT_THROW(parse_allowed_hosts("--http_allowed_hosts", bad), ConfigError) << bad;
  }
  try {
    parse_allowed_hosts("--metrics-allowed-hosts", "ok.example,bad name");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--metrics-allowed-hosts"), std::string::npos) << what;
    EXPECT_NE(what.find("'bad name'"), std::string::npos) << what;
  }
}

TEST(HostCheckTest, ARefusalSaysWhichHostAndHowToAllowIt) {
  const HostCheck check({}, "--metrics-allowed-hosts");
  HttpRequest r{"/ui", boost::asio::ip::make_address("127.0.0.1")};
  EXPECT_FALSE(check.refuse(r)) << "no Host field";
  r.host = "localhost:9100";
  r.host_fields = 1;
  EXPECT_FALSE(check.refuse(r));
  r.host = "attacker.example:9100";
  auto refused = check.refuse(r);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 403u);
  EXPECT_NE(refused->body.find("'attacker.example:9100'"), std::string::npos) << refused->body;
  EXPECT_NE(refused->body.find("--metrics-allowed-hosts attacker.example "), std::string::npos) << refused->body;
  r.host = "\x1b]0;x\x07";
  refused = check.refuse(r);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400u);
  EXPECT_EQ(refused->body.find('\x1b'), std::string::npos) << refused->body;
  r.host = "";
  refused = check.refuse(r);
  ASSERT_TRUE(refused) << "an empty Host field";
  EXPECT_EQ(refused->status, 400u);
  EXPECT_NE(refused->body.find("empty"), std::string::npos) << refused->body;
  r.host = "localhost";
  r.host_fields = 2;
  refused = check.refuse(r);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400u) << "two Host fields";
}

}  // namespace
}  // namespace ddprun::rdzv::server
