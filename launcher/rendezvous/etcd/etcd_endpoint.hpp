#pragma once
// One etcd endpoint as `--rdzv_endpoint` names it. Apart from the client so that the command line
// can check endpoints without the client.

#include <string>

namespace ddprun::launcher::rendezvous::etcd {

struct Endpoint {
  bool tls = false;
  std::string host;
  std::string port;
  std::string text;  // as given, normalised: "http://host:port"
};
// Parses one endpoint; throws ConfigError naming it.
Endpoint parse_endpoint(const std::string& text);

}  // namespace ddprun::launcher::rendezvous::etcd
