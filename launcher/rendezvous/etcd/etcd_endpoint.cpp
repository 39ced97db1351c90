#include "launcher/rendezvous/etcd/etcd_endpoint.hpp"

#include "common/host_port.hpp"
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
  std::string why;
  const auto hp = parse_host_port(rest, &why);
  if (!hp) {
    throw ConfigError("etcd endpoint '" + text + "': " + why +
                      "; expected host:port, [ipv6]:port, http://host:port or https://host:port");
  }
  ep.host = hp->host;
  ep.port = std::to_string(hp->port.value_or(2379));
  ep.text = std::string(ep.tls ? "https://" : "http://") + format_host_port(ep.host, hp->port.value_or(2379));
  return ep;
}

}  // namespace ddprun::launcher::rendezvous::etcd
