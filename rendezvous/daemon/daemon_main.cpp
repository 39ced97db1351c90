// ddprun-rendezvous: the standalone store daemon. Serves PyTorch TCPStore clients (1.13 and 2.x)
// and ddprun agents on one port until SIGTERM or SIGINT; `status` shows the jobs it serves;
// `token` derives a job's token from the daemon's secret.
//
// Exit codes: 0 clean shutdown, 2 bad command line (or protected mode refusing to start), 1 could
// not start (e.g. port in use).

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <sys/stat.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/signal_set.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/defaults.hpp"
#include "common/errors.hpp"
#include "common/host_port.hpp"
#include "common/log.hpp"
#include "common/replace_file.hpp"
#include "common/numbers.hpp"
#include "common/system.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/daemon/daemon_flags.hpp"
#include "rendezvous/daemon/jobs_page.hpp"
#include "rendezvous/daemon/metrics.hpp"
#include "rendezvous/server/server.hpp"
#include "rendezvous/daemon/status.hpp"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "0.0.0"
#endif

namespace {

using namespace ddprun;
using rdzv::daemon::ServeConfig;

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "ddprun-rendezvous: " << message << "\n(see ddprun-rendezvous --help)\n";
  std::exit(2);
}

// argv[first..] as a list.
std::vector<std::string> arguments(int argc, char** argv, int first) {
  return std::vector<std::string>(argv + std::min(first, argc), argv + argc);
}

int status_main(int argc, char** argv) {
  rdzv::daemon::StatusFlags flags;
  try {
    flags = rdzv::daemon::parse_status_flags(arguments(argc, argv, 2));
  } catch (const ConfigError& e) {
    usage_error(e.what());
  }
  const std::optional<std::string>& token_file = flags.token_file;
  std::string why;
  const auto endpoint = parse_host_port(flags.endpoint, &why);
  if (!endpoint) usage_error("--endpoint expects HOST[:PORT] or [IPV6]:PORT, got '" + flags.endpoint + "': " + why);
  rdzv::client::ClientOptions o;
  o.host = endpoint->host;
  o.port = endpoint->port.value_or(defaults::kStorePort);
  o.connect_timeout = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(10);
  o.missing_secret_hint = "give status the daemon's token file with --token-file PATH (or DDPRUN_TOKEN_FILE)";
  try {
    if (token_file) o.credentials = rdzv::core::status_credentials(rdzv::core::read_token_file(*token_file));
    rdzv::client::Client client(o);
    const auto status = rdzv::daemon::store_status(client);
    std::cout << status.dump(2) << std::endl;
    if (status.contains("skipped")) {
      std::cerr << "ddprun-rendezvous status: skipped " << status["skipped"].size()
                << " key(s) that are not ddprun rendezvous keys or could not be parsed (listed under \"skipped\")\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddprun-rendezvous status: " << e.what() << "\n";
    return 1;
  }
}

int token_main(int argc, char** argv) {
  rdzv::daemon::TokenFlags flags;
  try {
    flags = rdzv::daemon::parse_token_flags(arguments(argc, argv, 2));
  } catch (const ConfigError& e) {
    usage_error(e.what());
  }
  const std::string& token_file = *flags.token_file;
  const std::string& run_id = flags.run_id;
  const std::string& output = flags.output;
  std::string why;
  if (!rdzv::core::valid_run_id(run_id, &why)) usage_error("token needs --rdzv_id ID: '" + run_id + "': " + why);
  try {
    const rdzv::core::Token t = rdzv::core::read_token_file(token_file);
    if (t.run_id) throw ConfigError(token_file + " holds a job token, not the daemon's secret");
    const std::string line = rdzv::core::format_job_token(t.cluster_secret, run_id);
    if (output.empty()) {
      std::cout << line;
      return 0;
    }
    if (const auto failed = replace_file(output, line)) {  // 0600, whole or not at all
      throw ConfigError("cannot write the token file " + output + ": " + failed->what());
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddprun-rendezvous token: " << e.what() << "\n";
    return 2;
  }
}

bool loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(host, ec);
  return !ec && addr.is_loopback();
}

void write_port_file(const std::string& path, uint16_t port) {
  // A reader never sees a partial number.
  ReplaceFile how;
  how.durability = Durability::Atomic;
  how.mode = 0644;
  if (const auto failed = replace_file(path, std::to_string(port) + "\n", how)) {
    throw ConfigError("cannot write the port file " + path + ": " + failed->what());
  }
}

// The secret from --token-file, or protected mode (as Redis has it): no secret, no network.
void load_secret(ServeConfig& c) {
  if (c.token_file) {
    const rdzv::core::Token t = rdzv::core::read_token_file(*c.token_file);
    if (t.run_id) throw ConfigError(*c.token_file + " holds a job token; the daemon needs the cluster secret itself");
    c.options.secret = rdzv::core::store_secret(t);
  } else if (!loopback_host(c.options.host) && !c.insecure) {
    throw ConfigError("refusing to listen on " + c.options.host + " without a secret: anyone who can reach port " +
                      std::to_string(c.options.port) +
                      " could read, rewrite and end every job. Give the daemon a "
                      "secret with --token-file PATH (e.g. head -c 32 /dev/urandom | base64 > PATH; chmod 600 "
                      "PATH), or pass --insecure to accept the risk");
  }
}

// Serves until SIGINT or SIGTERM; throws what stops it from starting.
void serve(const ServeConfig& c) {
  raise_open_file_limit();
  boost::asio::io_context io(1);
  rdzv::server::Server server(io, c.options);
  if (!c.port_file.empty()) write_port_file(c.port_file, server.port());
  std::cout << "listening on " << rdzv::server::format_endpoint(server.endpoint()) << std::endl;
  if (c.options.secret) log::info("rendezvous") << "protected: clients must prove the secret in " << *c.token_file;
  else if (c.insecure)
    log::warn("rendezvous") << "--insecure: anyone who can reach this port can read and end every job";
  std::unique_ptr<rdzv::daemon::JobsPage> page;
  std::unique_ptr<rdzv::daemon::JobStates> job_states;
  std::unique_ptr<rdzv::daemon::MetricsServer> metrics;
  if (c.metrics_port) {
    rdzv::daemon::JobsPageSettings ps;
    ps.allowed_hosts = c.metrics_allowed_hosts;
    page = std::make_unique<rdzv::daemon::JobsPage>(io, server, ps);
    job_states = std::make_unique<rdzv::daemon::JobStates>(server.store());
    metrics = std::make_unique<rdzv::daemon::MetricsServer>(
        io, server.endpoint().address().to_string(), *c.metrics_port,
        [&server, &job_states] { return rdzv::daemon::render_metrics(server, *job_states); },
        [&page](const rdzv::server::HttpRequest& request) { return page->serve(request); });
    std::cout << "metrics on " << format_host_port(server.endpoint().address().to_string(), metrics->port())
              << std::endl;
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    log::info("rendezvous") << "received " << (signo == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down";
    server.stop();
    if (metrics) metrics->stop();
    io.stop();
  });
  std::signal(SIGPIPE, SIG_IGN);
  server.start();
  if (metrics) metrics->start();
  io.run();
}

int serve_main(int argc, char** argv) {
  ServeConfig c;
  try {
    c = rdzv::daemon::parse_serve_flags(arguments(argc, argv, 1));
  } catch (const ConfigError& e) {
    usage_error(e.what());
  }
  if (c.help) {
    std::cout << (c.help_markdown ? rdzv::daemon::flag_table_markdown() : rdzv::daemon::usage_text());
    return 0;
  }
  if (c.version) {
    std::cout << "ddprun-rendezvous " << DDPRUN_VERSION << "\n";
    return 0;
  }
  try {
    load_secret(c);
  } catch (const ConfigError& e) {
    std::cerr << "ddprun-rendezvous: " << e.what() << "\n";
    return 2;
  }
  try {
    serve(c);
    return 0;
  } catch (const std::exception& e) {
    log::error("rendezvous") << e.what();
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "status") return status_main(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "token") return token_main(argc, argv);
  return serve_main(argc, argv);
}
