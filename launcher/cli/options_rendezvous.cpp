// How the nodes find each other: the rows of --rdzv_backend, --rdzv_endpoint and --rdzv_conf (the
// flag table is flags.cpp), and the table of --rdzv_conf keys: each key's spellings, meaning and what
// its value does, in one place.
#include <algorithm>
#include <string_view>

#include "common/host_port.hpp"
#include "launcher/rendezvous/etcd/etcd_endpoint.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options_parse.hpp"

namespace ddprun::launcher::cli {

namespace etcd = rendezvous::etcd;
namespace {

using options_detail::bad;
using options_detail::lower;
using options_detail::parse_bool;
using options_detail::parse_int;
using options_detail::parse_seconds;
using options_detail::seconds_text;

// Every --rdzv_conf key torchrun 2.x accepts, and ddprun's own, in --help order.
constexpr RdzvConfKey kRdzvConfKeys[] = {
    {"join_timeout", "timeout", false, "seconds a rendezvous may take before the node gives up",
     [](const LaunchOptions& d) { return seconds_text(d.rdzv_timeouts.join_timeout); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.rdzv_timeouts.join_timeout = parse_seconds(where, v, false);
     }},
    {"last_call_timeout", "", false, "seconds an elastic rendezvous waits for more nodes once it has `--nnodes` MIN",
     [](const LaunchOptions& d) { return seconds_text(d.rdzv_timeouts.last_call_timeout); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.rdzv_timeouts.last_call_timeout = parse_seconds(where, v, false);
     }},
    {"quorum_join_timeout", "", false,
     "replica groups: seconds a quorum waits for heartbeating groups that have not asked yet before it goes on "
     "without them",
     [](const LaunchOptions& d) { return seconds_text(d.quorum_join_timeout); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.quorum_join_timeout = parse_seconds(where, v, true);
     }},
    {"quorum_heartbeat_timeout", "", false,
     "replica groups: seconds without a heartbeat after which a group no longer counts for the quorum (a group "
     "whose workers died is out at once)",
     [](const LaunchOptions& d) { return seconds_text(d.quorum_heartbeat_timeout); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.quorum_heartbeat_timeout = parse_seconds(where, v, false);
     }},
    {"keep_alive_interval", "", false, "seconds between a node's keep-alives",
     [](const LaunchOptions& d) { return seconds_text(d.rdzv_timeouts.keep_alive_interval); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.rdzv_timeouts.keep_alive_interval = parse_seconds(where, v, false);
     }},
    {"keep_alive_max_attempt", "", false, "missed keep-alives after which a node is lost",
     [](const LaunchOptions& d) { return std::to_string(d.rdzv_timeouts.keep_alive_max_attempt); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.rdzv_timeouts.keep_alive_max_attempt = static_cast<int>(parse_int(where, v, 1, 1000, "a count >= 1"));
     }},
    {"heartbeat_timeout", "", false,
     "seconds without keep-alives after which a node is lost: sets `keep_alive_max_attempt` to as many "
     "intervals as fit",
     nullptr, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.heartbeat_timeout = parse_seconds(where, v, false);
     }},
    {"read_timeout", "", false,
     "seconds one request to the rendezvous store may take (torchrun: the c10d backend's store reads)",
     [](const LaunchOptions& d) { return seconds_text(d.rdzv_timeouts.read_timeout); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.rdzv_timeouts.read_timeout = parse_seconds(where, v, false);
     }},
    {"store_reconnect_timeout", "", false,
     "seconds a node keeps reconnecting to its rendezvous store (a `ddprun-rendezvous`, or node 0's ddprun) "
     "after losing it, or after a request got no reply (a partition, a frozen host), before the job fails; "
     "`0` fails at once. A store without `--state-file` that refuses the reconnection has ended and is not "
     "waited for",
     [](const LaunchOptions& d) { return seconds_text(d.rdzv_timeouts.store_reconnect_timeout); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.rdzv_timeouts.store_reconnect_timeout = parse_seconds(where, v, true);
     },
     "[Partitions](multi-node.md#partitions-and-frozen-hosts) and "
     "[Restarting the daemon](operations.md#restarting-the-daemon-without-ending-jobs)"},
    {"is_host", "", false,
     "with `c10d`: whether this node hosts the store at `--rdzv_endpoint`; `false` makes it a client (of another "
     "node or a daemon); `true` makes a port already taken an error",
     nullptr, "when the endpoint is one of this host's names or addresses",
     [](const std::string& where, const std::string& v, LaunchOptions& o) { o.rdzv_is_host = parse_bool(where, v); }},
    {"close_timeout", "", false,
     "accepted and checked (a number of seconds): torchrun's wait for a closing round; ddprun's rounds close "
     "at once",
     nullptr, "",
     [](const std::string& where, const std::string& v, LaunchOptions&) { parse_seconds(where, v, false); }},
    {"store_type", "", false,
     "accepted when `tcp`: the rendezvous store is ddprun's TCP store; torchrun's `file` store has no "
     "counterpart (error)",
     nullptr, "`tcp`",
     [](const std::string& where, const std::string& v, LaunchOptions&) {
       if (lower(v) != "tcp") {
         bad(where,
             "'tcp' (ddprun's rendezvous store is its TCPStore; torchrun's store_type=file has no "
             "counterpart)",
             v);
       }
     }},
    {"use_libuv", "", false,
     "accepted and checked (a boolean): torchrun's choice of its store's event loop; the rendezvous store is "
     "ddprun's own",
     nullptr, "", [](const std::string& where, const std::string& v, LaunchOptions&) { parse_bool(where, v); },
     "[the Python hook](#pytorch-2x-and-debian-13) for the workers' client"},
    {"rank", "", false, "the node's rank, as `--node_rank` (both given and different: an error)", nullptr, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       const int rank = static_cast<int>(parse_int(where, v, 0, o.max_nodes - 1, "a node rank"));
       if (o.node_rank_given && rank != o.node_rank) {
         throw ConfigError(where + " is " + v + " but --node_rank is " + std::to_string(o.node_rank) + ": keep one");
       }
       o.node_rank = rank;
       o.node_rank_given = true;
     }},
    {"token_file", "", false, "the rendezvous store's secret or this job's token (also `DDPRUN_TOKEN_FILE`)", nullptr,
     "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       if (v.empty()) bad(where, "the path of a file holding the secret", v);
       o.token_file = v;
     },
     "[the threat model](multi-node.md#who-may-talk-to-a-store-the-threat-model)"},
    {"key_prefix", "etcd_prefix", true, "etcd: the prefix of the job's keys",
     [](const LaunchOptions& d) { return d.etcd.prefix; }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       if (v.empty()) bad(where, "a key prefix such as /ddprun/", v);
       o.etcd.prefix = v.back() == '/' ? v : v + "/";
     }},
    {"lease_ttl", "", true, "etcd: seconds of the agents' leases",
     [](const LaunchOptions& d) { return std::to_string(d.etcd.lease_ttl.count()); }, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       o.etcd.lease_ttl = std::chrono::seconds(parse_int(where, v, 2, 3600, "whole seconds from 2 to 3600"));
     }},
    {"etcd_user", "", true, "etcd: user name (needs `etcd_password_file`)", nullptr, "",
     [](const std::string&, const std::string& v, LaunchOptions& o) { o.etcd.user = v; }},
    {"etcd_password_file", "", true, "etcd: the file holding the password", nullptr, "",
     [](const std::string&, const std::string& v, LaunchOptions& o) { o.etcd.password_file = v; }},
    {"etcd_ca_file", "cacert,ca_cert", true, "etcd: CA certificate (PEM)", nullptr, "",
     [](const std::string&, const std::string& v, LaunchOptions& o) { o.etcd.ca_file = v; }},
    {"etcd_cert_file", "cert,ssl_cert", true, "etcd: client certificate (PEM)", nullptr, "",
     [](const std::string&, const std::string& v, LaunchOptions& o) { o.etcd.cert_file = v; }},
    {"etcd_key_file", "key,ssl_cert_key", true, "etcd: client key (PEM)", nullptr, "",
     [](const std::string&, const std::string& v, LaunchOptions& o) { o.etcd.key_file = v; }},
    {"protocol", "", true, "etcd: `http` or `https` for endpoints given without a scheme", nullptr, "",
     [](const std::string& where, const std::string& v, LaunchOptions& o) {
       if (v != "http" && v != "https") bad(where, "http or https", v);
       // torchrun's etcd backends: the scheme of endpoints given without one.
       for (std::string& e : o.etcd.endpoints) {
         if (e.find("://") == std::string::npos) e = v + "://" + e;
       }
     }},
};

}  // namespace

std::span<const RdzvConfKey> rdzv_conf_keys() { return kRdzvConfKeys; }

std::string RdzvConfKey::default_text() const { return shown ? shown(LaunchOptions{}) : std::string(note); }

const RdzvConfKey* find_rdzv_conf_key(const std::string& spelled) {
  for (const RdzvConfKey& k : kRdzvConfKeys) {
    if (spelled == k.name) return &k;
    std::string_view aliases = k.aliases;
    while (!aliases.empty()) {
      const auto comma = aliases.find(',');
      if (aliases.substr(0, comma) == spelled) return &k;
      aliases = comma == std::string_view::npos ? std::string_view() : aliases.substr(comma + 1);
    }
  }
  return nullptr;
}

namespace {

// Optimal string alignment distance (Levenshtein with adjacent transpositions: "jion" is 1 from "join").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string nearest_rdzv_conf_key(const std::string& spelled) {
  // Up to 2 edits for names of 6 characters or more, 1 below ("rank" vs "rnak"), never 0.
  const size_t limit = spelled.size() >= 6 ? 2 : 1;
  std::string best;
  size_t best_distance = limit + 1;
  auto consider = [&](std::string_view name) {
    const size_t d = edit_distance(spelled, name);
    if (d > 0 && d < best_distance) {
      best_distance = d;
      best = std::string(name);
    }
  };
  for (const RdzvConfKey& k : kRdzvConfKeys) {
    consider(k.name);
    std::string_view aliases = k.aliases;
    while (!aliases.empty()) {
      const auto comma = aliases.find(',');
      consider(aliases.substr(0, comma));
      aliases = comma == std::string_view::npos ? std::string_view() : aliases.substr(comma + 1);
    }
  }
  return best;
}

namespace options_detail {

void apply_rdzv_backend(const FlagInput& in, LaunchOptions& o) {
  const std::string v = trim(in.text);
  if (v == "static") {
    o.rdzv_backend = RdzvBackend::Static;
  } else if (v == "c10d") {
    o.rdzv_backend = RdzvBackend::C10d;
  } else if (v == "etcd") {
    o.rdzv_backend = RdzvBackend::Etcd;
  } else if (v == "etcd-v2") {
    throw ConfigError(in.flag +
                      " etcd-v2: that is torchrun's backend for etcd's v2 API, which etcd 3.4 disables "
                      "and 3.6 removed; ddprun speaks etcd's v3 API: use --rdzv_backend etcd");
  } else {
    throw ConfigError(in.flag +
                      ": expected 'static' (fixed --node_rank per node), 'c10d' (nodes join "
                      "--rdzv_endpoint without ranks, --nnodes MIN:MAX) or 'etcd' (the same through an etcd v3 "
                      "cluster), got '" +
                      v + "'");
  }
}

namespace {

// --rdzv_backend etcd: host:port[,host:port...], each optionally http:// or https://
void parse_etcd_endpoints(const std::string& flag, LaunchOptions& o) {
  for (const std::string& e : split(o.rdzv_endpoint, ',')) {
    if (e.empty()) continue;
    try {
      etcd::parse_endpoint(e);
    } catch (const ConfigError& err) {
      throw ConfigError(flag + ": " + err.what());
    }
    o.etcd.endpoints.push_back(e);
  }
}

// The store's address: host, host:port, [v6], [v6]:port, or a bare IPv6 address (common/host_port.hpp).
void parse_store_endpoint(const std::string& flag, LaunchOptions& o) {
  std::string why;
  const auto ep = parse_host_port(o.rdzv_endpoint, &why);
  if (!ep) bad(flag, "host[:port] or [ipv6]:port with a port from 1 to 65535 (here: " + why + ")", o.rdzv_endpoint);
  o.rdzv_endpoint_host = ep->host;
  if (ep->port) o.rdzv_endpoint_port = *ep->port;
}

}  // namespace

void apply_rdzv_endpoint(const FlagInput& in, LaunchOptions& o) {
  if (trim(in.text).empty()) return;
  o.rdzv_endpoint = trim(in.text);
  if (o.rdzv_backend == RdzvBackend::Etcd) {
    parse_etcd_endpoints(in.flag, o);
  } else {
    parse_store_endpoint(in.flag, o);
  }
}

// --rdzv_conf KEY=VALUE,...: each key through its entry of the table.
void apply_rdzv_conf(const FlagInput& in, LaunchOptions& o) {
  if (trim(in.text).empty()) return;
  for (const std::string& kv : split(in.text, ',')) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) bad(in.flag, "key=value pairs separated by commas", kv);
    o.rdzv_conf[trim(kv.substr(0, eq))] = trim(kv.substr(eq + 1));
  }
  for (const auto& [k, v] : o.rdzv_conf) {
    const RdzvConfKey* key = find_rdzv_conf_key(k);
    if (key == nullptr) {
      // A near miss of a known key is a typo (an error); anything else torchrun ignores too.
      const std::string near = nearest_rdzv_conf_key(k);
      if (near.empty()) {
        o.ignored_rdzv_conf.push_back(k);
        continue;
      }
      std::string known;
      for (const RdzvConfKey& c : rdzv_conf_keys()) known += (known.empty() ? "" : ", ") + std::string(c.name);
      throw ConfigError(in.flag + ": unknown key '" + k + "': did you mean '" + near + "'? (known: " + known + ")");
    }
    if (key->etcd_only && o.rdzv_backend != RdzvBackend::Etcd) {
      throw ConfigError(in.flag + " " + k + ": an etcd setting, but the rendezvous backend is '" +
                        rdzv_backend_name(o.rdzv_backend) + "' (add --rdzv_backend etcd, or drop " + k + ")");
    }
    key->apply(in.flag + " " + k, v, o);
  }
  if (o.heartbeat_timeout) {
    // A node is lost after keep_alive_max_attempt missed keep-alives: as many as fit in the timeout.
    const auto n = (o.heartbeat_timeout->count() + o.rdzv_timeouts.keep_alive_interval.count() - 1) /
                   o.rdzv_timeouts.keep_alive_interval.count();
    o.rdzv_timeouts.keep_alive_max_attempt = static_cast<int>(std::clamp<long long>(n, 1, 1000));
  }
  if (!o.etcd.user.empty() && o.etcd.password_file.empty()) {
    throw ConfigError(in.flag + ": etcd_user needs etcd_password_file=PATH (a file only you can read)");
  }
}

}  // namespace options_detail
}  // namespace ddprun::launcher::cli
