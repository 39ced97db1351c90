#pragma once
// Test helpers for the HTTP endpoints of ddprun and the daemon: one GET (the answer whole, its
// status and body), and Prometheus' own linter over a metrics text.

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "tests/support/raw_socket.hpp"
#include "tests/support/temp_dir.hpp"

namespace ddprun::test {

struct HttpAnswer {
  std::string whole;  // status line, header and body; "" when nothing answered
  int status = 0;
  std::string body;
};

// GET `path` from `address`:`port` (IPv4) with the Host field `host`, or, without one, as an
// HTTP/1.0 request that names no host; throws when the connection is refused.
inline HttpAnswer http_get_host(uint16_t port, const std::string& path, const std::optional<std::string>& host,
                                const char* address = "127.0.0.1") {
  RawSocket s(port, address);
  s.send("GET " + path + (host ? " HTTP/1.1\r\nHost: " + *host + "\r\n\r\n" : " HTTP/1.0\r\n\r\n"));
  HttpAnswer a;
  s.read_until_eof(&a.whole, std::chrono::seconds(10));
  if (a.whole.rfind("HTTP/1.", 0) == 0 && a.whole.size() >= 12) a.status = std::stoi(a.whole.substr(9, 3));
  if (const auto at = a.whole.find("\r\n\r\n"); at != std::string::npos) a.body = a.whole.substr(at + 4);
  return a;
}

// GET `path` from `address`:`port` (IPv4), as a browser at http://localhost asks.
inline HttpAnswer http_get(uint16_t port, const std::string& path, const char* address = "127.0.0.1") {
  return http_get_host(port, path, "localhost", address);
}

struct Lint {
  int exit_code = -1;  // 127: promtool is not installed
  std::string says;
};

// `promtool check metrics` over `text` (Debian's prometheus package; scripts/install_deps.sh).
inline Lint promtool_check(const std::string& text) {
  TempDir dir;
  const std::string file = (dir.path / "metrics.txt").string();
  std::ofstream(file) << text;
  Lint lint;
  FILE* p = ::popen(("promtool check metrics < " + file + " 2>&1").c_str(), "r");
  if (!p) return lint;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) lint.says += buf;
  const int status = ::pclose(p);
  lint.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return lint;
}

}  // namespace ddprun::test
