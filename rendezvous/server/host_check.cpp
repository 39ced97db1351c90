#include "rendezvous/server/host_check.hpp"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/errors.hpp"
#include "common/printable.hpp"

namespace ddprun::rdzv::server {

namespace ip = boost::asio::ip;

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool digits(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// An IPv4-mapped IPv6 address as the IPv4 address it is.
ip::address unmapped(const ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return ip::make_address_v4(ip::v4_mapped, a.to_v6());
  return a;
}

struct HostName {
  std::string name;                    // lower case, no trailing dot; an IPv6 literal without brackets
  std::optional<ip::address> address;  // when it is an address
};

// The host of a Host field: "name", "name:port", "10.0.0.1:port", "[::1]:port" (RFC 9110 7.2);
// nullopt when it is none of these.
std::optional<HostName> split_host(std::string_view field) {
  field = trimmed(field);
  if (field.empty()) return std::nullopt;
  HostName h;
  if (field.front() == '[') {
    const size_t close = field.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    const std::string_view rest = field.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || !digits(rest.substr(1)))) return std::nullopt;
    boost::system::error_code ec;
    const auto a = ip::make_address_v6(std::string(field.substr(1, close - 1)), ec);
    if (ec) return std::nullopt;
    h.address = unmapped(a);
    h.name = lower(field.substr(1, close - 1));
    return h;
  }
  if (const size_t colon = field.find(':'); colon != std::string_view::npos) {
    if (!digits(field.substr(colon + 1))) return std::nullopt;  // (a bare IPv6 address included)
    field = field.substr(0, colon);
  }
  if (!field.empty() && field.back() == '.') field.remove_suffix(1);
  if (field.empty()) return std::nullopt;
  const bool name_chars = std::all_of(field.begin(), field.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
  });
  if (!name_chars) return std::nullopt;
  h.name = lower(field);
  boost::system::error_code ec;
  const auto a = ip::make_address_v4(h.name, ec);
  if (!ec) h.address = a;
  return h;
}

// This host's names: its host name, the short one (to the first dot) and the canonical one (the
// FQDN, as `hostname -f` finds it).
std::vector<std::string> host_names() {
  std::vector<std::string> names{"localhost"};
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return names;
  const std::string host = lower(buf);
  names.push_back(host);
  if (const size_t dot = host.find('.'); dot != std::string::npos && dot > 0) names.push_back(host.substr(0, dot));
  addrinfo hints{};
  hints.ai_flags = AI_CANONNAME;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(buf, nullptr, &hints, &found) == 0 && found) {
    if (found->ai_canonname && *found->ai_canonname) {
      std::string fqdn = lower(found->ai_canonname);
      if (!fqdn.empty() && fqdn.back() == '.') fqdn.pop_back();
      names.push_back(fqdn);
    }
    ::freeaddrinfo(found);
  }
  std::sort(names.begin() + 1, names.end());
  names.erase(std::unique(names.begin() + 1, names.end()), names.end());
  return names;
}

}  // namespace

HostCheck::HostCheck(const std::vector<std::string>& allowed, std::string flag)
    : names_(host_names()), flag_(std::move(flag)) {
  for (const std::string& entry : allowed) {
    const std::string_view e = trimmed(entry);
    if (e == "*") {
      any_ = true;
    } else if (!e.empty() && e.front() == '.') {
      if (const auto h = split_host(e.substr(1)); h && !h->address) allowed_domains_.push_back(h->name);
    } else if (const auto h = split_host(e)) {
      if (h->address) {
        allowed_addresses_.push_back(*h->address);
      } else {
        allowed_names_.push_back(h->name);
      }
    }
  }
}

bool HostCheck::own_address(const ip::address& a) const {
  const auto now = std::chrono::steady_clock::now();
  if (now - interfaces_at_ > std::chrono::seconds(1)) {
    // An address may come or go while the job runs (DHCP, a VPN): read them again, but at most
    // once a second, whoever asks.
    interfaces_at_ = now;
    interfaces_.clear();
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) == 0) {
      for (const ifaddrs* i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr) continue;
        if (i->ifa_addr->sa_family == AF_INET) {
          const auto* v4 = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
          interfaces_.push_back(ip::address_v4(ntohl(v4->sin_addr.s_addr)));
        } else if (i->ifa_addr->sa_family == AF_INET6) {
          const auto* v6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
          ip::address_v6::bytes_type bytes;
          std::memcpy(bytes.data(), v6->sin6_addr.s6_addr, bytes.size());
          interfaces_.push_back(ip::address_v6(bytes));  // (its scope is no part of a Host field)
        }
      }
      ::freeifaddrs(list);
    }
  }
  return std::find(interfaces_.begin(), interfaces_.end(), a) != interfaces_.end();
}

bool HostCheck::allows(std::optional<std::string_view> host) const {
  if (!host || any_) return true;
  const auto h = split_host(*host);
  if (!h) return false;
  // RFC 6761: a browser resolves these to loopback itself, never through DNS.
  if (h->name == "localhost" || ends_with(h->name, ".localhost")) return true;
  if (h->address) {
    const ip::address a = *h->address;
    return a.is_loopback() || own_address(a) ||
           std::find(allowed_addresses_.begin(), allowed_addresses_.end(), a) != allowed_addresses_.end();
  }
  if (std::find(names_.begin(), names_.end(), h->name) != names_.end()) return true;
  if (std::find(allowed_names_.begin(), allowed_names_.end(), h->name) != allowed_names_.end()) return true;
  return std::any_of(allowed_domains_.begin(), allowed_domains_.end(),
                     [&](const std::string& d) { return h->name == d || ends_with(h->name, "." + d); });
}

std::optional<HttpReply> HostCheck::refuse(const HttpRequest& request) const {
  HttpReply r;
  r.status = 400;
  if (request.host_fields > 1) {
    r.body = "the request has " + std::to_string(request.host_fields) + " Host fields: send one\n";
    return r;
  }
  if (allows(request.host)) return std::nullopt;
  const std::string_view field = trimmed(*request.host);
  const std::string shown = "'" + printable_line(field.substr(0, 120)) + (field.size() > 120 ? "..." : "") + "'";
  const auto h = split_host(field);
  if (field.empty()) {
    r.body = "the Host field is empty: name this host (HOST or HOST:PORT), as a browser does\n";
    return r;
  }
  if (!h) {
    r.body = "the Host field " + shown + " is no host name or address (HOST or HOST:PORT)\n";
    return r;
  }
  std::string known;
  for (const std::string& n : names_) known += n + ", ";
  r.status = 403;
  r.body = "the Host " + shown +
           " is no name or address of this host: the page answers only requests addressed to this host (" + known +
           "127.0.0.1, [::1] or an address of its own), so that a page of another site whose name resolves here "
           "(DNS rebinding) cannot read it. To open it under that name, start with " +
           flag_ + " " + (h->address && h->address->is_v6() ? "[" + h->name + "]" : h->name) +
           " (a comma-separated list: names, addresses, .example.com for a domain, * for any)\n";
  return r;
}

std::vector<std::string> parse_allowed_hosts(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t comma = text.find(',', at);
    const std::string_view entry =
        trimmed(std::string_view(text).substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    const bool ok = entry == "*" || (!entry.empty() && entry.front() == '.' ? split_host(entry.substr(1)).has_value() &&
                                                                                  !split_host(entry.substr(1))->address
                                                                            : split_host(entry).has_value());
    if (!ok) {
      throw ConfigError(flag + ": " + (entry.empty() ? "an empty entry" : "'" + printable_line(entry) + "'") + " in '" +
                        printable_line(text) +
                        "' is no host name or address (expected NAME, ADDRESS, .DOMAIN or *, comma-separated, e.g. "
                        "node7.example.com,10.0.0.7)");
    }
    out.emplace_back(entry);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace ddprun::rdzv::server
