// ddprun-rendezvous: the standalone store daemon. Serves PyTorch TCPStore clients (1.13 and 2.x)
// and ddprun agents on one port until SIGTERM or SIGINT.
//
// Exit codes: 0 clean shutdown, 2 bad command line, 1 could not start (e.g. port in use).

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "rendezvous/metrics.hpp"
#include "rendezvous/server.hpp"
#include "rendezvous/status.hpp"

namespace {

constexpr const char* kUsage = R"(usage: ddprun-rendezvous [options]
       ddprun-rendezvous status --endpoint HOST:PORT

Serves a PyTorch-compatible TCPStore (1.13 and 2.x clients on one port) for ddprun agents and workers.

options:
  --host ADDR            address to listen on (default 0.0.0.0; "::" for IPv6 and IPv4)
  --port N               port to listen on; 0 lets the kernel pick one (default 29400)
  --port-file PATH       after binding, write the chosen port to PATH (for --port 0)
  --max-key-bytes N      longest key accepted (default 8192)
  --max-value-bytes N    largest value accepted (default 8388608)
  --max-keys N           most keys in one request (default 131072)
  --max-reply-bytes N    largest reply one request may produce (default 268435456)
  --max-total-keys N     most keys (and queues) the store holds (default 1048576)
  --max-store-bytes N    most bytes of keys and values the store holds (default 1073741824)
  --metrics-port N       serve Prometheus metrics at http://HOST:N/metrics, on the store's address
                         (off by default; 0 lets the kernel pick the port, printed at start)
  --job-ttl SECONDS      forget a ddprun job at once when all its nodes have left, or after SECONDS
                         without any change (its agents were killed); 0 keeps every key (default 3600)
  --log-level LEVEL      debug, info, warn or error (default info; env DDPRUN_LOG_LEVEL)
  -h, --help             show this help

The bound address is printed on stdout as "listening on HOST:PORT". SIGTERM or SIGINT stop it cleanly.

status: prints, as JSON, the ddprun jobs whose nodes rendezvous through the store at HOST:PORT
(run id, round, state, nodes with their hosts, addresses and join times, worker store, outcome).
)";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "ddprun-rendezvous: " << message << "\n(see ddprun-rendezvous --help)\n";
  std::exit(2);
}

uint64_t parse_number(std::string_view flag, const std::string& text, uint64_t max) {
  try {
    size_t used = 0;
    const unsigned long long v = std::stoull(text, &used);
    if (used == text.size() && v <= max && text[0] != '-') return v;
  } catch (const std::exception&) {
  }
  usage_error(std::string(flag) + " expects a whole number from 0 to " + std::to_string(max) + ", got '" + text + "'");
}

int status_main(int argc, char** argv) {
  std::string endpoint;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--endpoint" && i + 1 < argc) endpoint = argv[++i];
    else if (arg.rfind("--endpoint=", 0) == 0) endpoint = arg.substr(11);
    else usage_error("status: unknown option '" + arg + "'");
  }
  if (endpoint.empty()) usage_error("status needs --endpoint HOST:PORT");
  std::string host = endpoint, port = "29400";
  if (host.front() == '[') {
    port = host.find("]:") != std::string::npos ? host.substr(host.find("]:") + 2) : port;
    host = host.substr(1, host.find(']') - 1);
  } else if (host.find(':') != std::string::npos) {
    port = host.substr(host.find(':') + 1);
    host = host.substr(0, host.find(':'));
  }
  ddprun::rdzv::ClientOptions o;
  o.host = host;
  o.port = static_cast<uint16_t>(parse_number("--endpoint port", port, 65535));
  o.connect_timeout = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(10);
  try {
    ddprun::rdzv::Client client(o);
    const auto status = ddprun::rdzv::store_status(client);
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

}  // namespace

int main(int argc, char** argv) {
  using namespace ddprun;
  if (argc >= 2 && std::string(argv[1]) == "status") return status_main(argc, argv);
  rdzv::ServerOptions options;
  options.host = "0.0.0.0";
  options.port = 29400;
  options.job_ttl = std::chrono::hours(1);
  std::string port_file;
  std::optional<uint16_t> metrics_port;
  for (int i = 1; i < argc; ++i) {
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
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--host") {
      options.host = next();
    } else if (arg == "--port") {
      options.port = static_cast<uint16_t>(parse_number(arg, next(), 65535));
    } else if (arg == "--port-file" || arg == "--port_file") {
      port_file = next();
    } else if (arg == "--max-key-bytes") {
      options.limits.max_key_bytes = parse_number(arg, next(), uint64_t{1} << 30);
    } else if (arg == "--max-value-bytes") {
      options.limits.max_value_bytes = parse_number(arg, next(), uint64_t{1} << 32);
      options.limits.max_request_bytes = std::max(options.limits.max_request_bytes, options.limits.max_value_bytes * 2);
    } else if (arg == "--max-keys") {
      options.limits.max_keys_per_request = parse_number(arg, next(), uint64_t{1} << 24);
    } else if (arg == "--max-reply-bytes") {
      options.limits.max_reply_bytes = parse_number(arg, next(), uint64_t{1} << 40);
    } else if (arg == "--max-total-keys") {
      options.store_limits.max_total_keys = parse_number(arg, next(), uint64_t{1} << 40);
    } else if (arg == "--metrics-port" || arg == "--metrics_port") {
      metrics_port = static_cast<uint16_t>(parse_number(arg, next(), 65535));
    } else if (arg == "--job-ttl" || arg == "--job_ttl") {
      const std::string v = next();
      char* end = nullptr;
      const double secs = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(secs >= 0) || secs > 1e7) {
        usage_error("--job-ttl expects a number of seconds >= 0, got '" + v + "'");
      }
      options.job_ttl = std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
    } else if (arg == "--max-store-bytes") {
      options.store_limits.max_store_bytes = parse_number(arg, next(), uint64_t{1} << 50);
    } else if (arg == "--log-level") {
      log::Level level;
      const std::string v = next();
      if (!log::parse_level(v, level)) usage_error("--log-level expects debug, info, warn or error, got '" + v + "'");
      log::set_level(level);
    } else {
      usage_error("unknown option '" + arg + "'");
    }
  }

  try {
    raise_open_file_limit();
    boost::asio::io_context io(1);
    rdzv::Server server(io, options);
    if (!port_file.empty()) {
      // Written to a temporary name and renamed, so a reader never sees a partial number.
      const std::string tmp = port_file + ".tmp";
      {
        std::ofstream out(tmp);
        out << server.port() << "\n";
        if (!out) throw ConfigError("cannot write the port file " + tmp);
      }
      if (std::rename(tmp.c_str(), port_file.c_str()) != 0) throw ConfigError("cannot rename " + tmp + " to " + port_file);
    }
    std::cout << "listening on " << rdzv::format_endpoint(server.endpoint()) << std::endl;
    std::unique_ptr<rdzv::MetricsServer> metrics;
    if (metrics_port) {
      metrics = std::make_unique<rdzv::MetricsServer>(io, server.endpoint().address().to_string(), *metrics_port,
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
    return 0;
  } catch (const std::exception& e) {
    log::error("rendezvous") << e.what();
    return 1;
  }
}
