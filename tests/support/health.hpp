#pragma once
// Test helper: where a running ddprun stands, as its health endpoint reports it
// (TORCHELASTIC_HEALTH_CHECK_PORT, `?format=json`: see launcher/agent/status_server.hpp), for tests that
// wait on a phase (connecting, joined, running, finishing, ...) rather than on a sentence of its log.

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/raw_socket.hpp"

namespace ddprun::test {

struct Health {
  std::string phase;  // "" while nothing answers on the port
  int round = -1;
};

inline Health health_of(int port) {
  Health h;
  try {
    RawSocket s(static_cast<uint16_t>(port));
    std::string reply;
    if (!s.send("GET /?format=json HTTP/1.1\r\nHost: test\r\n\r\n") || !s.read_until_eof(&reply)) return h;
    const auto body = reply.find("\r\n\r\n");
    if (body == std::string::npos) return h;
    const nlohmann::json j = nlohmann::json::parse(reply.substr(body + 4), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return h;
    h.phase = j.value("phase", "");
    h.round = j.value("round", -1);
  } catch (const std::runtime_error&) {
    // Not listening yet.
  }
  return h;
}

// The environment that gives a ddprun its health endpoint on `port`.
inline std::map<std::string, std::string> health_env(int port) {
  return {{"TORCHELASTIC_HEALTH_CHECK_PORT", std::to_string(port)}};
}

}  // namespace ddprun::test
