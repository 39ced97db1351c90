// parse_options, step 3b: how the nodes find each other (options.cpp has the other steps).
#include <algorithm>

#include "launcher/rendezvous/etcd/etcd_endpoint.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options_parse.hpp"
#include "rendezvous/core/job_keys.hpp"

namespace ddprun::launcher::options_detail {

void resolve_rendezvous(const Given& g, const EnvLookup& env, LaunchOptions& o) {
  if (g.has("rdzv_backend")) {
    o.rdzv_backend = trim(g["rdzv_backend"]);
    if (o.rdzv_backend == "etcd-v2") {
      throw ConfigError(g.flag("rdzv_backend") + " etcd-v2: that is torchrun's backend for etcd's v2 API, which etcd "
                        "3.4 disables and 3.6 removed; ddprun speaks etcd's v3 API: use --rdzv_backend etcd");
    }
    if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d" && o.rdzv_backend != "etcd") {
      throw ConfigError(g.flag("rdzv_backend") + ": expected 'static' (fixed --node_rank per node), 'c10d' "
                        "(nodes join --rdzv_endpoint without ranks, --nnodes MIN:MAX) or 'etcd' (the same through "
                        "an etcd v3 cluster), got '" + o.rdzv_backend + "'");
    }
  }
  if (o.rdzv_backend == "etcd" && g.has("rdzv_endpoint") && !trim(g["rdzv_endpoint"]).empty()) {
    // host:port[,host:port...], each optionally http:// or https://
    o.rdzv_endpoint = trim(g["rdzv_endpoint"]);
    for (const std::string& e : split(o.rdzv_endpoint, ',')) {
      if (e.empty()) continue;
      try {
        etcd::parse_endpoint(e);
      } catch (const ConfigError& err) {
        throw ConfigError(g.flag("rdzv_endpoint") + ": " + err.what());
      }
      o.etcd.endpoints.push_back(e);
    }
  } else if (g.has("rdzv_endpoint") && !trim(g["rdzv_endpoint"]).empty()) {
    // host, host:port, [v6], [v6]:port
    o.rdzv_endpoint = trim(g["rdzv_endpoint"]);
    const std::string expected = "host[:port] or [ipv6]:port";
    std::string host = o.rdzv_endpoint, port;
    if (host.front() == '[') {
      const auto close = host.find(']');
      if (close == std::string::npos) bad(g.flag("rdzv_endpoint"), expected, o.rdzv_endpoint);
      if (close + 1 < host.size()) {
        if (host[close + 1] != ':') bad(g.flag("rdzv_endpoint"), expected, o.rdzv_endpoint);
        port = host.substr(close + 2);
      }
      host = host.substr(1, close - 1);
    } else if (std::count(host.begin(), host.end(), ':') == 1) {
      port = host.substr(host.find(':') + 1);
      host = host.substr(0, host.find(':'));
    }
    if (host.empty()) bad(g.flag("rdzv_endpoint"), expected, o.rdzv_endpoint);
    o.rdzv_endpoint_host = host;
    if (!port.empty()) {
      o.rdzv_endpoint_port = static_cast<uint16_t>(
          parse_int(g.flag("rdzv_endpoint"), port, 1, 65535, "host[:port] with a port from 1 to 65535"));
    }
  }
  if (g.has("rdzv_id")) {
    o.run_id = trim(g["rdzv_id"]);
    std::string why;
    if (!rdzv::jobs::valid_run_id(o.run_id, &why)) {
      throw ConfigError(g.flag("rdzv_id") + ": '" + o.run_id + "' cannot name a job: " + why);
    }
  }
  if (auto v = env("DDPRUN_TOKEN_FILE"); v && !v->empty()) o.token_file = *v;  // rdzv_conf token_file wins
  if (!g.has("rdzv_conf") || trim(g["rdzv_conf"]).empty()) return;
  for (const std::string& kv : split(g["rdzv_conf"], ',')) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) bad(g.flag("rdzv_conf"), "key=value pairs separated by commas", kv);
    o.rdzv_conf[trim(kv.substr(0, eq))] = trim(kv.substr(eq + 1));
  }
  std::optional<std::chrono::milliseconds> heartbeat_timeout;
  for (const auto& [k, v] : o.rdzv_conf) {
    const RdzvConfKey* key = find_rdzv_conf_key(k);
    if (key == nullptr) {
      std::string known;
      for (const RdzvConfKey& c : rdzv_conf_keys()) known += (known.empty() ? "" : ", ") + std::string(c.name);
      throw ConfigError(g.flag("rdzv_conf") + ": unknown key '" + k + "' (known: " + known + ")");
    }
    if (key->etcd_only && o.rdzv_backend != "etcd") {
      throw ConfigError(g.flag("rdzv_conf") + " " + k + ": an etcd setting, but the rendezvous backend is '" +
                        o.rdzv_backend + "' (add --rdzv_backend etcd, or drop " + k + ")");
    }
    const std::string where = g.flag("rdzv_conf") + " " + k;
    const std::string_view name = key->name;
    if (name == "join_timeout") {
      o.join_timeout = parse_seconds(where, v, false);
    } else if (name == "keep_alive_interval") {
      o.keep_alive_interval = parse_seconds(where, v, false);
    } else if (name == "keep_alive_max_attempt") {
      o.keep_alive_max_attempt = static_cast<int>(parse_int(where, v, 1, 1000, "a count >= 1"));
    } else if (name == "heartbeat_timeout") {
      heartbeat_timeout = parse_seconds(where, v, false);
    } else if (name == "last_call_timeout") {
      o.last_call_timeout = parse_seconds(where, v, false);
    } else if (name == "close_timeout") {
      parse_seconds(where, v, false);  // rounds close at once; validated only
    } else if (name == "read_timeout") {
      o.rdzv_read_timeout = parse_seconds(where, v, false);
    } else if (name == "store_reconnect_timeout") {
      o.store_reconnect_timeout = parse_seconds(where, v, true);
    } else if (name == "is_host") {
      o.rdzv_is_host = parse_bool(where, v);
    } else if (name == "store_type") {
      if (lower(v) != "tcp") {
        bad(where, "'tcp' (ddprun's rendezvous store is its TCPStore; torchrun's store_type=file has no "
                   "counterpart)", v);
      }
    } else if (name == "use_libuv") {
      parse_bool(where, v);  // the store is ddprun's own: no libuv to choose; validated only
    } else if (name == "rank") {
      const int rank = static_cast<int>(parse_int(where, v, 0, o.max_nodes - 1, "a node rank"));
      if (o.node_rank_given && rank != o.node_rank) {
        throw ConfigError(where + " is " + v + " but --node_rank is " + std::to_string(o.node_rank) + ": keep one");
      }
      o.node_rank = rank;
      o.node_rank_given = true;
    } else if (name == "token_file") {
      if (v.empty()) bad(where, "the path of a file holding the secret", v);
      o.token_file = v;
    } else if (name == "key_prefix") {
      if (v.empty()) bad(where, "a key prefix such as /ddprun/", v);
      o.etcd.prefix = v.back() == '/' ? v : v + "/";
    } else if (name == "lease_ttl") {
      o.etcd.lease_ttl = std::chrono::seconds(parse_int(where, v, 2, 3600, "whole seconds from 2 to 3600"));
    } else if (name == "etcd_user") {
      o.etcd.user = v;
    } else if (name == "etcd_password_file") {
      o.etcd.password_file = v;
    } else if (name == "etcd_ca_file") {
      o.etcd.ca_file = v;
    } else if (name == "etcd_cert_file") {
      o.etcd.cert_file = v;
    } else if (name == "etcd_key_file") {
      o.etcd.key_file = v;
    } else if (name == "protocol") {
      if (v != "http" && v != "https") bad(where, "http or https", v);
      // torchrun's etcd backends: the scheme of endpoints given without one.
      for (std::string& e : o.etcd.endpoints) {
        if (e.find("://") == std::string::npos) e = v + "://" + e;
      }
    }
  }
  if (heartbeat_timeout) {
    // A node is lost after keep_alive_max_attempt missed keep-alives: as many as fit in the timeout.
    const auto n = (heartbeat_timeout->count() + o.keep_alive_interval.count() - 1) / o.keep_alive_interval.count();
    o.keep_alive_max_attempt = static_cast<int>(std::clamp<long long>(n, 1, 1000));
  }
  if (!o.etcd.user.empty() && o.etcd.password_file.empty()) {
    throw ConfigError(g.flag("rdzv_conf") + ": etcd_user needs etcd_password_file=PATH (a file only you can read)");
  }
}

}  // namespace ddprun::launcher::options_detail
