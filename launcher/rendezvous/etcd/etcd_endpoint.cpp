#include "launcher/rendezvous/etcd/etcd_endpoint.hpp"

#include "common/errors.hpp"
#include "common/numbers.hpp"

namespace ddprun::launcher::rendezvous::etcd {

Endpoint parse_endpoint(const std::string& text) {
  Endpoint ep;
  std::string rest = text;
  if (rest.rfind("https://", 0) == 0) {
    ep.tls = true;
    rest = rest.substr(8);
  } else if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.find("://") != std::string::npos) {
    throw ConfigError("etcd endpoint '" + text + "': the scheme must be http:// or https://");
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string port = "2379";
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos) throw ConfigError("etcd endpoint '" + text + "': unclosed '['");
    ep.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') throw ConfigError("etcd endpoint '" + text + "': expected ':' after ']'");
      port = rest.substr(close + 2);
    }
  } else {
    const auto colon = rest.rfind(':');
    ep.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  const auto number = port.find_first_not_of("0123456789") == std::string::npos ? to_uint(port) : std::nullopt;
  if (ep.host.empty() || !number || *number == 0 || *number > 65535) {
    throw ConfigError("etcd endpoint '" + text + "': expected host:port, http://host:port or https://host:port");
  }
  ep.port = port;
  const bool v6 = ep.host.find(':') != std::string::npos;
  ep.text = std::string(ep.tls ? "https://" : "http://") + (v6 ? "[" + ep.host + "]" : ep.host) + ":" + port;
  return ep;
}

}  // namespace ddprun::launcher::rendezvous::etcd
