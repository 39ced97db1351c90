#pragma once
// host:port, read and written one way everywhere (flags, etcd endpoints, the daemon's status
// command, log lines and error messages): "host", "host:port", "[v6]" and "[v6]:port"; an IPv6
// address without brackets ("::1", "fe80::1") has two colons or more and is a host without a port.
// Written back as "[v6]:port" for an IPv6 address and "host:port" otherwise.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

struct HostPort {
  std::string host;              // without brackets
  std::optional<uint16_t> port;  // nullopt: none given
  bool operator==(const HostPort&) const = default;
};

// nullopt, with `why` (what is wrong, in a few words), for text that is none of the above: empty,
// an unclosed '[', something other than ':' after ']', an empty or non-numeric port, a port
// outside 1-65535.
std::optional<HostPort> parse_host_port(std::string_view text, std::string* why = nullptr);

// "[host]:port" when `host` is an IPv6 address (it holds a ':'), else "host:port".
std::string format_host_port(std::string_view host, uint16_t port);

}  // namespace ddprun
