#include "common/host_port.hpp"

#include <algorithm>

#include "common/numbers.hpp"

namespace ddprun {

std::optional<HostPort> parse_host_port(std::string_view text, std::string* why) {
  auto fail = [&](const char* what) -> std::optional<HostPort> {
    if (why) *why = what;
    return std::nullopt;
  };
  HostPort out;
  std::string_view port;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return fail("an unclosed '['");
    out.host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return fail("something other than ':port' after ']'");
      port = text.substr(close + 2);
      has_port = true;
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    const auto colon = text.find(':');
    out.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    has_port = true;
  } else {
    out.host = std::string(text);  // a name, an IPv4 address, or an IPv6 address without brackets
  }
  if (out.host.empty()) return fail("no host");
  if (has_port) {
    const auto number = to_uint(port);
    if (port.empty() || !number || *number == 0 || *number > 65535) return fail("a port that is not 1-65535");
    out.port = static_cast<uint16_t>(*number);
  }
  return out;
}

std::string format_host_port(std::string_view host, uint16_t port) {
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string out;
  if (v6) out += '[';
  out += host;
  if (v6) out += ']';
  return out + ":" + std::to_string(port);
}

}  // namespace ddprun
