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

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/numbers.hpp"
#include "common/system.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/job_keys.hpp"
#include "rendezvous/daemon/metrics.hpp"
#include "rendezvous/server/server.hpp"
#include "rendezvous/daemon/status.hpp"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "0.0.0"
#endif

namespace {

using namespace ddprun;

constexpr const char* kUsage = R"(Usage: ddprun-rendezvous [OPTIONS]
       ddprun-rendezvous status --endpoint HOST:PORT [--token-file PATH]
       ddprun-rendezvous token --token-file PATH --rdzv_id ID [--output PATH]

Serves a PyTorch-compatible TCPStore (1.13 and 2.x clients on one port) for ddprun agents: many jobs
at once, each rerun of a job id in a namespace of its own, finished jobs forgotten.

Options (dashes and underscores in their names are interchangeable):
  --host ADDR            address to listen on (default 127.0.0.1; "::" for IPv6 and IPv4). Any other
                         than loopback needs --token-file (or --insecure)
  --port N               port to listen on; 0 lets the kernel pick one (default 29400)
  --port-file PATH       after binding, write the chosen port to PATH (for --port 0)
  --token-file PATH      protect the store with the secret in PATH (mode 600, yours): every client
                         proves it (HMAC-SHA256 challenge) before any key operation, and is bound to
                         one job's keys
  --insecure             listen on a non-loopback address without a secret (anyone who reaches the
                         port can read, change and end every job)
  --handshake-timeout SECONDS
                         with --token-file: close a connection that has not proved the secret
                         SECONDS after it connected (default 10)
  --max-pending-handshakes N
                         with --token-file: most connections not yet proven at once, the oldest
                         closed to make room (default 256, at most a quarter of the descriptor limit)
  --max-key-bytes N      longest key accepted (default 8192)
  --max-value-bytes N    largest value accepted (default 8388608)
  --max-keys N           most keys in one request (default 131072)
  --max-reply-bytes N    largest reply one request may produce (default 268435456)
  --max-total-keys N     most keys (and queues) the store holds (default 1048576)
  --max-store-bytes N    most bytes of keys and values the store holds (default 1073741824)
  --job-max-keys N       most keys one job (its keys under /ddprun/<run id>/) holds; 0 for no quota
                         (default 131072)
  --job-max-bytes N      most bytes one job holds; 0 for no quota (default 268435456)
  --metrics-port N       serve Prometheus metrics at http://HOST:N/metrics, on the store's address
                         (off by default; 0 lets the kernel pick the port, printed at start)
  --job-ttl SECONDS      forget a ddprun job at once when all its nodes have left, or after SECONDS
                         without any change (its agents were killed); 0 keeps every key (default 3600)
  --state-file PATH      keep the store's contents in PATH across restarts: a daemon killed and
                         started again on the same PATH (and port) within the agents' reconnect
                         window (--rdzv_conf store_reconnect_timeout, 30 s) ends no running job.
                         Each change is written before its reply; no fsync per write (the file
                         outlives the daemon, not a crash of its machine). Default: memory only
  --log-level LEVEL      debug, info, warn or error (default info; env DDPRUN_LOG_LEVEL)
  -h, --help             show this help
  --version              print the version

The bound address is printed on stdout as "listening on HOST:PORT". SIGTERM or SIGINT stop it
cleanly.

status: prints, as JSON, the ddprun jobs whose nodes rendezvous through the store at HOST:PORT
(run id, generation, round, state, nodes with their hosts, addresses and heartbeats, worker store,
outcome). A protected store needs --token-file (or DDPRUN_TOKEN_FILE): the daemon's secret shows
every job, a job token that job alone.

token: writes the token of job ID, derived from the daemon's secret, to PATH (mode 600) or stdout.
Agents given only that token (--rdzv_conf token_file=PATH) can act for that job and no other.
)";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "ddprun-rendezvous: " << message << "\n(see ddprun-rendezvous --help)\n";
  std::exit(2);
}

uint64_t parse_number(std::string_view flag, const std::string& text, uint64_t max) {
  if (const auto v = to_uint(text); v && *v <= max) return *v;
  usage_error(std::string(flag) + " expects a whole number from 0 to " + std::to_string(max) + ", got '" + text + "'");
}

// Walks argv[first..]: `--flag value` and `--flag=value`; `on_flag(name, next)` handles each.
template <typename Fn>
void for_each_flag(int argc, char** argv, int first, Fn&& on_flag) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const bool has_inline = arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos;
    if (has_inline) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
    }
    auto next = [&]() -> std::string {
      if (has_inline) return value;
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    on_flag(arg, next);
  }
}

std::optional<std::string> token_file_from_env() {
  const char* v = std::getenv("DDPRUN_TOKEN_FILE");
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

int status_main(int argc, char** argv) {
  std::string endpoint;
  std::optional<std::string> token_file = token_file_from_env();
  for_each_flag(argc, argv, 2, [&](const std::string& arg, auto next) {
    if (arg == "--endpoint") endpoint = next();
    else if (arg == "--token-file" || arg == "--token_file") token_file = next();
    else usage_error("status: unknown option '" + arg + "'");
  });
  if (endpoint.empty()) usage_error("status needs --endpoint HOST:PORT");
  std::string host = endpoint, port = "29400";
  if (host.front() == '[') {
    port = host.find("]:") != std::string::npos ? host.substr(host.find("]:") + 2) : port;
    host = host.substr(1, host.find(']') - 1);
  } else if (host.find(':') != std::string::npos) {
    port = host.substr(host.find(':') + 1);
    host = host.substr(0, host.find(':'));
  }
  rdzv::ClientOptions o;
  o.host = host;
  o.port = static_cast<uint16_t>(parse_number("--endpoint port", port, 65535));
  o.connect_timeout = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(10);
  o.missing_secret_hint = "give status the daemon's token file with --token-file PATH (or DDPRUN_TOKEN_FILE)";
  try {
    if (token_file) o.credentials = rdzv::status_credentials(rdzv::read_token_file(*token_file));
    rdzv::Client client(o);
    const auto status = rdzv::store_status(client);
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
  std::optional<std::string> token_file = token_file_from_env();
  std::string run_id, output;
  for_each_flag(argc, argv, 2, [&](const std::string& arg, auto next) {
    if (arg == "--token-file" || arg == "--token_file") token_file = next();
    else if (arg == "--rdzv_id" || arg == "--rdzv-id" || arg == "--run_id") run_id = next();
    else if (arg == "--output") output = next();
    else usage_error("token: unknown option '" + arg + "'");
  });
  if (!token_file) usage_error("token needs --token-file PATH (the daemon's secret)");
  std::string why;
  if (!rdzv::jobs::valid_run_id(run_id, &why)) usage_error("token needs --rdzv_id ID: '" + run_id + "': " + why);
  try {
    const rdzv::Token t = rdzv::read_token_file(*token_file);
    if (t.run_id) throw ConfigError(*token_file + " holds a job token, not the daemon's secret");
    const std::string line = rdzv::format_job_token(t.cluster_secret, run_id);
    if (output.empty()) {
      std::cout << line;
      return 0;
    }
    const mode_t old = ::umask(077);  // created 0600
    std::ofstream out(output, std::ios::trunc);
    ::umask(old);
    out << line;
    out.close();
    if (!out || ::chmod(output.c_str(), 0600) != 0) throw ConfigError("cannot write the token file " + output);
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
  // Written to a temporary name and renamed, so a reader never sees a partial number.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out) throw ConfigError("cannot write the port file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw ConfigError("cannot rename " + tmp + " to " + path);
}

// A number of seconds up to `max` (zero only where allowed), as milliseconds; `range` for the error.
std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text, bool allow_zero, double max,
                                        const char* range) {
  const auto secs = to_double(text);
  if (!secs || *secs < 0 || (*secs == 0 && !allow_zero) || *secs > max) {
    usage_error(flag + " expects a number of seconds " + range + ", got '" + text + "'");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(*secs * 1000));
}

struct ServeConfig {
  rdzv::ServerOptions options;
  std::string port_file;
  std::optional<std::string> token_file;
  std::optional<uint16_t> metrics_port;
  bool insecure = false;
  bool help = false;
  bool version = false;
};

// The daemon's defaults: a daemon serves many jobs, each with a share, so that one cannot fill the
// store for the others; agents ride out a partition or a restart (describe_self).
ServeConfig serve_defaults() {
  ServeConfig c;
  c.options.host = "127.0.0.1";
  c.options.port = 29400;
  c.options.store_limits.max_job_keys = 131072;
  c.options.store_limits.max_job_bytes = uint64_t{256} << 20;
  c.options.job_ttl = std::chrono::hours(1);
  c.options.describe_self = true;
  return c;
}

// One flag of the server's command line; false when `arg` is none of them.
template <typename Next>
bool apply_serve_flag(const std::string& arg, Next&& next, ServeConfig& c) {
  rdzv::ServerOptions& o = c.options;
  auto is = [&](const char* dashed) {
    std::string underscored = dashed;
    std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
    return arg == dashed || arg == underscored;
  };
  if (is("--host")) o.host = next();
  else if (is("--port")) o.port = static_cast<uint16_t>(parse_number(arg, next(), 65535));
  else if (is("--port-file")) c.port_file = next();
  else if (is("--token-file")) c.token_file = next();
  else if (is("--insecure")) c.insecure = true;
  else if (is("--max-key-bytes")) o.limits.max_key_bytes = parse_number(arg, next(), uint64_t{1} << 30);
  else if (is("--max-value-bytes")) {
    o.limits.max_value_bytes = parse_number(arg, next(), uint64_t{1} << 32);
    o.limits.max_request_bytes = std::max(o.limits.max_request_bytes, o.limits.max_value_bytes * 2);
  } else if (is("--max-keys")) o.limits.max_keys_per_request = parse_number(arg, next(), uint64_t{1} << 24);
  else if (is("--max-reply-bytes")) o.limits.max_reply_bytes = parse_number(arg, next(), uint64_t{1} << 40);
  else if (is("--max-total-keys")) o.store_limits.max_total_keys = parse_number(arg, next(), uint64_t{1} << 40);
  else if (is("--max-store-bytes")) o.store_limits.max_store_bytes = parse_number(arg, next(), uint64_t{1} << 50);
  else if (is("--job-max-keys")) o.store_limits.max_job_keys = parse_number(arg, next(), uint64_t{1} << 40);
  else if (is("--job-max-bytes")) o.store_limits.max_job_bytes = parse_number(arg, next(), uint64_t{1} << 50);
  else if (is("--metrics-port")) c.metrics_port = static_cast<uint16_t>(parse_number(arg, next(), 65535));
  else if (is("--handshake-timeout")) o.handshake_timeout = parse_seconds(arg, next(), false, 3600, "in (0, 3600]");
  else if (is("--max-pending-handshakes")) {
    o.max_pending_handshakes = parse_number(arg, next(), uint64_t{1} << 20);
    if (o.max_pending_handshakes == 0) usage_error("--max-pending-handshakes expects a number >= 1, got 0");
  } else if (is("--job-ttl")) o.job_ttl = parse_seconds(arg, next(), true, 1e7, ">= 0");
  else if (is("--state-file")) {
    o.state_file = next();
    if (o.state_file.empty()) usage_error("--state-file expects a path, got ''");
  } else if (is("--log-level")) {
    log::Level level;
    const std::string v = next();
    if (!log::parse_level(v, level)) usage_error("--log-level expects debug, info, warn or error, got '" + v + "'");
    log::set_level(level);
  } else {
    return false;
  }
  return true;
}

ServeConfig parse_serve_flags(int argc, char** argv) {
  ServeConfig c = serve_defaults();
  for_each_flag(argc, argv, 1, [&](const std::string& arg, auto next) {
    if (arg == "-h" || arg == "--help") c.help = true;
    else if (arg == "--version") c.version = true;
    else if (!apply_serve_flag(arg, next, c)) usage_error("unknown option '" + arg + "'");
  });
  return c;
}

// The secret from --token-file, or protected mode (as Redis has it): no secret, no network.
void load_secret(ServeConfig& c) {
  if (c.token_file) {
    const rdzv::Token t = rdzv::read_token_file(*c.token_file);
    if (t.run_id) throw ConfigError(*c.token_file + " holds a job token; the daemon needs the cluster secret itself");
    c.options.secret = rdzv::store_secret(t);
  } else if (!loopback_host(c.options.host) && !c.insecure) {
    throw ConfigError("refusing to listen on " + c.options.host + " without a secret: anyone who can reach port " +
                      std::to_string(c.options.port) + " could read, rewrite and end every job. Give the daemon a "
                      "secret with --token-file PATH (e.g. head -c 32 /dev/urandom | base64 > PATH; chmod 600 "
                      "PATH), or pass --insecure to accept the risk");
  }
}

// Serves until SIGINT or SIGTERM; throws what stops it from starting.
void serve(const ServeConfig& c) {
  raise_open_file_limit();
  boost::asio::io_context io(1);
  rdzv::Server server(io, c.options);
  if (!c.port_file.empty()) write_port_file(c.port_file, server.port());
  std::cout << "listening on " << rdzv::format_endpoint(server.endpoint()) << std::endl;
  if (c.options.secret) log::info("rendezvous") << "protected: clients must prove the secret in " << *c.token_file;
  else if (c.insecure) log::warn("rendezvous") << "--insecure: anyone who can reach this port can read and end every job";
  std::unique_ptr<rdzv::MetricsServer> metrics;
  if (c.metrics_port) {
    metrics = std::make_unique<rdzv::MetricsServer>(io, server.endpoint().address().to_string(), *c.metrics_port,
                                                     [&server] { return rdzv::render_metrics(server); });
    std::cout << "metrics on " << server.endpoint().address().to_string() << ":" << metrics->port() << std::endl;
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
  ServeConfig c = parse_serve_flags(argc, argv);
  if (c.help) {
    std::cout << kUsage;
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
