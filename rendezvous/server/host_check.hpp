#pragma once
// Which names a request for a page may be addressed to (its Host field), so that a page of another
// site cannot read a job's page by making its own name resolve to this host (DNS rebinding): the
// browser then sends that name, which is no name of this host. Accepted: localhost (and names
// under .localhost, which browsers resolve to loopback themselves), this host's name, its short
// name and its FQDN, a loopback address, an address of this host's interfaces, and the user's list
// (--http_allowed_hosts, --metrics-allowed-hosts): names, addresses, `.example.com` for a domain
// and its names, `*` for any. The port in the field is not compared: `ssh -L 9000:localhost:8080`
// sends localhost:9000.
//
// Built once (the host's FQDN is looked up then, which may ask DNS: do it at start, never on a
// store's thread); allows() is then used from one server's thread only (not thread-safe: it
// caches the interfaces' addresses, read again at most once a second).

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/ip/address.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/server/http_server.hpp"

namespace ddprun::rdzv::server {

class HostCheck {
 public:
  // `allowed`: the user's list, as given (validated by parse_allowed_hosts); `flag`: where the
  // user gives it, for the refusal's advice.
  explicit HostCheck(const std::vector<std::string>& allowed = {}, std::string flag = "--http_allowed_hosts");

  // Whether a request with this Host field may be answered. A request without one (nullopt) is:
  // every browser names the host it believes it reaches, which is what a rebinding page cannot
  // change, so a request that names none is no browser's (an HTTP/1.0 tool, a probe) and is
  // answered as before, to the peers the page admits. An empty field names no host of this one
  // and is refused like a foreign name.
  bool allows(std::optional<std::string_view> host) const;
  // The page's answer for `request` when its Host field is refused (400 for a malformed or
  // repeated one, 403 naming it and how to allow it); nullopt when it may be answered.
  std::optional<HttpReply> refuse(const HttpRequest& request) const;

  // The names this host is known by here, for messages: localhost, the host name, the FQDN.
  const std::vector<std::string>& own_names() const { return names_; }

 private:
  bool own_address(const boost::asio::ip::address& a) const;

  std::vector<std::string> names_;  // lower case, without a trailing dot
  std::vector<std::string> allowed_names_, allowed_domains_;
  std::vector<boost::asio::ip::address> allowed_addresses_;
  bool any_ = false;
  std::string flag_;
  mutable std::vector<boost::asio::ip::address> interfaces_;
  mutable std::chrono::steady_clock::time_point interfaces_at_{};
};

// A list of names for --http_allowed_hosts (comma-separated; spaces around them ignored); throws
// ConfigError naming `flag` and the entry that is no host name, address, .domain or `*`.
std::vector<std::string> parse_allowed_hosts(const std::string& flag, const std::string& text);

}  // namespace ddprun::rdzv::server
